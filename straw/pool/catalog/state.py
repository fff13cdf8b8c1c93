"""The catalog's content as pure state: ``CatalogState``, rebuilt by replaying the
catalog's operations (``apply``), and what the catalog's rules ask of it (reachability,
collectable packs, whether an operation adds retention, how much freeing everything would
append).  No I/O and no locks: ``straw.catalog`` reads and appends the log and keeps this
state; ``straw.catalog_snapshot`` encodes it; operator views read it (``read_state``).

The operations and their format are documented with the log, in ``straw.catalog``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from ...errors import CorruptData, UnsupportedSchema
from .roots import OffsetSet, RootSet

# 4: a retain lists its roots grouped by pack (each path once: a checkpoint retaining
# 10,000 groups wrote 530 KB, the path repeated per root); 3: base frames (snapshots);
# 2: owner operations carry their run
CATALOG_VERSION = 5

# what freeing appends cost (measured: a release of an owner with a 27-character name is
# ~190 bytes with its confirm, a pack's tombstone and unlinked ~160), with room for longer
# names; the floor keeps this much per owner and per pack the catalog knows (B10)
FREEING_BYTES_PER_OWNER = 320
FREEING_BYTES_PER_PACK = 256
# and per publication still staged in a sealed pack: an unstage names each pack once and
# each offset as a msgpack integer (at most 9 bytes)
FREEING_BYTES_PER_STAGED = 10


def freeing_bytes(state: CatalogState, new_entries: int = 0) -> int:
    """What releasing every owner, unstaging every staged publication of a sealed pack and
    collecting every pack of ``state`` would append, at most (plus ``new_entries`` owners
    or packs a transaction may add): the catalog keeps it
    reserved, so a full pool can always free itself.  Packs already unlinked are counted
    too (their records stay): an over-estimate that grows with the pool's history, about
    256 bytes per pack ever written."""
    return (FREEING_BYTES_PER_OWNER * (len(state.owners) + new_entries)
            + FREEING_BYTES_PER_PACK * len(state.packs)
            + FREEING_BYTES_PER_STAGED * state.staged_in_sealed_packs())


# operations that never add retention: they may use the reserved floor on a full disk
FREEING_OPS = frozenset({"release", "unstage", "sealed", "tombstone", "unlinked",
                         "repaired", "repair_confirmed"})

Extent = tuple[str, int]  # (pack path relative to the pool root, extent offset)
OwnerKey = tuple[str, str]  # (run id, owner name): owners belong to a run
LEGACY_RUN = ""  # the run of a version-1 owner whose roots name no single run


def run_of(path: str) -> str | None:
    """The run a pack path belongs to (``runs/<run>/...``), or None."""
    parts = path.split("/", 2)
    return parts[1] if len(parts) == 3 and parts[0] == "runs" and parts[1] else None


def run_prefix(run: str) -> str:
    """The pack paths of ``run`` start with this (run ids contain no '/')."""
    return f"runs/{run}/"


@dataclass
class PackInfo:
    state: str = "open"  # open | sealed
    # extents, known once sealed (a SortedOffsets when decoded from a snapshot)
    offsets: AbstractSet[int] = frozenset()
    # nearly every extent once a long job ran: kept as a snapshot's sorted array plus
    # what changed since (a snapshot's open builds no Python set of them, CS1)
    unstaged: OffsetSet = field(default_factory=OffsetSet)
    tombstoned: bool = False
    unlinked: bool = False

    def staged(self) -> Iterable[int] | None:
        """Staged extent offsets of a sealed pack; None for an open pack (all staged)."""
        if self.state == "open":
            return None
        return self.unstaged.missing_from(self.offsets)


@dataclass
class CatalogState:
    """The catalog's content, rebuilt by replaying operations (pure: no I/O)."""

    packs: dict[str, PackInfo] = field(default_factory=dict)
    edges: dict[Extent, tuple[Extent, ...]] = field(default_factory=dict)
    # the edge sources of each pack, so sealing a pack touches only its own edges
    edge_offsets: dict[str, set[int]] = field(default_factory=dict)
    # updated in place: a queue adds roots one completion group at a time, and copying
    # its whole root set per adopt made replay and the completion path quadratic
    # (grouped by pack: a snapshot decodes a million roots without building tuples)
    owners: dict[OwnerKey, RootSet] = field(default_factory=dict)
    owner_epochs: dict[OwnerKey, int] = field(default_factory=dict)
    # version-1 owner operations (no run field): the key each v1 owner name resolved to
    v1_owners: dict[str, OwnerKey] = field(default_factory=dict)
    # side files of operator repairs not confirmed yet: collection stops while non-empty
    unconfirmed_repairs: set[str] = field(default_factory=set)
    # publications staged in sealed packs, counted on first use, then kept up to date
    _staged: int | None = field(default=None, repr=False, compare=False)

    def staged_in_sealed_packs(self) -> int:
        """How many extents of sealed, live packs are still staged (what unstaging them
        all would name; ``freeing_bytes``).  Counted once, then maintained by ``apply``."""
        if self._staged is None:
            self._staged = sum(_staged_count(i) for i in self.packs.values())
        return self._staged

    def _unstage(self, path: str, offset: int) -> None:
        info = self.packs.setdefault(path, PackInfo())
        if self._staged is not None and info.state == "sealed" and not info.tombstoned \
                and offset not in info.unstaged:
            self._staged -= 1
        info.unstaged.add(offset)

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
            before = _staged_count(info)
            info.state = "sealed"
            info.offsets = frozenset(op["offsets"])
            info.unstaged.update(op["unstage"])
            if self._staged is not None:
                self._staged += _staged_count(info) - before
            # edges recorded for extents that never made it into the pack are dead
            srcs = self.edge_offsets.get(op["path"], set())
            for off in [o for o in srcs if o not in info.offsets]:
                srcs.discard(off)
                del self.edges[(op["path"], off)]
        elif kind == "retain":
            retained = _retained(op)
            self.owners[self._owner_key(op, retained)] = RootSet(retained)
        elif kind == "release":
            self.owners.pop(self._current_key(op), None)
        elif kind == "adopt":
            epoch = op["epoch"]
            if epoch < self.owner_epochs.get(self._current_key(op), 0):
                return  # a fenced (older) coordinator: ignored by every client alike
            owner = self._owner_key(op, [*op.get("add", ()), *(op.get("replace") or ())])
            self.owner_epochs[owner] = epoch
            if op.get("replace") is not None:
                roots = self.owners[owner] = RootSet((p, o) for p, o in op["replace"])
            else:
                roots = self.owners.setdefault(owner, RootSet())
            roots.update((p, o) for p, o in op.get("add", ()))
            for p, o in op.get("unstage", ()):
                self._unstage(p, o)
        elif kind == "unstage":
            for p, o in _unstaged(op):
                self._unstage(p, o)
        elif kind == "tombstone":
            for p in op["paths"]:
                info = self.packs.setdefault(p, PackInfo(state="sealed"))
                if self._staged is not None:
                    self._staged -= _staged_count(info)
                info.tombstoned = True
        elif kind == "unlinked":
            for p in op["paths"]:
                self.packs.setdefault(p, PackInfo(state="sealed")).unlinked = True
        elif kind == "repaired":
            self.unconfirmed_repairs.add(op["side"])
        elif kind == "repair_confirmed":
            self.unconfirmed_repairs.difference_update(op["sides"])
        elif kind == "base":
            # only ever the first operation of the catalog's first frame, read by the
            # catalog itself (``Catalog._refresh``): anywhere else the catalog is damaged
            raise CorruptData("a catalog base operation that is not the catalog's first "
                              "operation")
        else:
            raise UnsupportedSchema(f"catalog operation {kind!r} is unknown; upgrade straw")

    def _current_key(self, op: dict[str, Any]) -> OwnerKey:
        """The owner an operation names as it stands (a v1 name: where it resolved)."""
        if "run" in op:
            return (op["run"], op["owner"])
        return self.v1_owners.get(op["owner"], (LEGACY_RUN, op["owner"]))

    def _owner_key(self, op: dict[str, Any], roots: Iterable[Any]) -> OwnerKey:
        """The owner an operation acts on: ``(run, owner)``; for a version-1 operation
        (no run field) the run its roots' paths name, else the run the v1 name already
        had (module docstring).  A v1 owner whose run becomes known moves to it."""
        name = op["owner"]
        if "run" in op:
            return (op["run"], name)
        runs = {run_of(p) for p, _ in roots}
        prev = self.v1_owners.get(name)
        if not runs:
            key = prev or (LEGACY_RUN, name)
        elif len(runs) == 1 and None not in runs:
            key = (runs.pop() or LEGACY_RUN, name)
        else:  # roots of no run, or of several: nobody's to release
            key = (LEGACY_RUN, name)
        if prev is not None and prev != key:
            if prev in self.owners:
                self.owners[key] = self.owners.pop(prev)
            if prev in self.owner_epochs:
                self.owner_epochs[key] = self.owner_epochs.pop(prev)
        self.v1_owners[name] = key
        return key

    def run_owners(self, run: str) -> dict[str, RootSet]:
        """The owners of ``run`` by name, with their roots (a new dict, same sets)."""
        return {name: roots for (r, name), roots in self.owners.items() if r == run}

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
        return next((e for e in self._reach(roots) if self.is_tombstoned(e[0])), None)

    def closure(self, roots: Iterable[Extent]) -> set[Extent]:
        """``roots`` and every extent they reach through dependency edges (D4)."""
        return set(self._reach(roots))

    def _reach(self, roots: Iterable[Extent]) -> Iterator[Extent]:
        """Each extent reachable from ``roots`` through dependency edges, once, depth first
        (a caller may stop early)."""
        todo = list(roots)
        seen: set[Extent] = set()
        while todo:
            e = todo.pop()
            if e in seen:
                continue
            seen.add(e)
            yield e
            todo.extend(self.edges.get(e, ()))

    def live_extents(self) -> set[Extent]:
        return self.closure([*(e for roots in self.owners.values() for e in roots),
                             *self.staged_extents()])

    def live_packs(self) -> set[str]:
        live = {p for p, _ in self.live_extents()}
        for path, info in self.packs.items():
            if info.tombstoned:
                continue
            staged = info.staged()
            if staged is None or any(True for _ in staged):
                live.add(path)
        return live

    def collectable(self, prefix: str = "") -> list[str]:
        """Sealed, untombstoned packs under ``prefix`` that nothing (of any run) reaches."""
        live = self.live_packs()
        return sorted(p for p, i in self.packs.items()
                      if p.startswith(prefix) and i.state == "sealed" and not i.tombstoned
                      and p not in live)

    def tombstoned_not_unlinked(self, prefix: str = "") -> list[str]:
        return sorted(p for p, i in self.packs.items()
                      if p.startswith(prefix) and i.tombstoned and not i.unlinked)

    def is_tombstoned(self, path: str) -> bool:
        info = self.packs.get(path)
        return info is not None and info.tombstoned

    def may_be_staged(self, e: Extent) -> bool:
        """Whether ``e`` can still hold staging: not unstaged, its pack not tombstoned and,
        once sealed, holding it.  A pack this state does not know yet (a client's view is
        a catalog prefix) may: ``Catalog.unstage`` decides on the current state."""
        info = self.packs.get(e[0])
        if info is None:
            return True
        return not info.tombstoned and e[1] not in info.unstaged and (
            info.state == "open" or e[1] in info.offsets)

    def adds_retention(self, op: dict[str, Any]) -> bool:
        """Could ``op`` make more extents live (or create a pack)?  Those appends need the
        catalog's reserved floor intact; the others may use it (a full pool frees itself)."""
        kind = op["op"]
        if kind in FREEING_OPS:
            return False
        if kind == "retain":
            return not set(_retained(op)) <= self.owners.get(self._current_key(op), set())
        if kind == "adopt":
            if op.get("add"):
                return True
            replace = op.get("replace")
            return replace is not None and \
                not {(p, o) for p, o in replace} <= self.owners.get(self._current_key(op), set())
        return True  # init, open, edges, and anything new


def _staged_count(info: PackInfo) -> int:
    """The staged extents of a sealed, live pack (0 for an open or tombstoned one: an open
    pack's extents are not known yet, a tombstoned one has none)."""
    if info.state != "sealed" or info.tombstoned:
        return 0
    return len(info.offsets) - len(info.unstaged)


def by_pack(extents: Iterable[Extent]) -> list[list[Any]]:
    """``extents`` grouped by pack, as retain and unstage operations list them:
    ``[[path, [offset, ...]], ...]``, sorted."""
    packs: dict[str, list[int]] = {}
    for p, o in sorted(extents):
        packs.setdefault(p, []).append(o)
    return [[p, offs] for p, offs in packs.items()]


def _unstaged(op: dict[str, Any]) -> Iterator[Extent]:
    """An unstage's extents: grouped by pack (``packs``: ``[[path, [offset, ...]], ...]``,
    version 5), or one ``[path, offset]`` pair each (``extents``, earlier versions)."""
    if "packs" in op:
        return ((p, o) for p, offs in op["packs"] for o in offs)
    return ((p, o) for p, o in op["extents"])


def _retained(op: dict[str, Any]) -> list[Extent]:
    """A retain's roots: grouped by pack (``packs``: ``[[path, [offset, ...]], ...]``,
    version 4), or one ``[path, offset]`` pair each (``roots``, earlier versions)."""
    if "packs" in op:
        return [(p, o) for p, offs in op["packs"] for o in offs]
    return [(p, o) for p, o in op["roots"]]


__all__ = ["CATALOG_VERSION", "FREEING_OPS", "LEGACY_RUN", "CatalogState", "Extent",
           "OwnerKey", "PackInfo", "freeing_bytes", "run_of", "run_prefix"]
