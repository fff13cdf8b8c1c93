"""One writer incarnation: exclusive ownership, its own directory, its packs, and the
idempotency index of its writer id.

Layout under the pool root::

    runs/<run_id>/writers/<writer_id>/LOCK            flock held while a store writes;
                                                       its text names the holder
    runs/<run_id>/writers/<writer_id>/RETIRED         written by ``retire_writer`` (under
                                                       the lock): the writer id is fenced
                                                       for good (``WriterFenced``)
    runs/<run_id>/writers/<writer_id>/i000001/pack-000001.pack ...
    runs/<run_id>/writers/<writer_id>/i000002/...     the next incarnation (after restart)

Each incarnation owns a fresh directory and never appends to a pack a crashed
predecessor left open.  Submission ids (D7) are scoped to the writer id: at start-up the
new incarnation rebuilds the index of its predecessors and seals the packs they left open
in the catalog (``straw.pool.recovery``, which collection also runs on behalf of a writer that
died and was never restarted).  A damaged extent found there is reported
(``describe()["damaged"]``), not fatal.

A pack this incarnation abandons after a failed write, sync or seal (or whose creation
failed) is sealed in the catalog at once with its acknowledged extents only, so that
collection reclaims it once they are released (an empty one at the next collection); if
that catalog write fails too (a full disk), it is retried before the next pack is opened,
at close and at each collection.  A failed space reservation abandons nothing: the pack
stays open and the next publication continues in it.

Fencing: a writer whose lock was lost (another holder rewrote the LOCK note, e.g. a
collection that took it for dead after a shared filesystem expired our locks) writes and
seals nothing more (``UnsafeRecovery``); it checks before a write at most once a second.

An incarnation belongs to the process that opened it (``straw.process``).  After a fork
the child's copy of the ``LOCK`` descriptor shares the parent's open file description, so
the lock would not keep the child out, and its unlock would release the parent's lock.
In a forked child every method raises ``ForkedProcess`` before touching anything, and
``close()``/``release()`` only close the child's copies of the lock and pack descriptors:
never seal, write or unlock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from ..clock import Clock
from ..errors import CorruptData, StorageUnavailable, UnsafeRecovery, WriterFenced
from ..fs import Filesystem, NotBeneath
from ..process import ProcessBound, close_quietly
from . import recovery, role_lock
from .catalog.catalog import Catalog
from .pack import PACK_SUFFIX, EncodedExtent, PackWriter, storage_error
from .recovery import Damage, Submission, ref_from_entry
from .refs import RecordSetRef

log = logging.getLogger("straw")

# How long a starting writer waits for a collection that holds its lock for a moment
# (sealing the packs of its dead predecessor on its behalf): bounded retries.
_LOCK_RETRIES = 10
# How often a writer checks that its LOCK still carries its own note before writing.
_LOCK_CHECK_SECONDS = 1.0
RETIRED = "RETIRED"  # the fence ``retire_writer`` leaves in the writer's directory


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
        try:
            _refuse_links(fs, root, self.rel_dir)  # before anything is created through one
            fs.makedirs_durable(self.dir)
        except OSError as e:  # a straw error naming the directory, never a bare OSError
            raise storage_error(e, f"cannot create writer directory {self.dir}") from e
        self.clock = clock
        self._lock_fd: int | None = self._take_lock(clock)
        self._check_lock_beneath()
        if fs.exists(os.path.join(self.dir, RETIRED)):  # checked under the lock
            self.release()
            raise WriterFenced(
                f"writer {writer_id!r} of run {run_id!r} was retired (retire_writer): it "
                "cannot publish again. Open the store with a new writer_id (or none: every "
                "store gets a unique one)")
        self._lock_note = self._read_lock_note()
        self._next_lock_check = clock.now() + _LOCK_CHECK_SECONDS
        self.lost_lock = ""  # set once another process took our lock: no more writes
        try:
            incarnations = recovery.incarnations(fs, self.dir)
            self.incarnation = (max(incarnations) if incarnations else 0) + 1
            self.inc_rel = f"{self.rel_dir}/i{self.incarnation:06d}"
            self.index: dict[tuple[str, str], Submission] = {}  # (api, submission_id)
            self.damaged: list[Damage] = []
            recovered = self._load_index(incarnations)
            # Packs a dead predecessor left open are complete now: seal them in the catalog
            # so that collection can reclaim them once released (their files stay as they
            # are: never appended to again).
            catalog.seal_if_open(recovered, prefix=f"{self.rel_dir}/")
            fs.mkdir(os.path.join(root, self.inc_rel))
            fs.fsync_dir(self.dir)  # D1: the new directory name is durable
        except OSError as e:
            self.release()  # nothing of this incarnation was acknowledged; a retry starts anew
            raise storage_error(e, f"cannot start writer {writer_id!r} in {self.dir}") from e
        except BaseException:
            self.release()
            raise
        self.pack_rel = ""
        self.pack_no = 0
        self.sealed_packs: list[str] = []
        # packs abandoned after an I/O error whose catalog seal is still to be written:
        # path -> acknowledged extent offsets
        self._abandoned: dict[str, list[int]] = {}

    # --- ownership --------------------------------------------------------------------
    def _take_lock(self, clock: Clock) -> int:
        delay = 0.05
        for attempt in range(_LOCK_RETRIES + 1):
            fd, holder_desc = role_lock.take(self.fs, os.path.join(self.dir, "LOCK"), clock)
            if fd is not None:
                return fd
            if role_lock.COLLECTING not in holder_desc or attempt == _LOCK_RETRIES:
                break
            clock.sleep(delay)  # a collection seals our predecessor's packs: brief
            delay = min(delay * 2, 1.0)
        raise UnsafeRecovery(
            f"writer {self.writer_id!r} of run {self.run_id!r} is in use by {holder_desc}. "
            "Give each concurrent writer its own writer_id=..., or stop that process first"
        )

    def _check_lock_beneath(self) -> None:
        """The LOCK just taken is reached from the pool root through no symbolic link
        (``open_beneath``, free of races with a directory swapped meanwhile): the packs
        of this incarnation go next to it."""
        try:
            close_quietly(self.fs, self.fs.open_beneath(self.root, f"{self.rel_dir}/LOCK"))
        except NotBeneath as e:
            self.release()
            raise _linked(os.path.join(self.root, self.rel_dir), self.root, e) from None
        except OSError as e:
            self.release()
            raise storage_error(e, f"cannot open writer lock in {self.dir}") from e

    def release(self) -> None:
        if self._in_forked_child():
            self._drop_inherited()
            return
        role_lock.release(self.fs, self._lock_fd)
        self._lock_fd = None

    def _process_subject(self) -> str:
        return f"writer {self.writer_id!r} of run {self.run_id!r} at {self.root}"

    def _drop_inherited(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        pack, self.pack = self.pack, None
        close_quietly(self.fs, fd)
        if pack is not None and not pack.broken:  # a broken pack's fd is closed already
            close_quietly(self.fs, pack.fd)

    def _read_lock_note(self) -> bytes:
        try:
            return self.fs.read_file(os.path.join(self.dir, "LOCK"))
        except OSError:
            return b""

    def _check_lock(self) -> None:
        """Fencing of a writer whose lock was lost (a shared filesystem may expire a
        partitioned client's locks): a collection may then have taken the lock and sealed
        our open pack on our behalf (``straw.pool.recovery``), and an extent written on into it
        would not be staged (D4).  Any other holder rewrites the LOCK note, so a changed
        note means the lock is gone: write nothing more.  Checked before a write at most
        every ``_LOCK_CHECK_SECONDS`` (losing a lock takes a much longer partition)."""
        if self._lock_lost(force=False):
            raise UnsafeRecovery(
                f"writer {self.writer_id!r} of run {self.run_id!r} lost its lock (now noted "
                f"{self.lost_lock!r}); nothing more is written through this store. Close it "
                "and open a new one"
            )

    def _lock_lost(self, *, force: bool) -> bool:
        if not self.lost_lock and self._lock_note and \
                (force or self.clock.now() >= self._next_lock_check):
            self._next_lock_check = self.clock.now() + _LOCK_CHECK_SECONDS
            note = self._read_lock_note()
            if note and note != self._lock_note:
                self.lost_lock = note.decode(errors="replace")
                if self.pack is not None:
                    self.pack.abandon()  # never written again; its seal is not ours now
                    self.pack = None
        return bool(self.lost_lock)

    # --- the idempotency index of earlier incarnations ------------------------------
    def _load_index(self, incarnations: Sequence[int]) -> dict[str, tuple[list[int], list[int]]]:
        """Rebuild the submission index of earlier incarnations; returns, per pack, its
        extent offsets and the offsets of incomplete batches (never acknowledged: their
        staging is dropped at once)."""
        history = recovery.recover_writer(self.fs, self.root, self.run_id, self.rel_dir,
                                          self.catalog, incarnations)
        self.index.update(history.index)
        self.damaged.extend(history.damaged)
        return history.packs

    # --- writing ----------------------------------------------------------------------
    def next_offset(self, size: int) -> int:
        """Where an extent group of ``size`` bytes will go; rotates first if the open pack
        has data and the group would pass the segment target (an oversized group stays
        contiguous in one pack)."""
        self._check_process()
        self._check_lock()
        if self.pack is not None and self.pack.entries and \
                self.pack.data_end + size > self.segment_target_bytes:
            self.seal()
        if self.pack is None:
            self.seal_abandoned()
            self._open_pack()
        assert self.pack is not None
        return self.pack.data_end

    def _open_pack(self) -> None:
        self.pack_no += 1
        self.pack_rel = f"{self.inc_rel}/pack-{self.pack_no:06d}{PACK_SUFFIX}"
        try:
            self.catalog.pack_open(self.pack_rel)  # known to the catalog before it exists
            self.pack = PackWriter(
                self.fs, os.path.join(self.root, self.pack_rel),
                {"v": 1, "run": self.run_id, "writer": self.writer_id, "inc": self.incarnation,
                 "pack": self.pack_no},
                self.reserve_bytes,
            )
        except StorageUnavailable:
            # No extent in it: seal it empty (if the catalog knows it), so the next
            # collection tombstones and unlinks whatever file was created (D3); the path
            # is never used again.
            self._abandon([])
            raise

    def append(self, extents: Sequence[EncodedExtent]) -> list[RecordSetRef]:
        self._check_process()
        assert self.pack is not None
        try:
            self.pack.append_group(extents)
        except StorageUnavailable:
            if self.pack.broken:
                self._abandon([e.offset for e in self.pack.entries])
            raise
        return [ref_from_entry(self.run_id, self.pack_rel, e.entry) for e in extents]

    def seal(self) -> None:
        """Seal the open pack: the file first (durable), then the catalog.  A crash in
        between leaves the catalog saying "open"; the next incarnation (or a collection,
        once this writer is gone) seals it there."""
        self._check_process()
        if self._lock_lost(force=True):
            return
        pack = self.pack
        if pack is None:
            return
        offsets = [e.offset for e in pack.entries]
        try:
            pack.seal()
            self.catalog.pack_sealed(self.pack_rel, offsets)
        except StorageUnavailable:
            self._abandon(offsets)
            raise
        self.pack = None
        self.sealed_packs.append(self.pack_rel)

    def seal_if_full(self) -> None:
        """Seal the open pack now if it has reached the segment target: the next
        publication would rotate it anyway, so sealing it early changes no layout, and a
        collection can then reclaim it once released (with ``segment_target_bytes=0``
        every publication's pack is reclaimable as soon as nothing reaches it, as in
        straw-queue, where each such publication is its own sealed file)."""
        self._check_process()
        if self.pack is not None and self.pack.entries and \
                self.pack.data_end >= self.segment_target_bytes:
            self.seal()

    def _abandon(self, acknowledged: list[int]) -> None:
        """The open pack is given up after an I/O error: never written again; sealed in
        the catalog with its acknowledged extents only (L1: reclaimable once released)."""
        if self.pack is not None:
            self.pack.abandon()
        self.pack = None
        self._abandoned[self.pack_rel] = acknowledged
        self.seal_abandoned()

    def seal_abandoned(self) -> None:
        """Write the catalog seal of abandoned packs.  Best effort (this runs on error
        paths, often on a full disk): on failure they stay listed and a later call
        retries (before the next pack opens, at close, at each collection)."""
        self._check_process()
        if not self._abandoned:
            return
        try:
            self.catalog.seal_if_open({p: (offs, []) for p, offs in self._abandoned.items()})
        except StorageUnavailable as e:
            log.debug("straw: sealing abandoned packs %s deferred: %s", sorted(self._abandoned), e)
            return
        self._abandoned.clear()

    def close(self) -> None:
        if self._in_forked_child():  # the pack and the lock are the parent's
            self._drop_inherited()
            return
        try:
            self.seal()
        finally:
            try:
                self.seal_abandoned()
            finally:
                self.release()

    def describe(self) -> dict[str, Any]:
        self._check_process()
        return {"writer_id": self.writer_id, "incarnation": self.incarnation,
                "pack": self.pack_rel if self.pack else None,
                "damaged": [d.as_dict() for d in self.damaged]}


def _refuse_links(fs: Filesystem, root: str, rel_dir: str) -> None:
    """``CorruptData`` if a component of ``rel_dir`` beneath the pool ``root`` that exists
    is a symbolic link (or not a directory): a writer's packs written through it would
    land outside the pool, where no collection, reader or recovery of this pool looks."""
    path = root
    for name in rel_dir.split("/"):
        path = os.path.join(path, name)
        try:
            st = fs.stat(path)
        except FileNotFoundError:
            return  # created below as a directory of the pool
        if st.is_symlink or not st.is_dir:
            raise _linked(path, root, None)


def _linked(path: str, root: str, why: OSError | None) -> CorruptData:
    detail = f" ({why.strerror})" if why is not None else ""
    return CorruptData(
        f"writer directory {path} is reached through a symbolic link or a non-directory "
        f"beneath the pool root {root}{detail}: a writer writes its packs only inside the "
        "pool. Replace the link with a real directory of the pool (move the data it points "
        "to back in if it belongs to this pool), or open the store with another writer_id")


__all__ = ["RETIRED", "WriterIncarnation", "Submission", "StorageUnavailable"]
