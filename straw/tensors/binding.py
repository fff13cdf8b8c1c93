"""Which store or read session a tensor reference reads through, and the checks that
it is of the reference's pool and run."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidReference
from ..reader import ReadSession


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
