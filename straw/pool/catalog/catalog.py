"""The ownership catalog: which packs exist, who needs which extents, what may be reclaimed.

The catalog is one append-only log per pool, ``<root>/CATALOG``, shared by every client
under its ``flock`` (``straw.pool.catalog.log``), compacted to a snapshot plus a suffix
(``straw.pool.catalog.compaction``) and repaired in place by an operator
(``straw.pool.catalog.repair``).  This module holds the operations on it.

Operations (the state they build is ``CatalogState``)::

    init     {v}                          first frame: the catalog format version
    open     {path}                       a writer created a pack (before creating it)
    edges    {src: [path, off], deps: [[path, off], ...]}
                                          dependencies of an extent, recorded before its
                                          bytes are written (D1/D4: deps retained first)
    sealed   {path, offsets, unstage}     the pack is complete: these extents exist; the
                                          listed ones are not staged (recovery of a crash)
    retain   {run, owner, packs}          replaces the owner's root extents, grouped by
                                          pack: [[path, [off, ...]], ...] (version 4;
                                          earlier: roots: [[path, off], ...], still read)
    release  {run, owner}
    adopt    {run, owner, epoch, add, replace, unstage}
                                          a queue coordinator's update of its owner: add
                                          roots (before journaling, D2), or replace them
                                          all, and drop staging it took over.  Fenced:
                                          applied only if ``epoch`` is at least the highest
                                          epoch seen for that owner (D8), so a paused old
                                          coordinator can never remove what a newer one
                                          needs
    unstage  {packs}                      release_publications: staging dropped (the named
                                          publications and their staged dependencies),
                                          grouped by pack: [[path, [off, ...]], ...]
                                          (version 5; earlier: extents: [[path, off], ...],
                                          still read)
    tombstone {paths}                     durable mark before unlink (D3)
    unlinked {paths}                      the files are gone
    repaired {at, lost, side}             an operator's repair: the damaged frame at ``at``
                                          (``lost`` bytes, kept in side file ``side``) was
                                          replaced; collection stops until confirmed
    repair_confirmed {sides}              the operator confirmed those repairs
    base     {gen, snap, digest}          only as the first operation of the catalog: the
                                          state starts from that snapshot (above)
    (none: ``ops: []``)                   a confirm frame (above)

Owners belong to a run.  An owner is keyed by ``(run, name)`` (``OwnerKey``): the ``run``
field of retain/release/adopt names the run of the store that wrote it, so runs sharing a
root may use the same owner names (``checkpoint-7``, the ``queue:<ns>/<id>`` of a
coordinator, pins) without touching each other's roots or epochs.  A ``Catalog`` client
acts for one run (``run_id``); an observer opened without one only reads.

Format versions.  Version 5 (this straw) groups an unstage's extents by pack; version 4
did a retain's; version 3 added base frames and snapshots; version 2 added
the ``run`` field.  A version-1 catalog's
owner operations have none; they stay readable without losing retention: such an
operation belongs to the run that its roots' pack paths name (``runs/<run>/...``; a v1
store could only retain references of its own run), and one that names no roots (a
release, a queue's first claim, a retain of nothing) to the run the v1 owner name already
had.  A v1 owner whose roots name no run, or several, is kept under the run ``""``
(``LEGACY_RUN``, which no run id can be): it protects its roots, and no run lists or
releases it.

Staging: every extent of an open pack, and every extent of a sealed pack that was not
unstaged, protects itself and (through its edges) its dependencies — a fresh publication
costs no catalog write unless it has external dependencies.

Reachability (D4) is pool-wide: live extents are the closure, through edges, of every
run's owner roots (pins are owners too) and staged extents.  A pack is live if it is open,
or holds a live extent; one live extent keeps its whole pack.  So no run can reclaim what
another run retains.  A store's collection (``collect``) is moreover scoped to its own run:
it tombstones and unlinks only packs under ``runs/<its run>/``, so one run's collection
never deletes another run's files, even unreferenced ones; ``collect_pool`` is the
operator's pool-wide collection.  Collection tombstones sealed packs that are not live,
makes the tombstones durable, then unlinks (ENOENT is success: another client may have
finished it); a collection interrupted between tombstone and unlink is finished by the next
one.  A tombstoned path is never retained, reopened or reused (D3).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ...errors import (
    CorruptData,
    InvalidReference,
    OwnerMismatch,
    UnsafeRecovery,
    storage_error,
)
from ...fs import Filesystem
from ...siblings import Siblings
from ..refs import pack_path_run
from .compaction import COMPACT_AFTER, CompactedLog
from .read import (
    read_state,
)
from .repair import repair as repair_catalog
from .state import (
    CatalogState,
    Extent,
    OwnerKey,
    PackInfo,
    by_pack,
    run_prefix,
)


class Catalog(CompactedLog):
    """A client of the pool's catalog acting for run ``run_id`` (its owners, its packs'
    collection).  Thread-safe; one per store.  Without ``run_id`` it only observes (and
    ``collect_pool`` collects pool-wide, for an operator)."""

    def __init__(self, fs: Filesystem, root: str, run_id: str | None = None, *,
                 compact_after: int | None = COMPACT_AFTER) -> None:
        super().__init__(fs, root, run_id, compact_after=compact_after)
        self._pending_lock = threading.Lock()
        self._pending: list[_AdoptRequest] = []
        # callers that announced an adopt (``adopting_soon``) and have not queued it yet:
        # the thread writing the pending adopts waits for them (``straw.siblings``)
        self.siblings = Siblings(self._pending_lock)

    # --- operator repair (D6: fail closed, keep the bytes, GC waits for the operator) ----
    def repair(self) -> list[dict[str, Any]]:
        """Make a damaged catalog readable again; returns one report per damaged frame
        (offset, bytes lost, side file) — empty if the catalog was not damaged
        (``straw.pool.catalog.repair``).  Collection then refuses until
        ``confirm_repairs``."""
        return repair_catalog(self)

    def confirm_repairs(self) -> list[str]:
        """The operator's say after a repair: collection may act again.  Returns the side
        files of the repairs confirmed."""
        with self.locked() as st:
            sides = sorted(st.unconfirmed_repairs)
            if sides:
                self.append([{"op": "repair_confirmed", "sides": sides}])
            return sides

    # --- operations ---------------------------------------------------------------------
    def pack_open(self, path: str) -> None:
        with self.locked() as st:
            if path in st.packs:
                raise UnsafeRecovery(f"pack path {path} is already known to the catalog; "
                                     "pack paths are never reused (D3)")
            self.append([{"op": "open", "path": path}])

    def pack_sealed(self, path: str, offsets: Iterable[int], unstage: Iterable[int] = ()
                    ) -> None:
        with self.locked():
            self.append([{"op": "sealed", "path": path, "offsets": sorted(offsets),
                          "unstage": sorted(unstage)}])

    def seal_if_open(self, packs: dict[str, tuple[list[int], list[int]]],
                     prefix: str | None = None) -> None:
        """Recovery: mark a dead incarnation's packs sealed (path -> offsets, unstage).
        Packs under ``prefix`` the catalog calls open but that do not exist on disk (a
        crash right after ``open`` was recorded) are sealed empty, so they do not stay
        "open" forever.  The caller holds the writer lock of that prefix."""
        with self.locked() as st:
            packs = dict(packs)
            if prefix is not None:
                for p, info in st.packs.items():
                    if p.startswith(prefix) and info.state == "open" and p not in packs:
                        packs[p] = ([], [])
            ops = [{"op": "sealed", "path": p, "offsets": sorted(offs), "unstage": sorted(un)}
                   for p, (offs, un) in sorted(packs.items())
                   if st.packs.get(p, PackInfo()).state == "open"
                   and not st.is_tombstoned(p)]
            if ops:
                self.append(ops)

    def record_edges(self, edges: list[tuple[Extent, list[Extent]]]) -> None:
        """Retain dependencies before the dependent bytes are written (D1, D4)."""
        with self.locked() as st:
            for _, deps in edges:
                dead = st.tombstoned_dependency(deps)
                if dead is not None:
                    raise InvalidReference(
                        f"dependency in pack {dead[0]} at offset {dead[1]} (or one it depends "
                        "on) was reclaimed (tombstoned); it cannot be depended on"
                    )
            self.append([{"op": "edges", "src": list(src), "deps": [list(d) for d in deps]}
                         for src, deps in edges])

    def _run(self) -> str:
        """The run whose owners this client changes (owners belong to a run)."""
        if self.run_id is None:
            raise ValueError(f"catalog {self.path} was opened without a run: it can only "
                             "observe; open it with run_id to change owners")
        return self.run_id

    def retain(self, owner: str, roots: Iterable[Extent]) -> None:
        self._check_process()
        run = self._run()
        roots = sorted(set(roots))
        with self.locked() as st:
            dead = st.tombstoned_dependency(roots)
            if dead is not None:
                raise InvalidReference(
                    f"cannot retain for owner {owner!r}: the extent at {dead[0]} offset "
                    f"{dead[1]} (a root or one of its dependencies) was reclaimed (tombstoned)"
                )
            self.append([{"op": "retain", "run": run, "owner": owner,
                          "packs": by_pack(roots)}])

    def release(self, owner: str, *, only_if: Iterable[Extent] | None = None) -> bool:
        """Drop this run's owner ``owner``; False if this run has none of that name.
        ``only_if``: drop it only if its roots are exactly these extents, checked under
        the catalog's lock (``OwnerMismatch`` otherwise, nothing changed)."""
        run = self._run()
        with self.locked() as st:
            roots = st.owners.get((run, owner))
            if roots is None:
                return False
            if only_if is not None and set(roots) != set(only_if):
                raise OwnerMismatch(
                    f"owner {owner!r} of run {run!r} retains {len(roots)} root(s) other than "
                    "the reference(s) it was to be released with: not released (a record "
                    "naming this owner was edited, or names someone else's owner)")
            self.append([{"op": "release", "run": run, "owner": owner}])
            return True

    def adopt(self, owner: str, epoch: int, *, add: Iterable[Extent] = (),
              replace: Iterable[Extent] | None = None, unstage: Iterable[Extent] = (),
              announced: Announcement | None = None) -> bool:
        """A queue coordinator's fenced update of its owner (see ``adopt`` above).  Returns
        False if a newer epoch already owns it (this coordinator is fenced).

        Plain additions from concurrent threads are combined: whichever thread gets the
        catalog first writes every pending addition in ONE transaction (one lock, one
        fsync) and the others find their request done — group commit for the catalog."""
        self._check_process()  # before the pending lock and the mutex
        run = self._run()
        add = sorted(set(add))
        if replace is None and not unstage:
            return self._adopt_combined(owner, epoch, add, announced)
        if announced is not None:
            with self._pending_lock:
                self._arrived(announced)
        with self.locked() as st:
            if epoch < st.owner_epochs.get((run, owner), 0):
                return False
            dead = st.tombstoned_dependency(
                add + (sorted(set(replace)) if replace is not None else []))
            if dead is not None:
                raise InvalidReference(
                    f"cannot adopt for {owner!r}: the extent at {dead[0]} offset {dead[1]} (or "
                    "a dependency of what was given) was reclaimed (tombstoned)"
                )
            op: dict[str, Any] = {"op": "adopt", "run": run, "owner": owner, "epoch": epoch,
                                  "add": [list(e) for e in add],
                                  "unstage": [list(e) for e in sorted(set(unstage))]}
            if replace is not None:
                op["replace"] = [list(e) for e in sorted(set(replace))]
            self.append([op])
            return True

    @contextlib.contextmanager
    def adopting_soon(self) -> Iterator[Announcement]:
        """Announce a plain ``adopt`` this thread is about to make (pass the yielded
        announcement to it): a thread writing pending adopts meanwhile waits for it."""
        self._check_process()
        a = Announcement(self)
        with self._pending_lock:
            self.siblings.announce()
        try:
            yield a
        finally:
            with self._pending_lock:
                self._arrived(a)

    def _arrived(self, a: Announcement | None) -> None:
        """With ``_pending_lock`` held: the announced caller queued (or gave up)."""
        if a is not None and not a.arrived:
            if a.catalog is not self:
                raise ValueError("an Announcement must go to the Catalog that made it")
            a.arrived = True
            self.siblings.arrive()

    def _adopt_combined(self, owner: str, epoch: int, add: list[Extent],
                        announced: Announcement | None) -> bool:
        req = _AdoptRequest(self._run(), owner, epoch, add)
        with self._pending_lock:
            self._pending.append(req)
            self._arrived(announced)
        with self._mutex:
            if req.done:  # an earlier holder wrote it for us
                return req.finish()
            return self._write_pending(req)

    def _write_pending(self, req: _AdoptRequest) -> bool:
        with self._pending_lock:
            self.siblings.gather()
        with self._flocked() as st:
            with self._pending_lock:
                batch, self._pending = self._pending, []
            ops = []
            for r in batch:
                r.done = True
                if r.epoch < st.owner_epochs.get((r.run, r.owner), 0):
                    r.result = False
                    continue
                dead = st.tombstoned_dependency(r.add)
                if dead is not None:
                    r.error = InvalidReference(
                        f"cannot adopt for {r.owner!r}: the extent at {dead[0]} offset "
                        f"{dead[1]} (given, or a dependency) was reclaimed (tombstoned)")
                    continue
                ops.append({"op": "adopt", "run": r.run, "owner": r.owner, "epoch": r.epoch,
                            "add": [list(e) for e in r.add], "unstage": []})
            if ops:
                try:
                    self.append(ops)
                except BaseException as e:
                    for r in batch:
                        if r.error is None and r.result:
                            r.error = e
                    raise
            return req.finish()

    def unstage(self, extents: Iterable[Extent], dependencies: Iterable[Extent] = ()) -> int:
        """release_publications: drop the staging of ``extents`` and ``dependencies`` (their
        staged closure, ``SharedFilesystemStore.staged_dependencies``) in one transaction.
        Returns how many of ``extents`` were still staged."""
        with self.locked() as st:
            named = [e for e in sorted(set(extents)) if st.may_be_staged(e)]
            deps = [e for e in sorted(set(dependencies) - set(extents)) if st.may_be_staged(e)]
            if named or deps:
                self.append([{"op": "unstage", "packs": by_pack(named + deps)}])
            return len(named)

    def collect(self) -> dict[str, Any]:
        """One collection of this run's packs: tombstone what nothing (of any run) reaches,
        make it durable, unlink (D3/D4).  Other runs' files are never touched.  Refused
        after an operator repair until it is confirmed (D6: transactions may have been
        lost with the damaged frame)."""
        return self._collect(self._run())

    def collect_pool(self) -> dict[str, Any]:
        """The operator's pool-wide collection: every run's unreachable packs."""
        return self._collect(None)

    def _collect(self, run: str | None) -> dict[str, Any]:
        prefix = "" if run is None else run_prefix(run)
        with self.locked() as st:
            if st.unconfirmed_repairs:
                raise UnsafeRecovery(
                    f"catalog {self.path} was repaired (damaged bytes kept in "
                    f"{', '.join(sorted(st.unconfirmed_repairs))}): transactions may be lost, "
                    "so garbage collection is stopped. Re-retain what must live, then confirm "
                    "with SharedFilesystemStore.confirm_catalog_repair()"
                )
            unfinished = st.tombstoned_not_unlinked(prefix)
            victims = st.collectable(prefix)
            _check_deletable(self.path, victims + unfinished)
            sizes: dict[str, int] = {}
            for p in victims + unfinished:
                try:
                    sizes[p] = self.fs.stat(os.path.join(self.root, p)).size
                except FileNotFoundError:
                    sizes[p] = 0
            if victims:
                self.append([{"op": "tombstone", "paths": victims}])  # durable before unlink
            gone = []
            dirs = set()
            for p in victims + unfinished:
                full = os.path.join(self.root, p)
                try:
                    self.fs.unlink_beneath(self.root, p)  # never through a symlink
                except FileNotFoundError:
                    pass  # another client finished this unlink already: success
                except OSError as e:
                    raise storage_error(e, f"cannot unlink reclaimed pack {full}") from e
                gone.append(p)
                dirs.add(os.path.dirname(full))
            for d in sorted(dirs):
                try:
                    self.fs.fsync_dir(d)
                except FileNotFoundError:
                    pass
            if gone:
                self.append([{"op": "unlinked", "paths": gone}])
            live = st.live_packs()
            retained = sorted(p for p in live if p.startswith(prefix) and
                              not st.packs.get(p, PackInfo()).tombstoned)
            # owners keeping something alive (straw-queue's count): a queue's owner
            # stays in the catalog, empty, once its tasks hold no input any more
            named = st.run_owners(run).items() if run is not None else (
                (f"{r}/{name}", roots) for (r, name), roots in st.owners.items())
            owners = sorted(name for name, roots in named if len(roots))
            # ... and the publications still staged in sealed packs, each its own root
            # as in straw-queue (whose catalog keeps one staging owner per publication).
            # Counted per pack (extents less those no longer staged: an extent leaves
            # staging at most once), not extent by extent: online GC runs this often.
            staged = sum(max(0, len(i.offsets) - len(i.unstaged))
                         for p, i in st.packs.items()
                         if p.startswith(prefix) and i.state == "sealed" and not i.tombstoned)
            return {
                # straw-queue's counts
                "reclaimed_files": len(gone),
                "reclaimed_bytes": sum(sizes.get(p, 0) for p in gone),
                "tombstones": len(victims),
                "retained_packs": len(retained),
                "open_packs": sum(1 for p, i in st.packs.items() if p.startswith(prefix)
                                  and i.state == "open" and not i.tombstoned),
                "owners": len(owners) + staged,
                # and what they count
                "tombstoned": victims,
                "finished_interrupted": unfinished,
                "retained_pack_paths": retained,
                "owner_names": owners,
            }



class Announcement:
    """An adopt announced by ``Catalog.adopting_soon`` (``arrived`` once it is queued)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.arrived = False


@dataclass
class _AdoptRequest:
    run: str
    owner: str
    epoch: int
    add: list[Extent]
    done: bool = False
    result: bool = True
    error: BaseException | None = None

    def finish(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.result


def _check_deletable(catalog: str, paths: Iterable[str]) -> None:
    """A collection deletes only canonical pack paths (``runs/<run>/writers/<w>/i<n>/
    pack-<n>.pack``: relative, no ``..``), which every pack straw creates has: a catalog
    naming anything else was edited or damaged, and nothing of it is deleted."""
    for p in paths:
        if not isinstance(p, str) or pack_path_run(p) is None:
            raise CorruptData(
                f"catalog {catalog} names {p!r} as a pack to reclaim, which is not a pack "
                "path of this pool (edited or damaged): garbage collection deletes nothing "
                "until the catalog is restored from a backup")


__all__ = ["Announcement", "Catalog", "CatalogState", "Extent", "OwnerKey", "PackInfo",
           "read_state", "run_prefix"]
