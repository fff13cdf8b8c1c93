"""One writer incarnation: exclusive ownership, its own directory, its packs, and the
idempotency index of its writer id.

Layout under the pool root::

    runs/<run_id>/writers/<writer_id>/LOCK            flock held while a store writes;
                                                       its text names the holder
    runs/<run_id>/writers/<writer_id>/i000001/pack-000001.strw ...
    runs/<run_id>/writers/<writer_id>/i000002/...     the next incarnation (after restart)

Each incarnation owns a fresh directory and never appends to a pack a crashed
predecessor left open.  Submission ids (D7) are scoped to the writer id: at start-up the
new incarnation rebuilds the index of its predecessors from each sealed pack's SEAL index,
or by scanning a pack a crash left open, and seals such packs in the catalog (their
incomplete batches were never acknowledged: their staging is dropped at once; complete but
unacknowledged ones stay staged until a retry finds them and the caller releases them).
A publish_many batch counts only when all its extents survived.  Packs left open by a
killed predecessor may hold data that reached the page cache but was never synced: they
are fsynced before their extents are trusted (D1).

An incarnation belongs to the process that opened it (``straw.process``).  After a fork
the child's copy of the ``LOCK`` descriptor shares the parent's open file description, so
the lock would not keep the child out, and its unlock would release the parent's lock.
In a forked child every method raises ``ForkedProcess`` before touching anything, and
``close()``/``release()`` only close the child's copies of the lock and pack descriptors:
never seal, write or unlock.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import holder
from .catalog import Catalog
from .clock import Clock
from .errors import CorruptData, StorageUnavailable, UnsafeRecovery
from .fs import Filesystem
from .pack import (
    PACK_SUFFIX,
    EncodedExtent,
    ExtentEntry,
    PackWriter,
    read_sealed_index,
    scan_pack,
    storage_error,
)
from .process import ProcessBound, close_quietly
from .refs import RecordSetRef

_INC_RE = re.compile(r"^i([0-9]{6,})\Z")
_PACK_RE = re.compile(r"^pack-([0-9]{6,})\.strw\Z")


@dataclass(frozen=True)
class Submission:
    """What a submission id stands for: one digest and one reference per publication."""

    digests: tuple[bytes, ...]
    refs: tuple[RecordSetRef, ...]


def ref_from_entry(run_id: str, path: str, e: ExtentEntry) -> RecordSetRef:
    return RecordSetRef(run_id, path, e.offset, e.size, e.checksum.hex(), e.digest.hex(),
                        e.records)


def _complete_batch(items: Sequence[tuple[str, ExtentEntry]]
                    ) -> list[tuple[str, ExtentEntry]] | None:
    """The batch a submission id stands for: extents 0..n-1 written together, i.e. in one
    pack, back to back.  A torn remnant of an unacknowledged attempt (some extents of a
    batch that a crash cut short) never mixes with the complete retry; if several complete
    batches exist (a retry after a reply was lost to a crash), the latest one wins, which
    is the one the caller was acknowledged."""
    found = None
    for k, (rel, first) in enumerate(items):
        if first.index != 0:
            continue
        run = [(rel, first)]
        for rel2, e in items[k + 1:]:
            prev = run[-1][1]
            if rel2 == rel and e.index == prev.index + 1 and e.count == first.count \
                    and e.offset == prev.offset + prev.size:
                run.append((rel2, e))
            if len(run) == first.count:
                break
        if len(run) == first.count:
            found = run
    return found


class WriterIncarnation(ProcessBound):
    _process_state = "its writer lock and open pack"

    def __init__(self, fs: Filesystem, root: str, run_id: str, writer_id: str, clock: Clock,
                 catalog: Catalog, *, segment_target_bytes: int, reserve_bytes: int) -> None:
        self._bind_process()
        self.pack: PackWriter | None = None
        self.fs = fs
        self.catalog = catalog
        self.root = root
        self.run_id = run_id
        self.writer_id = writer_id
        self.segment_target_bytes = segment_target_bytes
        self.reserve_bytes = reserve_bytes
        self.rel_dir = f"runs/{run_id}/writers/{writer_id}"
        self.dir = os.path.join(root, self.rel_dir)
        fs.makedirs_durable(self.dir)
        self._lock_fd: int | None = self._take_lock(clock)
        try:
            incarnations = self._incarnations()
            self.incarnation = (max(incarnations) if incarnations else 0) + 1
            self.inc_rel = f"{self.rel_dir}/i{self.incarnation:06d}"
            self.index: dict[str, Submission] = {}
            recovered = self._load_index(incarnations)
            # Packs a dead predecessor left open are complete now: seal them in the catalog
            # so that collection can reclaim them once released (their files stay as they
            # are: never appended to again).
            catalog.seal_if_open(recovered, prefix=f"{self.rel_dir}/")
            fs.mkdir(os.path.join(root, self.inc_rel))
            fs.fsync_dir(self.dir)  # D1: the new directory name is durable
        except BaseException:
            self.release()
            raise
        self.pack_rel = ""
        self.pack_no = 0
        self.sealed_packs: list[str] = []

    # --- ownership --------------------------------------------------------------------
    def _take_lock(self, clock: Clock) -> int:
        fd, holder_desc = holder.take(self.fs, os.path.join(self.dir, "LOCK"), clock)
        if fd is None:
            raise UnsafeRecovery(
                f"writer {self.writer_id!r} of run {self.run_id!r} is in use by {holder_desc}. "
                "Give each concurrent writer its own writer_id=..., or stop that process first"
            )
        return fd

    def release(self) -> None:
        if self._in_forked_child():
            self._drop_inherited()
            return
        holder.release(self.fs, self._lock_fd)
        self._lock_fd = None

    def _process_subject(self) -> str:
        return f"writer {self.writer_id!r} of run {self.run_id!r} at {self.root}"

    def _drop_inherited(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        pack, self.pack = self.pack, None
        close_quietly(self.fs, fd)
        if pack is not None and not pack.broken:  # a broken pack's fd is closed already
            close_quietly(self.fs, pack.fd)

    # --- the idempotency index of earlier incarnations ------------------------------
    def _incarnations(self) -> list[int]:
        out = []
        for name in self.fs.listdir(self.dir):
            m = _INC_RE.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _load_index(self, incarnations: Sequence[int]) -> dict[str, tuple[list[int], list[int]]]:
        """Rebuild the submission index of earlier incarnations; returns, per pack, its
        extent offsets and the offsets of incomplete batches (never acknowledged: their
        staging is dropped at once)."""
        found: dict[str, list[tuple[str, ExtentEntry]]] = {}
        per_pack: dict[str, list[ExtentEntry]] = {}
        for inc in incarnations:
            inc_rel = f"{self.rel_dir}/i{inc:06d}"
            inc_dir = os.path.join(self.root, inc_rel)
            unsealed = False
            for name in self.fs.listdir(inc_dir):
                if not _PACK_RE.match(name):
                    continue
                rel = f"{inc_rel}/{name}"
                entries, was_sealed = self._pack_entries(os.path.join(self.root, rel))
                unsealed |= not was_sealed
                per_pack[rel] = entries
                for e in entries:
                    found.setdefault(e.submission_id, []).append((rel, e))
            if unsealed:
                self.fs.fsync_dir(inc_dir)
        for sub, items in found.items():
            batch = _complete_batch(items)
            if batch is not None:
                self.index[sub] = Submission(
                    tuple(e.digest for _, e in batch),
                    tuple(ref_from_entry(self.run_id, rel, e) for rel, e in batch),
                )
        acknowledged = {(r.path, r.offset) for sub in self.index.values() for r in sub.refs}
        return {rel: ([e.offset for e in entries],
                      [e.offset for e in entries if (rel, e.offset) not in acknowledged])
                for rel, entries in per_pack.items()}

    def _pack_entries(self, path: str) -> tuple[list[ExtentEntry], bool]:
        try:
            fd = self.fs.open(path, write=True)
        except OSError as e:
            raise storage_error(e, f"cannot open earlier pack {path}") from e
        try:
            size = self.fs.fstat(fd).size
            entries = read_sealed_index(self.fs, fd, size)
            if entries is not None:
                return entries, True
            try:
                entries, scan = scan_pack(self.fs, fd, size)
            except CorruptData as e:
                raise CorruptData(f"pack {path}: {e}") from None
            if not scan.sealed:
                # D1: a killed predecessor may have written without syncing; make what we
                # are about to trust durable first.
                self.fs.fsync(fd)
            return entries, scan.sealed
        except OSError as e:
            raise storage_error(e, f"cannot read earlier pack {path}") from e
        finally:
            self.fs.close(fd)

    # --- writing ----------------------------------------------------------------------
    def next_offset(self, size: int) -> int:
        """Where an extent group of ``size`` bytes will go; rotates first if the open pack
        has data and the group would pass the segment target (an oversized group stays
        contiguous in one pack)."""
        self._check_process()
        if self.pack is not None and self.pack.entries and \
                self.pack.data_end + size > self.segment_target_bytes:
            self.seal()
        if self.pack is None or self.pack.broken:
            self._open_pack()
        assert self.pack is not None
        return self.pack.data_end

    def _open_pack(self) -> None:
        self.pack_no += 1
        self.pack_rel = f"{self.inc_rel}/pack-{self.pack_no:06d}{PACK_SUFFIX}"
        self.catalog.pack_open(self.pack_rel)  # known to the catalog before it exists
        self.pack = PackWriter(
            self.fs, os.path.join(self.root, self.pack_rel),
            {"v": 1, "run": self.run_id, "writer": self.writer_id, "inc": self.incarnation,
             "pack": self.pack_no},
            self.reserve_bytes,
        )

    def append(self, extents: Sequence[EncodedExtent]) -> list[RecordSetRef]:
        self._check_process()
        assert self.pack is not None
        self.pack.append_group(extents)
        return [ref_from_entry(self.run_id, self.pack_rel, e.entry) for e in extents]

    def seal(self) -> None:
        """Seal the open pack: the file first (durable), then the catalog.  A crash in
        between leaves the catalog saying "open"; the next incarnation seals it there."""
        self._check_process()
        pack, self.pack = self.pack, None
        if pack is not None and not pack.broken:
            pack.seal()
            self.catalog.pack_sealed(self.pack_rel, [e.offset for e in pack.entries])
            self.sealed_packs.append(self.pack_rel)

    def close(self) -> None:
        if self._in_forked_child():  # the pack and the lock are the parent's
            self._drop_inherited()
            return
        try:
            self.seal()
        finally:
            self.release()

    def describe(self) -> dict[str, Any]:
        self._check_process()
        return {"writer_id": self.writer_id, "incarnation": self.incarnation,
                "pack": self.pack_rel if self.pack else None}


__all__ = ["WriterIncarnation", "Submission", "StorageUnavailable"]
