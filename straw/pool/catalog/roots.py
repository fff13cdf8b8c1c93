"""Compact sets of extents for the catalog's state (``SortedOffsets``, ``RootSet``).

Role: how the catalog holds what grows with a job: a queue owner roots every result it
accepted (a million after a long job) and a sealed pack lists every extent it holds.  As
Python sets of tuples (or of ints) a million of them cost about half a second to build,
which is what a catalog snapshot would spend on every open.  Here they are kept as they
are stored in a snapshot: a sorted array of u64 offsets per pack, decoded with one copy;
membership is a binary search; what changes after the snapshot lives in small overlay sets
(``RootSet`` for an owner's roots, ``OffsetSet`` for a pack's unstaged extents).
So opening a pool costs little per live extent (CS1, issue 13).  Pure: no I/O.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, MutableSet, Set
from typing import Any

import numpy as np

Extent = tuple[str, int]
_LITTLE = sys.byteorder == "little"


class SortedOffsets(Set[int]):
    """An immutable set of offsets, stored as a sorted array of u64."""

    __slots__ = ("_a",)

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._a = array("Q", sorted(set(values)))

    @classmethod
    def from_le_bytes(cls, data: bytes) -> SortedOffsets:
        """From the little-endian u64 array of a snapshot, which ``le_u64`` wrote sorted
        (its order is not checked again here: the snapshot's digest covers it)."""
        if len(data) % 8:
            raise ValueError(f"an offset array of {len(data)} bytes")
        out = cls.__new__(cls)
        a = array("Q")
        a.frombytes(data)
        if not _LITTLE:
            a.byteswap()
        out._a = a
        return out

    def le_bytes(self) -> bytes:
        if _LITTLE:
            return self._a.tobytes()
        b = array("Q", self._a)
        b.byteswap()
        return b.tobytes()

    def __contains__(self, o: object) -> bool:
        if not isinstance(o, int) or o < 0:
            return False
        a = self._a
        i = bisect_left(a, o)
        return i < len(a) and a[i] == o

    def __iter__(self) -> Iterator[int]:
        return iter(self._a)

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"SortedOffsets({len(self._a)} offsets)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SortedOffsets, (list(self._a),))

    __hash__ = Set._hash


def le_u64(values: Iterable[int]) -> bytes:
    """Sorted little-endian u64 bytes of ``values`` (a snapshot's offset array), sorted
    in C (compaction runs in the background, but a million offsets sorted in Python
    would still cost a second of the GIL)."""
    if isinstance(values, (SortedOffsets, OffsetSet)):
        return values.le_bytes()
    n = len(values) if isinstance(values, Set) else -1
    a = np.fromiter(values, dtype=np.uint64, count=n)
    a.sort()
    return a.astype("<u8", copy=False).tobytes()


def _merged(base: SortedOffsets, added: set[int] | None, removed: set[int] | None) -> bytes:
    """``base`` plus ``added`` minus ``removed``, as sorted little-endian u64 bytes."""
    a = np.frombuffer(base.le_bytes(), dtype="<u8")
    if removed:
        a = a[~np.isin(a, np.fromiter(removed, dtype=np.uint64, count=len(removed)))]
    if added:  # never in the base (RootSet keeps them apart): insert, no duplicates
        more = np.fromiter(added, dtype=np.uint64, count=len(added))
        more.sort()
        a = np.insert(a, np.searchsorted(a, more), more)
    return a.astype("<u8", copy=False).tobytes()


class OffsetSet(MutableSet[int]):
    """A mutable set of offsets: a sorted base (from a snapshot, never changed) plus the
    offsets added since and the base offsets removed since.  A pack's unstaged extents:
    after a long job nearly every extent of every pack, so a snapshot's open must not
    build them into Python sets (a million ints cost about 0.2 s)."""

    __slots__ = ("_base", "_added", "_removed")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._base = _EMPTY
        self._added: set[int] = set()
        self._removed: set[int] = set()
        self.update(values)

    @classmethod
    def from_base(cls, base: SortedOffsets) -> OffsetSet:
        """A set whose content is ``base`` (shared, immutable)."""
        out = cls()
        out._base = base
        return out

    def __contains__(self, o: object) -> bool:
        if o in self._added:
            return True
        return o in self._base and o not in self._removed

    def __iter__(self) -> Iterator[int]:
        removed = self._removed
        for o in self._base:
            if o not in removed:
                yield o
        yield from self._added

    def __len__(self) -> int:
        return len(self._base) - len(self._removed) + len(self._added)

    def add(self, o: int) -> None:
        if o in self._base:
            self._removed.discard(o)  # (back in the base, or there already)
        else:
            self._added.add(o)

    def discard(self, o: int) -> None:
        if o in self._added:
            self._added.discard(o)
        elif o in self._base:
            self._removed.add(o)

    def update(self, values: Iterable[int]) -> None:
        base, added, removed = self._base, self._added, self._removed
        for o in values:  # ``add`` inlined: a catalog replay calls this per publication
            if base and o in base:
                removed.discard(o)
            else:
                added.add(o)

    def le_bytes(self) -> bytes:
        """The content as sorted little-endian u64 bytes (a snapshot's offset array)."""
        if not self._added and not self._removed:
            return self._base.le_bytes()
        return _merged(self._base, self._added, self._removed)

    def missing_from(self, offsets: Iterable[int]) -> SortedOffsets:
        """``offsets`` minus this set, in C (a sealed pack's staged extents)."""
        a = np.frombuffer(le_u64(offsets), dtype="<u8")
        mine = np.frombuffer(self.le_bytes(), dtype="<u8")
        return SortedOffsets.from_le_bytes(
            np.setdiff1d(a, mine, assume_unique=True).astype("<u8", copy=False).tobytes())

    def __repr__(self) -> str:
        return f"OffsetSet({len(self)} offsets)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (OffsetSet, (list(self),))


_EMPTY = SortedOffsets()


class RootSet(MutableSet[Extent]):
    """A mutable set of extents: per pack, a sorted base (from a snapshot, never changed)
    plus the offsets added since and the base offsets removed since."""

    __slots__ = ("_base", "_added", "_removed", "_n")

    def __init__(self, extents: Iterable[Extent] = ()) -> None:
        self._base: dict[str, SortedOffsets] = {}
        self._added: dict[str, set[int]] = {}
        self._removed: dict[str, set[int]] = {}
        self._n = 0
        self.update(extents)

    @classmethod
    def from_packs(cls, base: dict[str, SortedOffsets]) -> RootSet:
        """A set whose content is ``base`` (the offsets of each pack; shared, immutable)."""
        out = cls()
        out._base = {p: offs for p, offs in base.items() if len(offs)}
        out._n = sum(len(offs) for offs in out._base.values())
        return out

    def __contains__(self, e: object) -> bool:
        if not isinstance(e, tuple) or len(e) != 2:
            return False
        p, o = e
        added = self._added.get(p)
        if added is not None and o in added:
            return True
        base = self._base.get(p)
        if base is None or o not in base:
            return False
        removed = self._removed.get(p)
        return removed is None or o not in removed

    def __iter__(self) -> Iterator[Extent]:
        for p, base in self._base.items():
            removed = self._removed.get(p)
            for o in base:
                if removed is None or o not in removed:
                    yield (p, o)
        for p, added in self._added.items():
            for o in added:
                yield (p, o)

    def __len__(self) -> int:
        return self._n

    def add(self, e: Extent) -> None:
        if e in self:
            return
        p, o = e
        removed = self._removed.get(p)
        if removed is not None and o in removed:
            removed.discard(o)  # back in the base
        else:
            self._added.setdefault(p, set()).add(o)
        self._n += 1

    def discard(self, e: Extent) -> None:
        if e not in self:
            return
        p, o = e
        added = self._added.get(p)
        if added is not None and o in added:
            added.discard(o)
        else:
            self._removed.setdefault(p, set()).add(o)
        self._n -= 1

    def update(self, extents: Iterable[Extent]) -> None:
        # ``add`` inlined: replaying a catalog's suffix calls this for every adoption
        base_d, added_d, removed_d = self._base, self._added, self._removed
        n = 0
        for p, o in extents:
            added = added_d.get(p)
            if added is not None and o in added:
                continue
            base = base_d.get(p)
            if base is not None and o in base:
                removed = removed_d.get(p)
                if removed is not None and o in removed:
                    removed.discard(o)
                    n += 1
                continue
            if added is None:
                added = added_d[p] = set()
            added.add(o)
            n += 1
        self._n += n

    def copy(self) -> RootSet:
        """A copy (the bases are shared: they never change)."""
        out = RootSet()
        out._base = dict(self._base)
        out._added = {p: set(s) for p, s in self._added.items() if s}
        out._removed = {p: set(s) for p, s in self._removed.items() if s}
        out._n = self._n
        return out

    def packed(self) -> Iterator[tuple[str, bytes]]:
        """Each pack with its offsets as sorted little-endian u64 bytes (what a snapshot
        stores; a base nothing changed is written as it is)."""
        for p in {**self._base, **self._added}:
            base = self._base.get(p)
            added = self._added.get(p)
            if base is None:
                if added:
                    yield p, le_u64(added)
                continue
            data = _merged(base, added, self._removed.get(p))
            if data:
                yield p, data

    def __repr__(self) -> str:
        return f"RootSet({self._n} extents)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (RootSet, (list(self),))


__all__ = ["OffsetSet", "RootSet", "SortedOffsets", "le_u64"]
