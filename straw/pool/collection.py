"""Collection as one store runs it, and the state of packs it acts on.

``collect`` reclaims this run's unreachable sealed packs (D3, D4) after sealing what dead
writers (and this store's abandoned packs) left open; ``pack_status`` tells a read that
failed whether the pack is final or may be another client's visibility lag;
``disk_usage`` counts this run's pack files.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import StrawError
from ..fs import Filesystem
from ..read.session import drop_reclaimed
from ..read.visibility import PackStatus
from . import hold_owners
from .parts import StoreParts
from .recovery import seal_dead_writers
from .refs import PACK_SUFFIXES


def collect(store: StoreParts) -> dict[str, Any]:
    """``SharedFilesystemStore.collect_garbage`` (its contract is there)."""
    with store._write_lock:
        if store._writer is not None:
            store._writer.seal_abandoned()
            store._writer.seal_if_full()  # no later publication would add to it
    on_behalf, damaged = seal_dead_writers(store.fs, store.root, store.catalog, store.clock,
                                           run=store.run_id)
    result = store.catalog.collect()
    hold_owners.release_holds_of_dead_writers(store.fs, store.root, store.catalog, store.clock,
                                              result["owner_names"],
                                              live_writer=store.writer_id)
    drop_reclaimed(store._session.real_root,
                   result["tombstoned"] + result["finished_interrupted"])
    result["sealed_for_dead_writers"] = on_behalf
    result["damaged"] = [d.as_dict() for d in damaged]
    return result


def pack_status(store: StoreParts, path: str) -> PackStatus | None:
    """What the catalog knows of pack ``path``, read fresh under the pool lock; None
    if it cannot tell.  Reads ask only after a read failed, to tell a final pack
    (nothing to wait for) from another client's visibility lag."""
    if store.closed or not store.fs.probe(store.catalog.path):
        return None
    w = store._writer
    pack = w.pack if w is not None else None
    if pack is not None and w is not None and w.pack_rel == path:
        # this store's own open pack: written through this client, so a short or
        # zeroed read is damage, never another client's visibility lag
        return PackStatus("own", frozenset(e.offset for e in list(pack.entries)))
    try:
        with store.catalog.locked() as st:
            info = st.packs.get(path)
            if info is None:
                return PackStatus("unknown")
            return PackStatus("tombstoned" if info.tombstoned else info.state,
                              frozenset(info.offsets))
    except (StrawError, OSError):
        return None


def disk_usage(fs: Filesystem, root: str, run_id: str) -> dict[str, int]:
    """Pack files and bytes of run ``run_id`` on disk."""
    files = 0
    total = 0
    run_dir = os.path.join(root, "runs", run_id)
    stack = [run_dir]
    while stack:
        d = stack.pop()
        try:
            names = fs.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            p = os.path.join(d, name)
            st = fs.stat(p)
            if st.is_dir:
                stack.append(p)
            elif name.endswith(PACK_SUFFIXES):
                files += 1
                total += st.size
    return {"pack_files": files, "bytes": total}
