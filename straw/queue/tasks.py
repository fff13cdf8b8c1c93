"""A queue's tasks: the ``Task`` record, its statuses and the ``TaskTable`` holding them.

A task is pending, leased or terminal (completed, failed, cancelled).  Terminal tasks
are most of a long-lived queue and are read rarely, so the table keeps those recovered
from a snapshot as their decoded rows until something reads them, and history segments
(``straw.queue.history``) hold those a snapshot moved out (``history_value`` is the form
a segment stores, ``task_from_history`` reads it back).  ``bulk_objects`` surrounds
decoding many of them at once (recovery).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import operator
from collections import Counter
from collections.abc import ItemsView, Iterable, Iterator, MutableMapping, Sequence, ValuesView
from dataclasses import dataclass
from typing import Any, cast

from ..errors import CorruptData
from .history import MISSING as _HMISSING
from .history import History

# straw.refs.ref_to_tuple: 9 fields (6 in journals of the previous straw)
RefTuple = tuple[Any, ...]

PENDING = "pending"
LEASED = "leased"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})


@dataclass(slots=True)
class Task:
    task_id: str
    input: RefTuple | None
    metadata: Any
    priority: int
    key: int
    max_attempts: int
    control: bool  # the control lane (acquired only with acquire(control=True))
    fifo: int
    status: str = PENDING
    attempt: int = 0  # leases granted so far (attempt numbers start at 1)
    failures: int = 0  # fail_task and expiries: the attempt budget
    # (attempt, worker, epoch): the current lease while LEASED, the last one once terminal
    # (task_status shows it); None while pending
    lease: tuple[int, str, int] | None = None
    position: int | None = None
    last_error: Any = None  # the last failure (JSON: fail_task's failure, or a reason)
    allow_empty: bool = False  # may complete with a result of no records
    estimates: tuple[int, int, int] = (1, 0, 0)  # estimated records, bytes, tokens

    def order(self) -> tuple[int, int, int]:
        return (-self.priority, self.key, self.fifo)


# a snapshot task row: Task's fields in order (metadata None: it is kept apart)
_TASK_FIELDS = [f.name for f in dataclasses.fields(Task)]
TASK_ROW_FIELDS = len(_TASK_FIELDS)
# rows of snapshots written before allow_empty/estimates existed (they take the defaults)
_OLD_TASK_ROW_FIELDS = _TASK_FIELDS.index("allow_empty")
STATUS_COLUMN = _TASK_FIELDS.index("status")  # of a snapshot task row
_MISSING: Any = object()


@contextlib.contextmanager
def bulk_objects(promote: bool = False) -> Iterator[None]:
    """Around building many long-lived objects at once (recovery): the cyclic garbage
    collector is off meanwhile (it would rescan them many times over; none of them forms a
    cycle).  With ``promote`` (a large state), afterwards everything built goes straight
    to the oldest generation (``gc.freeze`` then ``gc.unfreeze``: two list splices), so the
    next young collections do not traverse it either (with 100,000 completed tasks that
    first traversal alone took about 0.1 s, more than half of the decoding).  The young
    generations are collected first: objects moved this way are not counted towards the
    next full collection, so garbage moved with them would stay until then (recovering
    thousands of small queues in a crash campaign ran out of memory that way — hence
    also only for large states).  Promotion is skipped if the application keeps frozen
    objects of its own (``gc.freeze``, e.g. before forking): unfreezing would hand them
    back to the collector.  Nested use only counts at the outermost level."""
    if not gc.isenabled():
        yield
        return
    if promote:
        gc.collect(1)  # young garbage is not promoted with what we build
    gc.disable()
    try:
        yield
    finally:
        if promote and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()


class TaskTable(MutableMapping[str, Task]):
    """The queue's tasks by id, in insertion order: a ``dict[str, Task]`` to its users.

    Tasks recovered from a snapshot in a terminal status stay their decoded snapshot row
    until something reads them; then the row becomes a ``Task``, in place and once (every
    later read gets the same object).  Every task not in a terminal status is always a
    ``Task`` already (``loaded``), so scheduling, leases and retention never load history.
    """

    __slots__ = ("_map", "_rows", "_meta", "history")

    def __init__(self) -> None:
        # a Task, or the index of its row in _rows/_meta (not loaded yet: terminal)
        self._map: dict[str, Task | int] = {}
        self._rows: Sequence[Sequence[Any]] = ()
        self._meta: Sequence[Any] = ()
        # terminal tasks moved to history segments (straw.queue.history): looked up on demand,
        # never loaded at recovery; a task id is in _map or in history, never both
        self.history: History | None = None

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]], meta: Sequence[Any]
                  ) -> tuple[TaskTable, list[Task]]:
        """A table over snapshot rows (``to_snapshot_rows``) and their metadata; also
        returns the tasks not in a terminal status (loaded), in order."""
        if len(meta) != len(rows):
            raise CorruptData(f"queue snapshot: {len(rows)} task rows but {len(meta)} "
                              "metadata entries")
        if any(n not in (TASK_ROW_FIELDS, _OLD_TASK_ROW_FIELDS) for n in set(map(len, rows))):
            raise CorruptData(f"queue snapshot: task rows must have {TASK_ROW_FIELDS} fields")
        table = cls()
        ids = list(map(operator.itemgetter(0), rows))
        table._map = dict(zip(ids, range(len(rows)), strict=True))
        if len(table._map) != len(rows):
            raise CorruptData("queue snapshot: a task id appears twice")
        table._rows, table._meta = rows, meta
        # the rows not in a terminal status, found without a Python loop over history
        live = itertools.compress(range(len(rows)), map(operator.not_, map(
            TERMINAL.__contains__, map(operator.itemgetter(STATUS_COLUMN), rows))))
        return table, [table._load(ids[i], i) for i in live]

    def _load(self, task_id: str, i: int) -> Task:
        task = Task(*self._rows[i])
        task.metadata = self._meta[i]
        task.control = bool(task.control)  # an older journal's default lane was None
        self._map[task_id] = task
        return task

    def _from_history(self, task_id: str) -> Task | None:
        """A terminal task kept in a history segment, as a fresh ``Task`` (it never
        changes again, so a new object per read is indistinguishable)."""
        if self.history is None:
            return None
        v = self.history.get("t", task_id)
        if v is _HMISSING:
            return None
        return task_from_history(v)

    def _load_all(self) -> None:
        if self._rows:
            for task_id, i in [kv for kv in self._map.items() if isinstance(kv[1], int)]:
                self._load(task_id, cast(int, i))
            self._rows = self._meta = ()

    def status_counts(self) -> Counter[str]:
        """How many tasks are in each status, without loading history (an unloaded row is
        terminal: its status cannot change before it is loaded)."""
        rows = self._rows
        out = Counter(rows[v][STATUS_COLUMN] if isinstance(v, int) else v.status
                      for v in self._map.values())
        if self.history is not None:
            out.update(self.history.status)
        return out

    def __getitem__(self, task_id: str) -> Task:
        v = self._map.get(task_id, _MISSING)
        if v is _MISSING:
            task = self._from_history(task_id)
            if task is None:
                raise KeyError(task_id)
            return task
        return self._load(task_id, v) if isinstance(v, int) else v

    def get(self, task_id: str, default: Any = None) -> Any:
        v = self._map.get(task_id, _MISSING)
        if v is _MISSING:
            task = self._from_history(task_id)
            return default if task is None else task
        return self._load(task_id, v) if isinstance(v, int) else v

    def __contains__(self, task_id: object) -> bool:
        if task_id in self._map:
            return True
        return (isinstance(task_id, str) and self.history is not None
                and self.history.get("t", task_id) is not _HMISSING)

    def __setitem__(self, task_id: str, task: Task) -> None:
        self._map[task_id] = task

    def __delitem__(self, task_id: str) -> None:
        del self._map[task_id]

    def __len__(self) -> int:
        return len(self._map) + (0 if self.history is None else self.history.counts["t"])

    def __iter__(self) -> Iterator[str]:
        """History first (in task id order), then the tasks of the live state."""
        if self.history is not None:
            yield from (k for k, _ in self.history.items("t"))
        yield from self._map

    def values(self) -> ValuesView[Task]:
        self._load_all()
        if self.history is not None:  # reads every history segment (inspection only)
            return cast(ValuesView[Task], dict(self.items()).values())
        return cast(ValuesView[Task], self._map.values())

    def items(self) -> ItemsView[str, Task]:
        self._load_all()
        if self.history is not None:  # reads every history segment (inspection only)
            hist = {k: task_from_history(v) for k, v in self.history.items("t")}
            return cast(ItemsView[str, Task], {**hist, **self._map}.items())
        return cast(ItemsView[str, Task], self._map.items())

    def terminal(self) -> list[tuple[str, Any]]:
        """(task id, history value) of every terminal task of the live state: what the
        next history segment takes (``history_value``)."""
        out = []
        for tid, v in self._map.items():
            if isinstance(v, int):
                row, meta = self._rows[v], self._meta[v]
                out.append((tid, [list(row), meta]))
            elif v.status in TERMINAL:
                out.append((tid, history_value(v)))
        return out

    def forget(self, task_ids: Iterable[str]) -> None:
        """Drop tasks now held by a durable history segment."""
        for tid in task_ids:
            del self._map[tid]
        if self._rows and not any(isinstance(v, int) for v in self._map.values()):
            self._rows = self._meta = ()

    def loaded_task(self, task_id: str) -> Task | None:
        """The task if it is a loaded ``Task`` of the live state (every non-terminal task
        is), else None: nothing is loaded or read from history."""
        v = self._map.get(task_id)
        return v if isinstance(v, Task) else None

    def loaded(self) -> Iterator[Task]:
        """The tasks that are ``Task`` objects: every non-terminal one (and terminal ones
        read since recovery), without loading anything."""
        for v in self._map.values():
            if not isinstance(v, int):
                yield v

    def to_snapshot_rows(self) -> tuple[list[Sequence[Any]], list[Any]]:
        """(rows, metadata) in order; rows not loaded are written back as they were read."""
        rows: list[Sequence[Any]] = []
        meta: list[Any] = []
        for v in self._map.values():
            if isinstance(v, int):
                rows.append(self._rows[v])
                meta.append(self._meta[v])
            else:
                rows.append((v.task_id, v.input, None, v.priority, v.key, v.max_attempts,
                             v.control, v.fifo, v.status, v.attempt, v.failures, v.lease,
                             v.position, v.last_error, v.allow_empty, v.estimates))
                meta.append(v.metadata)
        return rows, meta

    def __repr__(self) -> str:
        return f"TaskTable({len(self._map)} tasks)"


def history_value(task: Task) -> list[Any]:
    """A terminal task as a history segment stores it: [its snapshot row, metadata]."""
    return [[task.task_id, task.input, None, task.priority, task.key, task.max_attempts,
             task.control, task.fifo, task.status, task.attempt, task.failures, task.lease,
             task.position, task.last_error, task.allow_empty, task.estimates],
            task.metadata]


def task_from_history(value: Sequence[Any]) -> Task:
    """The ``Task`` of a history value (decoded with lists: references become tuples
    again, user JSON keeps its lists)."""
    try:
        row, meta = value
        task = Task(*row)
    except (TypeError, ValueError) as e:
        raise CorruptData(f"queue history: a task entry does not have the fields of a task "
                          f"({e})") from None
    task.metadata = meta
    task.control = bool(task.control)
    task.input = tuple_or_none(task.input)
    task.lease = tuple_or_none(task.lease)
    task.estimates = tuple(task.estimates)  # type: ignore[assignment]
    return task


def tuple_or_none(ref: Sequence[Any] | None) -> Any:
    """A reference row (or a lease) decoded as a list, as the tuple the state holds."""
    return tuple(ref) if ref else None
