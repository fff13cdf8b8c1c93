"""What ``straw inspect``, ``straw top``, ``straw gc`` and ``straw.inspect`` see of a pool:
read-only views built on the core's read-only accessors (``catalog.read_state``,
``coordinator.read_state``).  A core module, so that the library (``straw.inspect``) and the
command (``straw.cli``) share one implementation; the core never imports ``straw.cli``.

Read-only means: no file created, no lock taken, nothing appended (the catalog is read
without its lock and a torn final transaction is ignored, not cut; a queue's journal is
replayed without becoming its coordinator).  The only call that is not a read is the
fsync ``journal.recover`` issues on the newest segment, which changes no byte.

The pool layout is known in ONE place, here: ``POOL`` (the marker), ``CATALOG``, and the
queues, found by walking the pool for directories that hold a ``journal/`` next to an
``epochs/`` (wherever the layout puts them: ``queues/<ns>/<id>`` today,
``runs/<run>/queues/<ns>/<id>`` later).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .clock import SystemClock
from .errors import StrawError, UnsupportedSchema
from .fs import Filesystem, PosixFS
from .pool.catalog.catalog import Catalog
from .pool.catalog.read import read_state
from .pool.catalog.state import CatalogState
from .pool.opening import POOL_FORMAT
from .pool.recovery import seal_dead_writers
from .pool.ref_forms import ref_from_tuple
from .pool.refs import PACK_PATH_RE
from .queue.coordinator import read_state as read_queue_state
from .queue.tasks import LEASED, TERMINAL
from .read.session import ReadSession

MARKER = "POOL"
MAX_WALK_DEPTH = 8  # queues sit a few levels down; never wander through a whole tree
STALENESS_KEY = "staleness"  # record metadata: serving version - oldest token version
STAGE_KEY = "stage"  # task metadata: the pipeline stage a task belongs to
STALENESS_SAMPLE = 1000  # newest commits whose result manifests are read for the histogram


class NotAPool(ValueError):
    """The path is not a straw pool (exit status 2; nothing was written)."""


def check_pool(fs: Filesystem, root: str) -> dict[str, Any]:
    """The pool marker's content; ``NotAPool`` / ``UnsupportedSchema`` otherwise."""
    try:
        st = fs.stat(root)
    except FileNotFoundError:
        raise NotAPool(f"{root} does not exist; give the directory of a straw pool") from None
    if not st.is_dir:
        raise NotAPool(f"{root} is not a directory; give the directory of a straw pool")
    marker = os.path.join(root, MARKER)
    try:
        info = json.loads(fs.read_file(marker))
    except FileNotFoundError:
        raise NotAPool(f"{root} is not a straw pool (no {MARKER} marker); give the "
                       "directory a store was opened on") from None
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        raise NotAPool(f"{marker} is not a straw pool marker (not JSON)") from None
    if not isinstance(info, dict) or info.get("format") != "straw-pool" or \
            not isinstance(info.get("version"), int):
        raise NotAPool(f"{marker} is not a straw pool marker: {info!r}")
    if info["version"] > POOL_FORMAT:
        raise UnsupportedSchema(f"pool {root} has format version {info['version']}; this "
                                f"straw reads up to {POOL_FORMAT}. Upgrade straw")
    return info


def find_queues(fs: Filesystem, root: str) -> list[str]:
    """Queue directories (relative to the root): those holding ``journal/`` and
    ``epochs/``."""
    found: list[str] = []

    def walk(rel: str, depth: int) -> None:
        here = os.path.join(root, rel) if rel else root
        try:
            names = fs.listdir(here)
        except (NotADirectoryError, FileNotFoundError):
            return
        if "journal" in names and "epochs" in names:
            found.append(rel)
            return
        if depth >= MAX_WALK_DEPTH:
            return
        for n in names:
            sub = os.path.join(rel, n) if rel else n
            try:
                if fs.stat(os.path.join(root, sub)).is_dir:
                    walk(sub, depth + 1)
            except FileNotFoundError:
                continue

    walk("", 0)
    return sorted(found)


def _size(fs: Filesystem, root: str, rel: str) -> int:
    try:
        return fs.stat(os.path.join(root, rel)).size
    except FileNotFoundError:
        return 0


def _closure(st: CatalogState, roots: Iterable[tuple[str, int]]) -> set[str]:
    """Packs reached from ``roots`` through dependency edges (D4)."""
    return {p for p, _ in st.closure(roots)}


def catalog_view(fs: Filesystem, root: str, st: CatalogState) -> dict[str, Any]:
    sizes = {p: _size(fs, root, p) for p, i in st.packs.items() if not i.unlinked}
    states = Counter("unlinked" if i.unlinked else "tombstoned" if i.tombstoned else i.state
                     for i in st.packs.values())
    owners = {}
    for (run, name), roots in sorted(st.owners.items()):
        packs = _closure(st, roots)
        # owners belong to a run: "<run>/<name>" ("(legacy)/<name>": a version-1 owner of
        # no single run, see straw.catalog)
        owners[f"{run or '(legacy)'}/{name}"] = {"roots": len(roots), "packs": len(packs),
                         "bytes": sum(sizes.get(p, 0) for p in packs)}
    staged = {p: i for p, i in st.packs.items() if not i.tombstoned
              and (i.staged() is None or any(True for _ in i.staged() or ()))}
    collectable = st.collectable()
    return {
        "packs": {"total": len(st.packs), **dict(sorted(states.items())),
                  "bytes": sum(sizes.values())},
        "owners": owners,
        "staged": {"packs": len(staged), "bytes": sum(sizes.get(p, 0) for p in staged),
                   "open_packs": sum(1 for i in staged.values() if i.state == "open")},
        "tombstones": {"total": sum(1 for i in st.packs.values() if i.tombstoned),
                       "not_unlinked": len(st.tombstoned_not_unlinked())},
        "collectable": {"packs": len(collectable),
                        "bytes": sum(sizes.get(p, 0) for p in collectable),
                        "paths": collectable},
    }


def queue_view(fs: Filesystem, root: str, rel: str) -> dict[str, Any]:
    st = read_queue_state(fs, os.path.join(root, rel))
    leases: Counter[str] = Counter()
    for t in st.tasks.loaded():
        if t.status == LEASED and t.lease is not None:
            leases[t.lease[1]] += 1
    stages: Counter[str] = Counter()
    for t in st.tasks.loaded():
        if t.status not in TERMINAL and isinstance(t.metadata, dict) and \
                isinstance(t.metadata.get(STAGE_KEY), str):
            stages[f"{t.metadata[STAGE_KEY]}/{t.status}"] += 1
    staleness = _staleness(fs, root, [c.result for c in st.commits[-STALENESS_SAMPLE:]])
    batches = Counter("finished" if st.batch_finished(k) else "ready" if b.ref is not None
                      else "planned" for k, b in st.batches.items())
    return {
        "queue": rel,
        "epoch": st.epoch,
        "sealed": st.sealed,
        "tasks": dict(sorted(st.tasks.status_counts().items())),
        "tasks_by_stage": dict(sorted(stages.items())),
        "leases_by_worker": dict(sorted(leases.items())),
        "outstanding_reads": len(st.reads),
        "commits": len(st.commits),
        "consumers": {cid: {"fetch": c.fetch, "processed": c.processed}
                      for cid, c in sorted(st.consumers.items())},
        "batches": dict(sorted(batches.items())),
        "checkpoints": sorted(st.checkpoints),
        "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
    }


def _staleness(fs: Filesystem, root: str, results: list[Any]) -> Counter[int]:
    """Histogram of the ``staleness`` metadata of committed results' records (manifests
    only: a small read each, checked; never the payloads)."""
    hist: Counter[int] = Counter()
    sessions: dict[str, ReadSession] = {}
    try:
        for t in results:
            m = PACK_PATH_RE.match(str(t[0]))
            if m is None:
                continue
            run = m.group("run")
            if run not in sessions:
                sessions[run] = ReadSession(fs, root, run, SystemClock())
            for rec in sessions[run].checked_manifest(ref_from_tuple(run, t)).records:
                v = rec.metadata.get(STALENESS_KEY) if isinstance(rec.metadata, dict) else None
                if isinstance(v, int) and not isinstance(v, bool):
                    hist[v] += 1
    finally:
        for session in sessions.values():
            session.close()
    return hist


def inspect(root: str, fs: Filesystem | None = None) -> dict[str, Any]:
    """Everything ``straw inspect`` shows, as one JSON-able dict (read-only)."""
    fs = fs or PosixFS()
    root = os.path.abspath(root)
    info = check_pool(fs, root)
    queues, errors = [], []
    for q in find_queues(fs, root):
        try:
            queues.append(queue_view(fs, root, q))
        except StrawError as e:  # one damaged queue must not hide the others
            errors.append(f"queue {q}: {type(e).__name__}: {e}")
    return {"pool": root, "format": info["version"],
            **catalog_view(fs, root, read_state(fs, root)), "queues": queues,
            "errors": errors}


def collect(root: str, *, dry_run: bool, fs: Filesystem | None = None) -> dict[str, Any]:
    """``straw gc``: one pool-wide collection (or, dry, what it would reclaim).  Reclaims
    only what no owner, pin or staged extent reaches (D4); queue owners' retired history is
    dropped by their coordinators' ``collect_garbage``, not here."""
    fs = fs or PosixFS()
    root = os.path.abspath(root)
    check_pool(fs, root)
    if dry_run:
        view = catalog_view(fs, root, read_state(fs, root))
        return {"pool": root, "dry_run": True, "would_reclaim_files": view["collectable"]["packs"],
                "would_reclaim_bytes": view["collectable"]["bytes"],
                "paths": view["collectable"]["paths"],
                "unfinished_tombstones": view["tombstones"]["not_unlinked"]}
    catalog = Catalog(fs, root)  # no run: the operator's pool-wide collection
    try:
        # packs of dead writers (their locks are free) are sealed first, as a store's
        # collection does for its own run, so that they can be reclaimed
        sealed, damaged = seal_dead_writers(fs, root, catalog, SystemClock())
        out = catalog.collect_pool()
    finally:
        catalog.close()
    return {"pool": root, "dry_run": False, **out, "sealed_for_dead_writers": sealed,
            "damaged": [d.as_dict() for d in damaged]}
