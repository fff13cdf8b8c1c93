"""The commit log and the tiered dicts of submissions and request answers.

The commit log is append-only: ``CommitLog`` is a ``list[CommitRecord]`` to its readers,
whose older positions live in history segments (``straw.queue.history``) and whose
recovered rows stay decoded tuples until read.  ``TieredDict`` is a dict whose older
entries live in history segments: the completion ids (submission id -> commit position)
and the request answers (request id -> (digest, reply), D7).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, ItemsView, Iterable, Iterator, MutableMapping, Sequence
from typing import Any, NamedTuple, cast, overload

from .history import MISSING as _HMISSING
from .history import History, row_usage
from .tasks import RefTuple

_MISSING: Any = object()


class CommitRecord(NamedTuple):
    """One accepted result (immutable: the commit log only grows)."""

    task_id: str
    attempt: int
    submission_id: str
    result: RefTuple
    digest: str
    epoch: int
    metadata: Any


# a CommitRecord from a decoded row, in C (no per-row Python frame)
_record = cast(Callable[[Iterable[Any]], CommitRecord],
               functools.partial(tuple.__new__, CommitRecord))


class TieredDict(MutableMapping[str, Any]):
    """A dict whose older entries live in history segments (``table`` of a
    ``straw.queue.history.History``), looked up on demand; new entries are kept in memory until
    the next snapshot moves them.  ``decode`` turns a stored value into the live form."""

    __slots__ = ("live", "history", "table", "decode")

    def __init__(self, table: str, decode: Callable[[Any], Any] = lambda v: v) -> None:
        self.live: dict[str, Any] = {}
        self.history: History | None = None
        self.table, self.decode = table, decode

    def __getitem__(self, key: str) -> Any:
        v = self.live.get(key, _MISSING)
        if v is not _MISSING:
            return v
        if self.history is not None and isinstance(key, str):
            h = self.history.get(self.table, key)
            if h is not _HMISSING:
                return self.decode(h)
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.live[key] = value

    def __delitem__(self, key: str) -> None:
        del self.live[key]

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self.live) + (0 if self.history is None
                                 else self.history.counts[self.table])

    def __iter__(self) -> Iterator[str]:
        if self.history is not None:  # reads every history segment (inspection only)
            yield from (k for k, _ in self.history.items(self.table))
        yield from self.live

    def items(self) -> ItemsView[str, Any]:
        out = {} if self.history is None else {
            k: self.decode(v) for k, v in self.history.items(self.table)}
        out.update(self.live)
        return out.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TieredDict, dict)):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TieredDict({len(self)} entries)"


def request_value(v: Sequence[Any]) -> tuple[str, tuple[str, ...]]:
    """A request answer as history stores it, as the state holds it."""
    return (v[0], tuple(v[1]))


class CommitLog(Sequence[CommitRecord]):
    """The commit log, append-only: a ``list[CommitRecord]`` to its readers.  Rows recovered
    from a snapshot stay the decoded tuples; reading makes ``CommitRecord``s (immutable, so
    a fresh one per read is indistinguishable)."""

    __slots__ = ("_rows", "_base", "history")

    def __init__(self, rows: Iterable[Sequence[Any]] = ()) -> None:
        self._rows: list[Sequence[Any]] = list(rows)
        # positions below _base live in history segments (straw.queue.history), read on demand
        self._base = 0
        self.history: History | None = None

    def __len__(self) -> int:
        return self._base + len(self._rows)

    def _row(self, i: int) -> Sequence[Any]:
        if i < self._base:
            assert self.history is not None
            return self.history.commit(i)
        return self._rows[i - self._base]

    @overload
    def __getitem__(self, i: int) -> CommitRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[CommitRecord]: ...

    def __getitem__(self, i: int | slice) -> CommitRecord | list[CommitRecord]:
        if isinstance(i, slice):
            if not self._base:
                return list(map(_record, self._rows[i]))
            return [_record(self._row(p)) for p in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("commit log index out of range")
        return _record(self._row(i))

    def __iter__(self) -> Iterator[CommitRecord]:
        if self._base:
            yield from map(_record, map(self._row, range(self._base)))
        yield from map(_record, self._rows)

    def usage(self, start: int, skip: Iterable[int] = ()) -> dict[str, int]:
        """Bytes, records and tokens of the results at positions >= ``start`` except
        ``skip`` (``history.row_usage``): history segments answer from their index's
        per-block sums, so this costs the live rows, not the history."""
        out = [0, 0, 0]
        if self._base > start:
            assert self.history is not None
            out = self.history.commit_usage(start)
        for row in self._rows[max(0, start - self._base):]:
            for k, v in enumerate(row_usage(row)):
                out[k] += v
        for p in set(skip):
            if start <= p < len(self):
                for k, v in enumerate(row_usage(self._row(p))):
                    out[k] -= v
        return {"bytes": out[0], "records": out[1], "tokens": out[2]}

    @property
    def base(self) -> int:
        """Commits held by history segments (positions 0..base-1)."""
        return self._base

    def attach(self, history: History, base: int) -> None:
        """Commits below ``base`` are now read from ``history``; drop them from memory."""
        del self._rows[:base - self._base]
        self._base, self.history = base, history

    def append(self, record: CommitRecord) -> None:
        self._rows.append(record)

    def rows(self) -> list[Sequence[Any]]:
        """The rows held in memory (positions base.., tuples in CommitRecord field order):
        do not modify."""
        return self._rows

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommitLog):
            return NotImplemented
        return list(map(tuple, self)) == list(map(tuple, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CommitLog({len(self._rows)} commits)"

