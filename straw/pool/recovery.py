"""Recovery of what a writer left behind: its idempotency index, and the catalog seal of the
packs a crash (or an I/O error) left open.

Two callers run the same code, each holding that writer id's ``LOCK`` (so the packs it reads
are written by nobody): a new incarnation of the writer at start-up (``straw.pool.writer``), and
a collection on behalf of a writer that died and was never restarted (``seal_dead_writers``,
called from ``SharedFilesystemStore.collect_garbage``).  A pack the catalog calls "open"
whose writer's lock is free belongs to a dead writer: collection seals it in the catalog on
that writer's behalf (the file stays as it is: a later incarnation still finds its
submissions), so that it can be reclaimed once released (L1).

Per pack: a sealed pack's SEAL index; otherwise a scan (``straw.pool.pack.scan_pack``), fsynced
before its extents are trusted (D1: a killed writer may have written without syncing).  A
damaged synced extent in a pack left open (D6) no longer makes the writer id unusable: the
extents before it are kept, the damaged one (and its write group) is not indexed, the scan
resumes at the next write group, and the damage is reported (``WriterHistory.damaged``,
``store.writer_info()["damaged"]``, a warning on the ``straw`` logger).  The pack is then
sealed in the catalog with the trusted extents only; a retry of an unindexed submission id
publishes it again.  For a pack the catalog already sealed, the catalog's extent list is
authoritative (a pack abandoned after a failed sync lists only what was acknowledged); a
tombstoned pack is not indexed at all (D3: never handed out again).

A publish_many batch counts only when all its extents survived; incomplete batches were
never acknowledged (their staging is dropped at once); complete but unacknowledged ones stay
staged until a retry finds them and the caller releases them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..clock import Clock
from ..errors import CorruptData, StrawError
from ..fs import Filesystem
from . import role_lock
from .catalog.catalog import Catalog
from .pack import ExtentEntry, read_sealed_index, scan_pack, storage_error
from .refs import PACK_PATH_RE, RecordSetRef, record_set_ref

log = logging.getLogger("straw")

_INC_RE = re.compile(r"^i([0-9]{6,})\Z")
_PACK_RE = re.compile(r"^pack-([0-9]{6,})\.(?:pack|strw)\Z")  # refs.PACK_SUFFIXES


@dataclass(frozen=True)
class Submission:
    """What a submission id stands for: one digest and one reference per publication,
    and the call that published it (``straw.pool.pack.APIS``)."""

    digests: tuple[bytes, ...]
    refs: tuple[RecordSetRef, ...]
    api: str = "publish"


@dataclass(frozen=True)
class Damage:
    """A damaged extent recovery found (and did not index)."""

    pack: str  # relative to the pool root
    offset: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"pack": self.pack, "offset": self.offset, "reason": self.reason}


@dataclass
class WriterHistory:
    """What a writer's earlier incarnations left: submissions, and per pack its extent
    offsets and the offsets of unacknowledged (incomplete) batches (``seal_if_open``)."""

    # keyed by (api, submission_id): as in straw-queue, a submission id names one
    # request per publishing call (write_records, record_set, publish), not across them
    index: dict[tuple[str, str], Submission]
    packs: dict[str, tuple[list[int], list[int]]]
    damaged: list[Damage]


def ref_from_entry(run_id: str, path: str, e: ExtentEntry) -> RecordSetRef:
    return record_set_ref(run_id, path, e.offset, e.size, e.checksum.hex(), e.digest.hex(),
                          e.records, e.ordinal, e.payload_bytes, e.tokens)


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


def incarnations(fs: Filesystem, writer_dir: str) -> list[int]:
    """The incarnation numbers found in a writer's directory, in order."""
    out = []
    for name in fs.listdir(writer_dir):
        m = _INC_RE.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def recover_writer(fs: Filesystem, root: str, run_id: str, rel_dir: str, catalog: Catalog,
                   incs: Sequence[int], *, live: bool = False) -> WriterHistory:
    """Rebuild the submission index of the incarnations ``incs`` of the writer at
    ``rel_dir`` (the caller holds its LOCK).  ``live``: the writer is running and the
    caller only reads what it acknowledged (a receipt): nothing is synced, and an
    unfinished tail is the write in flight, not damage (``damaged`` stays empty)."""
    prefix = f"{rel_dir}/"
    with catalog.locked() as st:
        known = {p: (i.state, i.offsets, i.tombstoned) for p, i in st.packs.items()
                 if p.startswith(prefix)}
    # Packs the catalog calls open but a (possibly stale, on a shared filesystem) listing
    # misses are asked for by name: sealing a pack that exists as empty would drop the
    # staging of its acknowledged extents.
    unlisted = {p for p, (state, _, dead) in known.items() if state == "open" and not dead}
    found: dict[tuple[str, str], list[tuple[str, ExtentEntry]]] = {}
    per_pack: dict[str, list[ExtentEntry]] = {}
    damaged: list[Damage] = []
    for inc in incs:
        inc_rel = f"{rel_dir}/i{inc:06d}"
        inc_dir = os.path.join(root, inc_rel)
        names = [n for n in fs.listdir(inc_dir) if _PACK_RE.match(n)]
        unlisted -= {f"{inc_rel}/{n}" for n in names}
        names += [p.rsplit("/", 1)[1] for p in sorted(unlisted)
                  if p.startswith(f"{inc_rel}/") and fs.probe(os.path.join(root, p))]
        unsealed = False
        for name in names:
            rel = f"{inc_rel}/{name}"
            state, offsets, tombstoned = known.get(rel, ("open", frozenset(), False))
            if tombstoned:
                continue  # reclaimed: never handed out again (D3)
            entries, was_sealed, damage = _pack_entries(fs, root, rel, live=live)
            if live:
                damage = []  # the tail of a pack being appended to
            unsealed |= not was_sealed
            if state == "sealed" and not was_sealed:
                entries = [e for e in entries if e.offset in offsets]
            for offset, reason in damage:
                d = Damage(rel, offset, reason)
                log.warning("straw: writer %s: pack %s offset %d: %s", rel_dir, rel, offset,
                            reason)
                damaged.append(d)
            per_pack[rel] = entries
            for e in entries:
                found.setdefault((e.api, e.submission_id), []).append((rel, e))
        if unsealed and not live:
            fs.fsync_dir(inc_dir)
    index: dict[tuple[str, str], Submission] = {}
    for sub, items in found.items():
        batch = _complete_batch(items)
        if batch is not None:
            index[sub] = Submission(
                tuple(e.digest for _, e in batch),
                tuple(ref_from_entry(run_id, rel, e) for rel, e in batch),
                batch[0][1].api,
            )
    acknowledged = {(r.path, r.offset) for sub in index.values() for r in sub.refs}
    packs = {rel: ([e.offset for e in entries],
                   [e.offset for e in entries if (rel, e.offset) not in acknowledged])
             for rel, entries in per_pack.items()}
    return WriterHistory(index, packs, damaged)


def _pack_entries(fs: Filesystem, root: str, rel: str, *, live: bool = False
                  ) -> tuple[list[ExtentEntry], bool, list[tuple[int, str]]]:
    """The trusted extents of one pack, whether its file is sealed, and its damage
    (``live``: read only, synced by nobody; see recover_writer)."""
    path = os.path.join(root, rel)
    try:
        fd = fs.open(path, write=not live)
    except OSError as e:
        raise storage_error(e, f"cannot open earlier pack {path}") from e
    try:
        size = fs.fstat(fd).size
        entries = read_sealed_index(fs, fd, size)
        if entries is not None:
            return entries, True, []
        try:
            scan = scan_pack(fs, fd, size)
        except CorruptData as e:
            raise CorruptData(f"pack {path}: {e}") from None
        if not scan.sealed and not live:
            # D1: a killed predecessor may have written without syncing; make what we
            # are about to trust durable first.
            fs.fsync(fd)
        return scan.entries, scan.sealed, scan.damage
    except OSError as e:
        raise storage_error(e, f"cannot read earlier pack {path}") from e
    finally:
        fs.close(fd)


def seal_dead_writers(fs: Filesystem, root: str, catalog: Catalog, clock: Clock,
                      run: str | None = None) -> tuple[list[str], list[Damage]]:
    """Seal, in the catalog, the open packs of every writer whose LOCK is free (it is dead:
    a live writer holds its lock from start to close), with the same recovery its next
    incarnation would run.  Holding the lock meanwhile keeps that writer id from starting.
    Best effort per writer: a failure is logged and leaves its packs open for the next
    collection.  Returns the packs sealed and the damage found.  ``run``: only that run's
    writers (a store's collection acts for its own run; runs sharing a root are isolated).
    """
    prefix = "" if run is None else f"runs/{run}/"
    with catalog.locked() as st:
        open_packs = sorted(p for p, i in st.packs.items()
                            if i.state == "open" and not i.tombstoned and p.startswith(prefix))
    writers: dict[str, str] = {}  # writer directory -> run id
    for p in open_packs:
        m = PACK_PATH_RE.fullmatch(p)
        if m is not None:
            writers.setdefault(p.rsplit("/", 2)[0], m.group("run"))
    sealed: list[str] = []
    damaged: list[Damage] = []
    for rel_dir, run_id in sorted(writers.items()):
        writer_dir = os.path.join(root, rel_dir)
        try:
            with role_lock.if_dead(fs, writer_dir, clock) as dead:
                if not dead:
                    continue  # alive (or another collection is sealing it right now)
                history = recover_writer(fs, root, run_id, rel_dir, catalog,
                                         incarnations(fs, writer_dir))
                catalog.seal_if_open(history.packs, prefix=f"{rel_dir}/")
        except (StrawError, OSError) as e:
            log.warning("straw: cannot seal the open packs of dead writer %s: %s", rel_dir, e)
            continue
        sealed.extend(p for p in open_packs if p.startswith(f"{rel_dir}/"))
        damaged.extend(history.damaged)
    return sealed, damaged


__all__ = ["Damage", "Submission", "WriterHistory", "incarnations", "recover_writer",
           "ref_from_entry", "seal_dead_writers"]
