"""Offline inspection of a pool and explicit cleanup after every participant stopped
(straw-queue 0.1.6's ``straw.inspect``: ``inspect_run``, ``cleanup_orphans``, ``main``).

What an *orphan* is in a straw pool.  Every pack is known to the catalog before it exists
(``straw.writer``), so no data file is ever unknown to it; what can be left behind is:

* ``unaccepted_sealed`` -- sealed packs that no owner, pin, staged extent or dependency
  reaches (D4): the queue never accepted them, or their owners released them;
* ``partial`` -- packs still open in the catalog: their writer is either running or died
  without sealing.  Cleanup seals those of dead writers (a free writer lock proves it is
  dead) with the recovery their next incarnation would run; their published extents stay
  staged (D2) until adopted or released, so sealing never makes acknowledged data
  collectable by itself;
* ``unfinished_tombstones`` -- packs a collection tombstoned but did not unlink (D3).

Cleanup is our garbage collection, nothing else: ``cleanup_orphans`` runs the same
pool-wide collection as ``straw gc`` (``straw.pool_view.collect``), which tombstones
durably before it unlinks and reclaims only what nothing reaches.  It never deletes a
retained pack, and it refuses (``UnsafeRecovery``) unless the caller states that every
coordinator, writer and reader is stopped and the pool is exactly as the report it was
given describes (nothing changed in between), with no unresolved damage.

Inspection is read-only (``straw.pool_view``): no lock, no file created, nothing appended.

Both refuse (``UnsafeRecovery``) a pool managed by online GC, one a store opened with
``online_gc=True`` (its ``ONLINE_GC`` marker), as straw-queue's offline inspector refuses a
pool with a shared catalog: such a pool's stores collect their own garbage
(``collect_garbage``); ``straw inspect`` and ``straw gc`` serve every pool.  The marker is
asked for with a fresh lookup each time (never a cached ``stat``): cleanup checks it again
even with a report made before the marker appeared; an error other than its absence
refuses too, since the layout cannot be established.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import pool_view
from .durable import framing
from .errors import StrawError, UnsafeRecovery
from .fs import Filesystem, PosixFS
from .pool.catalog.read import CATALOG_NAME, read_state
from .pool.opening import ONLINE_GC_MARKER
from .pool.refs import PACK_PATH_RE

REPORT_VERSION = 1


def _catalog_bytes(fs: Filesystem, root: str) -> bytes:
    try:
        return fs.read_file(os.path.join(root, CATALOG_NAME))
    except FileNotFoundError:
        return b""


def _incomplete_tail(data: bytes) -> int:
    """Bytes of a torn final write after the catalog's last complete transaction (only a
    writer under the catalog lock may cut it off: D6).  Zeros there are space reserved
    ahead (``posix_fallocate``), not a torn write."""
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    return len(data[scan.end:].rstrip(b"\0"))


def inspect_run(root: str | os.PathLike[str], *, fs: Filesystem | None = None
                ) -> dict[str, Any]:
    """What the pool at ``root`` retains and what a stopped-run cleanup would reclaim, as
    one JSON-able dict (keys of straw-queue's report where the meaning carries over; see
    the module docstring).  ``NotAPool`` (a ``ValueError``) if ``root`` is not a pool."""
    fs = fs or PosixFS()
    root = os.path.abspath(os.fspath(root))
    view = pool_view.inspect(root, fs)  # checks the marker; read-only
    _refuse_online_gc(fs, root)
    data = _catalog_bytes(fs, root)
    st = read_state(fs, root)
    failures: list[dict[str, Any]] = [
        {"root": e.split(":", 1)[0], "error": "QueueUnreadable", "message": e}
        for e in view["errors"]]
    for (run, name), roots in sorted(st.owners.items()):
        # a root whose closure reaches a reclaimed pack cannot be read back: report it,
        # and refuse deletion until the operator has looked
        lost = st.tombstoned_dependency(roots)
        if lost is not None:
            failures.append({"root": f"{run or '(legacy)'}/{name}", "error": "InvalidReference",
                             "message": f"owner {name!r} reaches extent {lost[1]} of pack "
                                        f"{lost[0]}, which was reclaimed"})
    for repair in sorted(st.unconfirmed_repairs):
        failures.append({"root": CATALOG_NAME, "error": "UnsafeRecovery",
                         "message": f"catalog repair kept damaged bytes in {repair}; confirm "
                                    "it (SharedFilesystemStore.confirm_catalog_repair) first"})
    live = st.live_packs()
    runs = sorted({m.group("run") for p in st.packs
                   if (m := PACK_PATH_RE.match(p)) is not None}
                  | set(_listdir(fs, os.path.join(root, "runs"))))
    tail = _incomplete_tail(data)
    digest = hashlib.sha256(data).hexdigest()
    return {
        "version": REPORT_VERSION,
        "root": root,
        "run_id": runs[0] if len(runs) == 1 else None,
        "runs": runs,
        "retained_paths": sorted(p for p in live
                                 if p in st.packs and not st.packs[p].tombstoned),
        "unaccepted_sealed": st.collectable(),
        "partial": sorted(p for p, i in st.packs.items()
                          if i.state == "open" and not i.tombstoned),
        "unfinished_tombstones": st.tombstoned_not_unlinked(),
        "retained_dependency_errors": failures,
        "incomplete_journal_tail_bytes": tail,  # the catalog is the pool's GC journal
        "catalog_sha256": digest,
        "journal_sha256": digest,  # straw-queue's key: our GC journal is the catalog
        "deletion_allowed": not failures and not tail,
        "requires_stopped_run": True,
        "pool": view,
    }


def _refuse_online_gc(fs: Filesystem, root: str) -> None:
    """UnsafeRecovery unless the pool is provably not managed by online GC (see the
    module docstring)."""
    marker = os.path.join(root, ONLINE_GC_MARKER)
    try:
        managed = fs.probe(marker)
    except OSError as e:
        raise UnsafeRecovery(f"Cannot establish standalone storage layout: {marker}: {e}; "
                             "nothing inspected or deleted") from e
    if managed:
        raise UnsafeRecovery(
            f"pool {root} is managed by online GC through its shared catalog (a store "
            "opened it with online_gc=True): offline inspection and cleanup are for pools "
            "without it. Collect with SharedFilesystemStore(root, run_id, "
            "online_gc=True).collect_garbage(), or look with `straw inspect`")


def _listdir(fs: Filesystem, path: str) -> list[str]:
    try:
        return fs.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def cleanup_orphans(root: str | os.PathLike[str], report: dict[str, Any], *,
                    all_participants_stopped: bool, fs: Filesystem | None = None
                    ) -> list[str]:
    """Reclaim what ``report`` (from ``inspect_run``) lists as reclaimable, through the
    pool's garbage collection; returns the pack paths deleted.

    Refused with ``UnsafeRecovery`` unless ``all_participants_stopped`` is True, the pool
    is not managed by online GC (checked again now), it is unchanged since ``report`` was
    made, and the report allows deletion (no damaged queue, no owner reaching a reclaimed
    pack, no torn catalog tail, no unconfirmed repair)."""
    if not all_participants_stopped:
        raise UnsafeRecovery(
            "offline cleanup needs every coordinator, writer and reader of the pool stopped: "
            "stop them, then call cleanup_orphans(..., all_participants_stopped=True). A "
            "running pool collects its own garbage (SharedFilesystemStore.collect_garbage)")
    fs = fs or PosixFS()
    current = inspect_run(root, fs=fs)
    if current != report:
        raise UnsafeRecovery(
            f"pool {current['root']} changed since the report was made (or the report is of "
            "another pool): nothing deleted. Inspect again with inspect_run and pass that "
            "report")
    if not current["deletion_allowed"]:
        reasons = [f"{f['root']}: {f['message']}" for f in current["retained_dependency_errors"]]
        if current["incomplete_journal_tail_bytes"]:
            reasons.append(f"the catalog ends in {current['incomplete_journal_tail_bytes']} "
                           "bytes of a torn transaction (open a store to recover it)")
        raise UnsafeRecovery(f"pool {current['root']}: cleanup refused, nothing deleted: "
                             + "; ".join(reasons))
    out = pool_view.collect(current["root"], dry_run=False, fs=fs)
    return sorted(set(out["tombstoned"]) | set(out["finished_interrupted"]))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m straw.inspect POOL [--delete-orphans --all-participants-stopped]``:
    prints the report (JSON), then what was deleted."""
    p = argparse.ArgumentParser(prog="python -m straw.inspect",
                                description="Inspect a straw pool offline; optionally "
                                "reclaim its orphans after every participant stopped.")
    p.add_argument("root")
    p.add_argument("--delete-orphans", action="store_true")
    p.add_argument("--all-participants-stopped", action="store_true")
    args = p.parse_args(argv)
    try:
        report = inspect_run(args.root)
        print(json.dumps(report, indent=2, sort_keys=True))
        if args.delete_orphans:
            deleted = cleanup_orphans(args.root, report,
                                      all_participants_stopped=args.all_participants_stopped)
            print(json.dumps({"deleted": deleted}))
    except pool_view.NotAPool as e:
        print(f"straw.inspect: error: {e}", file=sys.stderr)
        return 2
    except (StrawError, OSError) as e:
        print(f"straw.inspect: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["cleanup_orphans", "inspect_run", "main"]

if __name__ == "__main__":
    sys.exit(main())
