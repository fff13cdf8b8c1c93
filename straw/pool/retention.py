"""What keeps a store's data alive (D1-D4): its run's owners, readers' pins, the staging
of fresh publications, and the holds of its writer (``straw.pool.hold_owners``).

Every reference retained, pinned or held must name a publication of the pool: checked
(in bulk where it can) before the catalog is changed, so that no owner ever roots bytes
that do not exist.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import IdempotencyConflict, StrawError
from . import hold_owners
from .arguments import PIN_OWNER_PREFIX, RESERVED_OWNER_PREFIXES, check_owner, checked, listed
from .catalog.state import Extent
from .parts import StoreParts
from .refs import RecordRef, RecordSetRef, SegmentRef

log = logging.getLogger("straw")

HOLD_API = "hold"  # the api part of the owner of an explicit ``hold`` (hold_owners)


class Retention:
    """The retention calls of one store (its contract is the store's; see there), and
    the preparation holds its writer has taken (``holds``: owner names)."""

    def __init__(self, store: StoreParts) -> None:
        self._store = store
        # this writer id's preparation holds (``straw.pool.hold_owners``): its own failed
        # requests' and its predecessors' (loaded when the writer starts)
        self.holds: set[str] = set()

    # --- owners and pins ----------------------------------------------------------------
    def retain(self, owner: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        s = self._store
        s._check_open()
        check_owner(owner)
        items = listed(refs)
        found = self.checked(items, "refs")  # in-pool aliases resolved to their packs
        # D4: what an owner retains must exist; the references are resolved and checked
        # once for both uses
        check_all_published(self._store, items, "refs", found)
        s.catalog.retain(owner, [(r.segment.path, r.segment.offset) for r in found])

    def release(self, owner: str, *,
                only_if: Sequence[RecordSetRef | RecordRef] | None = None) -> bool:
        s = self._store
        s._check_open()
        if not isinstance(owner, str):
            raise TypeError(f"owner must be a str, got {type(owner).__name__}")
        if owner.startswith(RESERVED_OWNER_PREFIXES) and not owner.startswith(PIN_OWNER_PREFIX):
            # "reserved": straw-queue's word, which its callers match
            raise ValueError(f"owner {owner!r} uses a reserved prefix: it belongs to straw "
                             "itself (a queue's owner: release its data through the "
                             "coordinator)")
        expected = None if only_if is None else self.extents(only_if, "only_if")
        return s.catalog.release(owner, only_if=expected)

    def pin(self, refs: Iterable[RecordSetRef | RecordRef], owner: str | None) -> Pin:
        self._store._check_open()
        if owner is not None:
            check_owner(owner)
        items = listed(refs)
        return Pin(self._store, self.extents(items, "refs"), items, owner)

    def owners(self) -> list[str]:
        s = self._store
        s._check_process()
        with s.catalog.locked() as st:
            return sorted(st.run_owners(s.run_id))

    # --- staging --------------------------------------------------------------------------
    def release_publications(self, refs: Iterable[RecordSetRef]) -> int:
        s = self._store
        s._check_open()
        found = self.checked(refs, "refs")
        named = [(r.segment.path, r.segment.offset) for r in found]
        deps = self.staged_dependencies([r.segment for r in found])
        return s.catalog.unstage(named, dependencies=deps)

    def staged_dependencies(self, segs: Iterable[SegmentRef],
                            known: Mapping[Extent, Sequence[SegmentRef]] | None = None
                            ) -> set[Extent]:
        s = self._store
        s._check_process()
        st = s.catalog.state
        known = known or {}
        start = {(seg.path, seg.offset) for seg in segs}
        todo = list(segs)
        seen: set[Extent] = set()
        out: set[Extent] = set()
        while todo:
            seg = todo.pop()
            e = (seg.path, seg.offset)
            if e in seen or seg.run_id != s.run_id:
                continue
            seen.add(e)
            if not st.may_be_staged(e):
                continue  # (a named one too: what it needs went when it was unstaged)
            needs = known.get(e)
            if needs is None:
                try:
                    needs = s._session.needs(seg)
                except (StrawError, OSError):
                    continue
            if e not in start:
                out.add(e)
            todo.extend(needs)
        return out

    # --- holds (straw.pool.hold_owners) -------------------------------------------------
    def hold(self, key: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        s = self._store
        s._check_open()
        check_owner(key)
        owner = hold_owners.hold_owner(s.writer_id, HOLD_API, key)
        items = listed(refs)
        found = self.checked(items, "refs")
        check_all_published(self._store, items, "refs", found)
        with s._write_lock:
            s._check_open()
            s._ensure_writer()  # its lock tells collections the holder is alive
            s.catalog.retain(owner, [(r.segment.path, r.segment.offset) for r in found])
            self.holds.add(owner)

    def release_hold(self, key: str) -> bool:
        s = self._store
        s._check_open()
        owner = hold_owners.hold_owner(s.writer_id, HOLD_API, check_owner(key))
        with s._write_lock:
            if owner not in self.holds:
                return False
            s.catalog.release(owner)
            self.holds.discard(owner)
            return True

    def hold_dependencies(self, error: Exception, api: str, submission_id: str,
                          deps: Sequence[Any]) -> None:
        """A request that failed before its publication was durable: retain its valid
        dependencies under its own hold, so that its retry still finds them.  Best effort
        (the caller raises ``error`` whatever happens here)."""
        s = self._store
        if isinstance(error, IdempotencyConflict) or s.closed or s._in_forked_child():
            return  # a conflict's submission id is taken: no retry of it can publish
        extents = []
        for d in deps:
            if not isinstance(d, (RecordSetRef, RecordRef)):
                continue
            try:
                s.check_published(d, "dependency")
            except (StrawError, ValueError, TypeError):
                continue  # not a publication of this pool: nothing to protect
            extents.append((d.segment.path, d.segment.offset))
        if not extents:
            return
        owner = hold_owners.hold_owner(s.writer_id, api, submission_id)
        try:
            with s._write_lock:
                if s.closed:
                    return
                s._ensure_writer()  # its lock tells collections the holder is alive
                s.catalog.retain(owner, extents)
                self.holds.add(owner)
        except (StrawError, OSError) as e:
            log.warning("straw: cannot hold the dependencies of failed request %r of "
                        "writer %r: %s", submission_id, s.writer_id, e)

    def drop_holds(self, owners: set[str] | None = None) -> None:
        """Release this writer's holds ``owners`` (all of them by default).  Called
        under the write lock."""
        chosen = set(self.holds) if owners is None else owners & self.holds
        if not chosen:
            return
        try:
            hold_owners.release_all(self._store.catalog, chosen)
        except (StrawError, OSError) as e:
            # left for the next close, or a collection once this writer is gone
            log.warning("straw: cannot release holds %s: %s", sorted(chosen), e)
            return
        self.holds -= chosen

    # --- reference checks -----------------------------------------------------------------
    def extents(self, refs: Iterable[Any], where: str) -> list[Extent]:
        return [(r.segment.path, r.segment.offset) for r in self.checked(refs, where)]

    def checked(self, refs: Iterable[Any], where: str) -> list[RecordSetRef | RecordRef]:
        """``refs`` with in-pool aliases resolved, each structurally checked and of this
        run (``TypeError``/``InvalidReference`` naming ``where[i]`` otherwise)."""
        s = self._store
        return checked(refs, where, s.run_id, s._session._canonical)


def check_all_published(store: StoreParts, refs: Sequence[RecordSetRef | RecordRef], where: str,
                        found: Sequence[RecordSetRef | RecordRef] | None = None) -> None:
    """Each of ``refs`` (checked by ``checked`` already) must name a publication: what an
    owner retains must exist (D4).  Confirmed in bulk (``confirm_published``: a read per run
    of neighbouring extents); what that does not confirm is checked one by one, which raises
    the error naming it."""
    store._check_process()
    # ``found``: ``refs`` as ``checked`` returned them (resolved already)
    canonical = found if found is not None else [store._session._canonical(r)
                                                 for r in refs]
    segs = [r.segment for r in canonical]
    for i, ok in enumerate(store._session.confirm_published(segs)):
        if not ok:
            store.check_published(refs[i], f"{where}[{i}]")


class Pin:
    """A reader's durable protection, held while the ``with`` block runs."""

    def __init__(self, store: StoreParts, extents: list[Extent],
                 refs: Sequence[RecordSetRef | RecordRef] = (), owner: str | None = None
                 ) -> None:
        self.store = store
        self.extents = extents
        self.refs = refs
        self.owner = owner or (f"{PIN_OWNER_PREFIX}{socket.gethostname()}:{os.getpid()}:"
                               f"{uuid.uuid4().hex}")
        self.held = False

    def __enter__(self) -> Pin:
        self.store._check_process()
        check_all_published(self.store, self.refs, "refs")
        self.store.catalog.retain(self.owner, self.extents)
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        # a forked child leaving the block leaves the parent's pin alone (straw.process)
        if self.held and not self.store._in_forked_child():
            self.store.catalog.release(self.owner)
            self.held = False
