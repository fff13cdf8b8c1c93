"""Preparation holds: the dependencies of a failed publication stay protected for its
retry (straw-queue's documented behaviour, which its callers rely on).

A publication names its dependencies; once it is durable, its extent's edges retain them
(D4).  If the call fails before that (a record it refuses, an unknown codec, a full disk),
nothing retains them yet, and a source that releases them meanwhile could see them
collected before the caller retries.  So a failed call retains its valid dependencies
under a hold owner of its own, one per request::

    publication:hold:<writer_id>:<32 hex of sha256(api NUL submission_id)>

(under straw's reserved ``publication:`` prefix: no application name meets it).  A hold
is dropped

* when the same request (writer id, api, submission id) later succeeds: its extent's edges
  hold the dependencies from then on;
* when the store holding that writer closes, or the writer id is retired
  (``retire_writer``): a hold is for the retry, and a closed writer retries nothing;
* by a collection, when the writer is dead (its ``LOCK`` is free: a live store holds it
  while it has holds, because a hold is only taken through its writer).

A restarted incarnation of the writer id keeps its predecessor's holds (it may be the one
that retries) and drops them when it closes.  Taking a hold is best effort on an error
path: if it fails too (say the disk is full), the original error is raised as it was and
the retry is as unprotected as it was before holds existed.

The same owners serve ``SharedFilesystemStore.hold(key, refs)``: retention that lives as
long as its writer, for a step that must keep data until a durable name of its own exists
(an archive's index).  Its owner is ``hold_owner(writer_id, "hold", key)`` and it goes by
the same rules (``release_hold``, the store's close, a collection once the writer is dead),
so a writer killed before naming what it kept leaves nothing retained for ever.

In the model (``spec/``) a hold is an owner like any other: it is taken with ``retain``
and dropped with ``release``; nothing here changes what those operations do.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable

from ..clock import Clock
from ..errors import StrawError
from ..fs import Filesystem
from . import role_lock
from .catalog.catalog import Catalog

log = logging.getLogger("straw")

HOLD_PREFIX = "publication:hold:"


def hold_owner(writer_id: str, api: str, submission_id: str) -> str:
    """The owner name of the hold of one request of writer ``writer_id``."""
    key = hashlib.sha256(f"{api}\0{submission_id}".encode()).hexdigest()[:32]
    return f"{HOLD_PREFIX}{writer_id}:{key}"


def writer_prefix(writer_id: str) -> str:
    """The prefix of every hold of writer ``writer_id``."""
    return f"{HOLD_PREFIX}{writer_id}:"


def writer_of(owner: str) -> str | None:
    """The writer id a hold owner belongs to; None if ``owner`` is not a hold."""
    if not owner.startswith(HOLD_PREFIX):
        return None
    writer_id, sep, _ = owner[len(HOLD_PREFIX):].rpartition(":")
    return writer_id if sep and writer_id else None


def _run(catalog: Catalog) -> str:
    assert catalog.run_id is not None, "holds belong to a run: a store's catalog"
    return catalog.run_id


def holds_of(catalog: Catalog, writer_id: str) -> set[str]:
    """The holds of writer ``writer_id`` in the catalog's run."""
    prefix = writer_prefix(writer_id)
    with catalog.locked() as st:
        return {name for name in st.run_owners(_run(catalog)) if name.startswith(prefix)}


def release_all(catalog: Catalog, owners: set[str]) -> None:
    """Drop the holds ``owners`` (each its own catalog transaction: holds are rare)."""
    for owner in sorted(owners):
        catalog.release(owner)


def release_holds_of_dead_writers(fs: Filesystem, root: str, catalog: Catalog, clock: Clock,
                                  owners: Iterable[str], *, live_writer: str) -> list[str]:
    """Drop the holds among ``owners`` (this run's owner names, as a collection just
    listed them: no catalog read of its own when there are none) of every writer whose
    ``LOCK`` is free (dead: a store holds its writer's lock while it has holds) or that
    never had a directory; ``live_writer`` (the calling store's own) is skipped.  Holding
    the lock meanwhile keeps that writer id from starting.  Best effort per writer.
    Returns the holds dropped (their dependencies go at the next collection)."""
    run = _run(catalog)
    names = [n for n in owners if n.startswith(HOLD_PREFIX)]
    by_writer: dict[str, set[str]] = {}
    for name in names:
        writer_id = writer_of(name)
        if writer_id is not None and writer_id != live_writer:
            by_writer.setdefault(writer_id, set()).add(name)
    dropped: list[str] = []
    for writer_id, owners in sorted(by_writer.items()):
        writer_dir = os.path.join(root, "runs", run, "writers", writer_id)
        try:
            if not fs.exists(writer_dir):
                release_all(catalog, owners)
            else:
                with role_lock.if_dead(fs, writer_dir, clock) as dead:
                    if not dead:
                        continue  # alive: its store drops its holds itself
                    release_all(catalog, owners)
        except (StrawError, OSError) as e:
            log.warning("straw: cannot drop the holds of dead writer %s: %s", writer_id, e)
            continue
        dropped.extend(sorted(owners))
    return dropped


__all__ = ["HOLD_PREFIX", "hold_owner", "holds_of", "release_all",
           "release_holds_of_dead_writers", "writer_of", "writer_prefix"]
