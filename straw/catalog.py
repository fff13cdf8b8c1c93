"""The ownership catalog: which packs exist, who needs which extents, what may be reclaimed.

One append-only log per pool, ``<root>/CATALOG``.  Its inode never changes (it is never
replaced or renamed), because an ``flock`` on it is also the pool's cross-client lock:
every catalog change and every collection happens under that lock.  Each transaction is
one frame (``straw.framing``, kind CATALOG) holding a msgpack list of operations, appended
and fsynced before the lock is released; a client replays only what was appended since
it last looked.  A torn final transaction (a client died mid-append) is cut off under the
lock; a complete frame that fails its checksum followed by later transactions fails
closed with ``CorruptData`` (D6).

Operations (the state they build is ``CatalogState``)::

    init     {v}                          first frame: the catalog format version
    open     {path}                       a writer created a pack (before creating it)
    edges    {src: [path, off], deps: [[path, off], ...]}
                                          dependencies of an extent, recorded before its
                                          bytes are written (D1/D4: deps retained first)
    sealed   {path, offsets, unstage}     the pack is complete: these extents exist; the
                                          listed ones are not staged (recovery of a crash)
    retain   {owner, roots}               replaces the owner's root extents
    release  {owner}
    adopt    {owner, epoch, add, replace, unstage}
                                          a queue coordinator's update of its owner: add
                                          roots (before journaling, D2), or replace them
                                          all, and drop staging it took over.  Fenced:
                                          applied only if ``epoch`` is at least the highest
                                          epoch seen for that owner (D8), so a paused old
                                          coordinator can never remove what a newer one
                                          needs
    unstage  {extents}                    release_publications: staging dropped
    tombstone {paths}                     durable mark before unlink (D3)
    unlinked {paths}                      the files are gone

Staging: every extent of an open pack, and every extent of a sealed pack that was not
unstaged, protects itself and (through its edges) its dependencies — a fresh publication
costs no catalog write unless it has external dependencies.

Reachability (D4): live extents are the closure, through edges, of owner roots (pins are
owners too) and staged extents.  A pack is live if it is open, or holds a live extent; one
live extent keeps its whole pack.  Collection tombstones sealed packs that are not live,
makes the tombstones durable, then unlinks (ENOENT is success: another client may have
finished it); a collection interrupted between tombstone and unlink is finished by the next
one.  A tombstoned path is never retained, reopened or reused (D3).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from . import framing
from .errors import CorruptData, InvalidReference, UnsafeRecovery, UnsupportedSchema
from .fs import Filesystem
from .pack import storage_error
from .siblings import Siblings

CATALOG_NAME = "CATALOG"
CATALOG_VERSION = 1

Extent = tuple[str, int]  # (pack path relative to the pool root, extent offset)


@dataclass
class PackInfo:
    state: str = "open"  # open | sealed
    offsets: frozenset[int] = frozenset()  # extents, known once sealed
    unstaged: set[int] = field(default_factory=set)
    tombstoned: bool = False
    unlinked: bool = False

    def staged(self) -> Iterable[int] | None:
        """Staged extent offsets of a sealed pack; None for an open pack (all staged)."""
        if self.state == "open":
            return None
        return self.offsets - self.unstaged


@dataclass
class CatalogState:
    """The catalog's content, rebuilt by replaying operations (pure: no I/O)."""

    packs: dict[str, PackInfo] = field(default_factory=dict)
    edges: dict[Extent, tuple[Extent, ...]] = field(default_factory=dict)
    # the edge sources of each pack, so sealing a pack touches only its own edges
    edge_offsets: dict[str, set[int]] = field(default_factory=dict)
    # updated in place: a queue adds roots one completion group at a time, and copying
    # its whole root set per adopt made replay and the completion path quadratic
    owners: dict[str, set[Extent]] = field(default_factory=dict)
    owner_epochs: dict[str, int] = field(default_factory=dict)

    def apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "init":
            if op["v"] > CATALOG_VERSION:
                raise UnsupportedSchema(
                    f"catalog format version {op['v']}; this straw reads up to "
                    f"{CATALOG_VERSION}. Upgrade straw"
                )
        elif kind == "open":
            self.packs.setdefault(op["path"], PackInfo())
        elif kind == "edges":
            path, off = op["src"]
            self.edges[(path, off)] = tuple((p, o) for p, o in op["deps"])
            self.edge_offsets.setdefault(path, set()).add(off)
        elif kind == "sealed":
            info = self.packs.setdefault(op["path"], PackInfo())
            info.state = "sealed"
            info.offsets = frozenset(op["offsets"])
            info.unstaged.update(op["unstage"])
            # edges recorded for extents that never made it into the pack are dead
            srcs = self.edge_offsets.get(op["path"], set())
            for off in [o for o in srcs if o not in info.offsets]:
                srcs.discard(off)
                del self.edges[(op["path"], off)]
        elif kind == "retain":
            self.owners[op["owner"]] = {(p, o) for p, o in op["roots"]}
        elif kind == "release":
            self.owners.pop(op["owner"], None)
        elif kind == "adopt":
            owner, epoch = op["owner"], op["epoch"]
            if epoch < self.owner_epochs.get(owner, 0):
                return  # a fenced (older) coordinator: ignored by every client alike
            self.owner_epochs[owner] = epoch
            if op.get("replace") is not None:
                roots = self.owners[owner] = {(p, o) for p, o in op["replace"]}
            else:
                roots = self.owners.setdefault(owner, set())
            roots.update((p, o) for p, o in op.get("add", ()))
            for p, o in op.get("unstage", ()):
                self.packs.setdefault(p, PackInfo()).unstaged.add(o)
        elif kind == "unstage":
            for p, o in op["extents"]:
                self.packs.setdefault(p, PackInfo()).unstaged.add(o)
        elif kind == "tombstone":
            for p in op["paths"]:
                self.packs.setdefault(p, PackInfo(state="sealed")).tombstoned = True
        elif kind == "unlinked":
            for p in op["paths"]:
                self.packs.setdefault(p, PackInfo(state="sealed")).unlinked = True
        else:
            raise UnsupportedSchema(f"catalog operation {kind!r} is unknown; upgrade straw")

    # --- reachability (D4) --------------------------------------------------------------
    def staged_extents(self) -> set[Extent]:
        """Extents with an edge that are staged (the only staged extents that matter for
        reachability beyond their own pack)."""
        out = set()
        for src in self.edges:
            info = self.packs.get(src[0])
            if info is None or src[1] not in info.unstaged:
                out.add(src)
        return out

    def tombstoned_dependency(self, roots: Iterable[Extent]) -> Extent | None:
        """The first extent reachable from ``roots`` (themselves included) whose pack was
        reclaimed: such roots cannot be retained (D3/D4: a root's whole closure must be
        readable)."""
        todo = list(roots)
        seen: set[Extent] = set()
        while todo:
            e = todo.pop()
            if e in seen:
                continue
            seen.add(e)
            if self.is_tombstoned(e[0]):
                return e
            todo.extend(self.edges.get(e, ()))
        return None

    def live_extents(self) -> set[Extent]:
        todo = [e for roots in self.owners.values() for e in roots]
        todo.extend(self.staged_extents())
        live: set[Extent] = set()
        while todo:
            e = todo.pop()
            if e in live:
                continue
            live.add(e)
            todo.extend(self.edges.get(e, ()))
        return live

    def live_packs(self) -> set[str]:
        live = {p for p, _ in self.live_extents()}
        for path, info in self.packs.items():
            if info.tombstoned:
                continue
            staged = info.staged()
            if staged is None or any(True for _ in staged):
                live.add(path)
        return live

    def collectable(self) -> list[str]:
        """Sealed, untombstoned packs that nothing reaches."""
        live = self.live_packs()
        return sorted(p for p, i in self.packs.items()
                      if i.state == "sealed" and not i.tombstoned and p not in live)

    def tombstoned_not_unlinked(self) -> list[str]:
        return sorted(p for p, i in self.packs.items() if i.tombstoned and not i.unlinked)

    def is_tombstoned(self, path: str) -> bool:
        info = self.packs.get(path)
        return info is not None and info.tombstoned


class Catalog:
    """A client of the pool's catalog.  Thread-safe; one per store."""

    def __init__(self, fs: Filesystem, root: str) -> None:
        self.fs = fs
        self.root = root
        self.path = os.path.join(root, CATALOG_NAME)
        self.state = CatalogState()
        self._offset = 0  # how far this client has replayed
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: list[_AdoptRequest] = []
        # callers that announced an adopt (``adopting_soon``) and have not queued it yet:
        # the thread writing the pending adopts waits for them (``straw.siblings``)
        self.siblings = Siblings(self._pending_lock)

    def close(self) -> None:
        with self._mutex:
            if self._lock_fd is not None:
                self.fs.close(self._lock_fd)
                self._lock_fd = None

    # --- the lock and replay ------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[CatalogState]:
        """Hold the pool lock with an up-to-date state.  The data is read through a handle
        opened *after* the lock was taken (close-to-open visibility across clients)."""
        with self._mutex, self._flocked() as st:
            yield st

    @contextlib.contextmanager
    def _flocked(self) -> Iterator[CatalogState]:
        """The cross-client lock and a refreshed state (``_mutex`` already held)."""
        try:
            if self._lock_fd is None:
                self._lock_fd = self._open_lock_file()
            self.fs.lock(self._lock_fd)
        except OSError as e:
            raise storage_error(e, f"cannot lock catalog {self.path}") from e
        try:
            self._refresh()
            yield self.state
        finally:
            try:
                self.fs.unlock(self._lock_fd)
            except OSError:
                pass

    def _open_lock_file(self) -> int:
        try:
            return self.fs.open(self.path, write=True)
        except FileNotFoundError:
            fd = self.fs.open(self.path, write=True, create=True)
            self.fs.fsync_dir(self.root)  # D1: the catalog's name is durable
            return fd

    def _refresh(self) -> None:
        fd = self.fs.open(self.path, write=True)
        try:
            data = self.fs.read_to_end(fd, self._offset)
            if not data and self._offset == 0:
                self._append_fd(fd, [{"op": "init", "v": CATALOG_VERSION}])
                data = self.fs.read_to_end(fd, 0)
            base = self._offset
            scan = framing.scan_frames(lambda o, n: data[o - base:o - base + n],
                                       base + len(data), start=base)
            if scan.frames:
                # Another client may have died after writing but before its fsync: what we
                # are about to act on (a tombstone, a release) must be durable first.
                self.fs.fsync(fd)
            for f in scan.frames:
                if f.header.kind != framing.KIND_CATALOG:
                    raise CorruptData(f"{self.path} offset {f.offset}: not a catalog frame")
                for op in _decode_ops(f.body, f"{self.path} offset {f.offset}"):
                    self.state.apply(op)
            if scan.torn or scan.end < base + len(data):
                # a client died mid-append: cut its torn transaction off, under the lock
                self.fs.truncate(fd, scan.end)
                self.fs.fsync(fd)
            self._offset = scan.end
        except CorruptData as e:
            raise CorruptData(f"catalog {self.path}: {e}") from None
        except OSError as e:
            raise storage_error(e, f"cannot read catalog {self.path}") from e
        finally:
            self.fs.close(fd)

    def _append_fd(self, fd: int, ops: list[dict[str, Any]]) -> int:
        body = msgpack.packb({"v": CATALOG_VERSION, "ops": ops}, use_bin_type=True)
        frame = framing.encode_frame(framing.KIND_CATALOG, body, group_start=self._offset)
        self.fs.writev(fd, [frame], self._offset)
        self.fs.fsync(fd)
        return len(frame)

    def append(self, ops: list[dict[str, Any]]) -> None:
        """Durably append one transaction (call inside ``locked``), then apply it exactly
        as every other client will when it replays it (we hold the lock: nothing else
        was appended since our refresh)."""
        fd = self.fs.open(self.path, write=True)
        try:
            n = self._append_fd(fd, ops)
        except OSError as e:
            # the tail may now be torn: the next locker (maybe us) repairs it
            raise storage_error(e, f"catalog append to {self.path} failed") from e
        finally:
            self.fs.close(fd)
        for op in ops:
            self.state.apply(op)
        self._offset += n

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

    def retain(self, owner: str, roots: Iterable[Extent]) -> None:
        roots = sorted(set(roots))
        with self.locked() as st:
            dead = st.tombstoned_dependency(roots)
            if dead is not None:
                raise InvalidReference(
                    f"cannot retain for owner {owner!r}: the extent at {dead[0]} offset "
                    f"{dead[1]} (a root or one of its dependencies) was reclaimed (tombstoned)"
                )
            self.append([{"op": "retain", "owner": owner, "roots": [list(r) for r in roots]}])

    def release(self, owner: str) -> bool:
        with self.locked() as st:
            if owner not in st.owners:
                return False
            self.append([{"op": "release", "owner": owner}])
            return True

    def adopt(self, owner: str, epoch: int, *, add: Iterable[Extent] = (),
              replace: Iterable[Extent] | None = None, unstage: Iterable[Extent] = (),
              announced: Announcement | None = None) -> bool:
        """A queue coordinator's fenced update of its owner (see ``adopt`` above).  Returns
        False if a newer epoch already owns it (this coordinator is fenced).

        Plain additions from concurrent threads are combined: whichever thread gets the
        catalog first writes every pending addition in ONE transaction (one lock, one
        fsync) and the others find their request done — group commit for the catalog."""
        add = sorted(set(add))
        if replace is None and not unstage:
            return self._adopt_combined(owner, epoch, add, announced)
        if announced is not None:
            with self._pending_lock:
                self._arrived(announced)
        with self.locked() as st:
            if epoch < st.owner_epochs.get(owner, 0):
                return False
            dead = st.tombstoned_dependency(
                add + (sorted(set(replace)) if replace is not None else []))
            if dead is not None:
                raise InvalidReference(
                    f"cannot adopt for {owner!r}: the extent at {dead[0]} offset {dead[1]} (or "
                    "a dependency of what was given) was reclaimed (tombstoned)"
                )
            op: dict[str, Any] = {"op": "adopt", "owner": owner, "epoch": epoch,
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
        req = _AdoptRequest(owner, epoch, add)
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
                if r.epoch < st.owner_epochs.get(r.owner, 0):
                    r.result = False
                    continue
                dead = st.tombstoned_dependency(r.add)
                if dead is not None:
                    r.error = InvalidReference(
                        f"cannot adopt for {r.owner!r}: the extent at {dead[0]} offset "
                        f"{dead[1]} (given, or a dependency) was reclaimed (tombstoned)")
                    continue
                ops.append({"op": "adopt", "owner": r.owner, "epoch": r.epoch,
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

    def unstage(self, extents: Iterable[Extent]) -> int:
        with self.locked() as st:
            todo = []
            for p, o in sorted(set(extents)):
                info = st.packs.get(p)
                if info is not None and (info.tombstoned or o in info.unstaged or
                                         (info.state == "sealed" and o not in info.offsets)):
                    continue
                todo.append([p, o])
            if todo:
                self.append([{"op": "unstage", "extents": todo}])
            return len(todo)

    def collect(self) -> dict[str, Any]:
        """One collection: tombstone what nothing reaches, make it durable, unlink (D3/D4)."""
        with self.locked() as st:
            unfinished = st.tombstoned_not_unlinked()
            victims = st.collectable()
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
                    self.fs.unlink(full)
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
            return {
                "reclaimed_files": len(gone),
                "reclaimed_bytes": sum(sizes.get(p, 0) for p in gone),
                "tombstoned": victims,
                "finished_interrupted": unfinished,
                "retained_packs": sorted(p for p in live if not st.packs.get(
                    p, PackInfo()).tombstoned),
                "owners": sorted(st.owners),
            }


class Announcement:
    """An adopt announced by ``Catalog.adopting_soon`` (``arrived`` once it is queued)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.arrived = False


@dataclass
class _AdoptRequest:
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


def read_state(fs: Filesystem, root: str) -> CatalogState:
    """The catalog as it is durable now, read without its lock and without writing
    anything (operator views: ``straw inspect``, ``straw gc --dry-run``).  A torn final
    transaction is ignored here, not cut off (only a writer under the lock cuts, D6)."""
    path = os.path.join(root, CATALOG_NAME)
    state = CatalogState()
    try:
        fd = fs.open(path)
    except FileNotFoundError:
        return state
    try:
        data = fs.read_to_end(fd)
    finally:
        fs.close(fd)
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    for f in scan.frames:
        if f.header.kind != framing.KIND_CATALOG:
            raise CorruptData(f"{path} offset {f.offset}: not a catalog frame")
        for op in _decode_ops(f.body, f"{path} offset {f.offset}"):
            state.apply(op)
    return state


def _decode_ops(body: Any, where: str) -> list[dict[str, Any]]:
    try:
        txn = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types
        raise CorruptData(f"{where}: transaction does not decode: {e}") from None
    if not isinstance(txn, dict) or not isinstance(txn.get("v"), int):
        raise CorruptData(f"{where}: not a catalog transaction")
    if txn["v"] > CATALOG_VERSION:
        raise UnsupportedSchema(f"{where}: catalog format version {txn['v']}; upgrade straw")
    ops = txn.get("ops")
    if not isinstance(ops, list):
        raise CorruptData(f"{where}: transaction without operations")
    return ops


__all__ = ["Catalog", "CatalogState", "PackInfo", "read_state"]
