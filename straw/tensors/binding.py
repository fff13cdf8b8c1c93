"""Which store or read session a tensor reference reads through, and the checks that
it is of the reference's pool and run.

Which pool a reference belongs to: its ``run_id`` and ``pool_id`` (the id written once in
the pool's ``POOL`` marker, ``SharedFilesystemStore.pool_id``).  Two pools may hold the
same run id; a reference followed into the wrong one would find no pack and spend the
whole visibility retry window first.  So every way of reading through a given store or
session (``using``, ``load(reader=)``, ``from_record_set_many(reader=)``, ``share``, and
the store an unbound ref opens at ``root``) compares run and pool id first, and refuses
another pool at once, naming both (``InvalidReference``).  A pool or reference without an
id (an older straw's, or a read-only mount of one) is checked by run only.

After ``fork()`` (``straw.process``): a ref bound to a store of the parent raises
``ForkedProcess`` in the child (rebind it with ``ref.using(store)`` to a store opened in
the child, or send it pickled: pickling drops the binding); an unbound ref reads through
a store of the child's own.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..errors import InvalidReference
from ..read.session import ReadSession


def _pool_id_of(reader: Any) -> str | None:
    """The pool id a store or read session knows (None: a pool without one)."""
    pool_id = getattr(reader, "pool_id", None)
    return pool_id if isinstance(pool_id, str) else None


def _session_of(reader: Any) -> ReadSession:
    if isinstance(reader, ReadSession):
        return reader
    session = getattr(reader, "_session", None)
    if isinstance(session, ReadSession):
        return session
    raise TypeError(f"expected a SharedFilesystemStore or ReadSession, got "
                    f"{type(reader).__name__}")


def _check_same_pool(store: Any, reader: Any) -> None:
    """A ``reader=`` must be of the store's pool and run (``InvalidReference`` naming
    both, before anything is read)."""
    ours, theirs = _pool_id_of(store), _pool_id_of(reader)
    if (getattr(reader, "run_id", None) != getattr(store, "run_id", None)
            or (ours is not None and theirs is not None and ours != theirs)):
        raise InvalidReference(
            f"reader of run {getattr(reader, 'run_id', '?')!r} of pool "
            f"{theirs or '(id unknown)'} at {getattr(reader, 'root', '?')} belongs to a "
            f"different storage pool or run than the store (run "
            f"{getattr(store, 'run_id', '?')!r} of pool {ours or '(id unknown)'} at "
            f"{getattr(store, 'root', '?')}); use a read session of the store")


_auto_stores: dict[tuple[str, str], Any] = {}
_auto_lock = threading.Lock()


def own_store(root: str, run_id: str, name: str) -> Any:
    """This process's own read-only store of the pool at ``root`` and run ``run_id``
    (opened once per pool and run, then shared), for tensor ``name``, a reference bound
    to no open reader; ``InvalidReference`` when no pool is there."""
    key = (root, run_id)
    with _auto_lock:
        store = _auto_stores.get(key)
        if store is None:
            from ..fs import PosixFS
            from ..pool.store import SharedFilesystemStore

            if not root or not PosixFS().exists(os.path.join(root, "POOL")):
                raise InvalidReference(
                    f"tensor {name!r}: no pool at {root!r} on this machine; "
                    "bind the reference to a store with ref.using(store)")
            store = SharedFilesystemStore(root, run_id)
            _auto_stores[key] = store
    return store


def _reset_after_fork() -> None:
    """In a forked child: a lock another thread held at the fork stays held, and the
    cached stores are the parent's (they refuse use in the child)."""
    global _auto_stores, _auto_lock
    _auto_stores = {}
    _auto_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
