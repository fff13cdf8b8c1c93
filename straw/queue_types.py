"""The values of the queue API: what callers pass to and get from a ``Coordinator``.

All are frozen dataclasses; references inside are ``RecordSetRef``s.  Scheduling order is
priority descending, then ``scheduling_key`` ascending, then FIFO (the order in which tasks
became pending: submission, or their return after yield/release/expiry).

``Limits`` checks its fields when built and ``Lease.from_dict`` checks the dict's keys
(``TypeError``/``ValueError`` naming the field); the coordinator checks the rest when a
value is handed to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .checks import check_count
from .refs import RecordSetRef

INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class TaskSpec:
    """A task to submit.  ``input_ref`` is retained by the queue while the task (or a
    reader of it) needs it; ``metadata`` is small JSON; ``control`` is the lane the task
    is handed out in (``acquire(control=...)``; None is the default lane)."""

    task_id: str
    input_ref: RecordSetRef | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    scheduling_key: int = 0
    max_attempts: int = 3
    control: str | None = None


@dataclass(frozen=True)
class Lease:
    """The right to work on one attempt of a task, granted by coordinator ``epoch``.
    ``deadline`` is a wall-clock time (``clock.now()``); renew with ``heartbeat``."""

    queue_id: str
    task_id: str
    attempt: int
    worker_id: str
    epoch: int
    deadline: float

    def to_dict(self) -> dict[str, Any]:
        return {"queue_id": self.queue_id, "task_id": self.task_id, "attempt": self.attempt,
                "worker_id": self.worker_id, "epoch": self.epoch, "deadline": self.deadline}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Lease:
        if not isinstance(d, Mapping):
            raise TypeError(f"a Lease dict must be a mapping, got {type(d).__name__}")
        missing = [k for k in _LEASE_FIELDS if k not in d]
        if missing:
            raise ValueError(f"not a Lease dict: it lacks {', '.join(missing)} (expected the "
                             "keys of Lease.to_dict())")
        return cls(*(d[k] for k in _LEASE_FIELDS))


_LEASE_FIELDS = ("queue_id", "task_id", "attempt", "worker_id", "epoch", "deadline")


@dataclass(frozen=True)
class Assignment:
    """One acquired task: its spec (with its current input) and the lease."""

    task: TaskSpec
    lease: Lease


@dataclass(frozen=True)
class AcquireResult:
    """``status``: ``acquired`` (assignments non-empty), ``empty`` (nothing pending now),
    ``backpressured`` (a limit holds work back: retry later), ``end_of_input`` (input
    sealed and every task terminal) or ``draining`` (input sealed, nothing pending, but
    leased tasks may still come back)."""

    status: str
    assignments: tuple[Assignment, ...] = ()


@dataclass(frozen=True)
class Receipt:
    """Durable acceptance of a result: its position in the commit log."""

    queue_id: str
    task_id: str
    attempt: int
    submission_id: str
    position: int
    epoch: int
    result_ref: RecordSetRef


@dataclass(frozen=True)
class Commit:
    """One accepted result, as read back with ``read_commits``."""

    position: int
    task_id: str
    attempt: int
    submission_id: str
    result_ref: RecordSetRef
    metadata: Mapping[str, Any]


@dataclass(frozen=True)
class CommitPage:
    commits: tuple[Commit, ...]
    next_cursor: int
    end: int  # number of commits so far


@dataclass(frozen=True)
class SubmitResult:
    request_id: str
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class TaskStatus:
    task_id: str
    status: str  # pending | leased | completed | failed | cancelled
    attempt: int
    failures: int
    max_attempts: int
    lease: Lease | None
    position: int | None  # commit position when completed
    input_ref: RecordSetRef | None
    last_error: str | None


@dataclass(frozen=True)
class ReadLease:
    """A reader's protection of a task input (D5): outlives the lease; ends only with
    ``release_task_reads``, ``retire_worker`` or the reader's own completion."""

    worker_id: str
    task_id: str
    attempt: int
    input_ref: RecordSetRef


@dataclass(frozen=True)
class Limits:
    """Bounds that answer with backpressure or ``ResourceLimitExceeded``."""

    max_pending_tasks: int = 1_000_000
    max_tasks_per_request: int = 100_000
    max_leases_per_worker: int = 1024
    max_unconsumed_results: int | None = None  # acquire backpressure when the consumer lags
    max_metadata_bytes: int = 64 * 1024
    max_ready_batches: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_pending_tasks", "max_tasks_per_request", "max_leases_per_worker",
                     "max_metadata_bytes", "max_ready_batches"):
            check_count(f"Limits.{name}", getattr(self, name))
        if self.max_unconsumed_results is not None:
            check_count("Limits.max_unconsumed_results", self.max_unconsumed_results)
