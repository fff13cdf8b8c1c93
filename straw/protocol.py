"""The queue's control types: what callers pass to and get from a ``Coordinator``.

straw-queue 0.1.6's module of the same name, with its field names, order and defaults, so
that code written for it (``Lease(**asdict(lease))``, ``TaskSpec.from_dict``,
``CommitReceipt.from_dict``, ``"return:" + digest(updates)``) runs unchanged.  The values
are frozen dataclasses; references inside are ``RecordSetRef``s (``straw.refs``, re-exported
here as straw-queue does).

Scheduling order is priority descending, then ``scheduling_key`` ascending, then FIFO.

``encode``/``digest`` are canonical JSON (sorted keys, no whitespace, no NaN) and its
SHA-256: the same value gives the same digest in every process, so callers build stable
request ids from them.  Dataclasses (a ``Lease``, a ``RecordSetRef``) are encoded as their
fields.  ``decode`` refuses what ``encode`` cannot produce (``CorruptData``); it never
unpickles anything.

``Limits`` checks its fields when built; ``Lease.from_dict`` checks the dict's keys
(``TypeError``/``ValueError`` naming the field); the coordinator checks the rest when a
value is handed to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .checks import INT64_MAX, check_count
from .errors import CorruptData, ResourceLimitExceeded
from .pool.records import Publication, Record
from .pool.refs import RecordRef, RecordSetRef, SegmentRef

INT64 = (-(2**63), 2**63 - 1)


# --- canonical JSON -----------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A dataclass as the dict of its fields (recursively), everything else unchanged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON: encode takes JSON values and "
                    "dataclasses of them")


def encode(value: Any) -> bytes:
    """Canonical JSON bytes of ``value`` (sorted keys, compact, UTF-8, finite numbers)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, default=_plain).encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(value: bytes | bytearray | memoryview | str) -> Any:
    """The JSON value of ``value``; ``CorruptData`` if it is not (canonical or not) JSON."""
    try:
        if not isinstance(value, str):
            value = bytes(value).decode("utf-8")
        return json.loads(value, parse_constant=_no_constant)
    except (ValueError, UnicodeError, RecursionError) as e:
        # straw-queue's phrase first: its callers match on it
        raise CorruptData(f"Invalid JSON metadata: not valid JSON ({e})") from e


def digest(value: Any) -> str:
    """SHA-256 (hex) of ``encode(value)``: a stable identity for request ids."""
    return hashlib.sha256(encode(value)).hexdigest()


def bounded_metadata(value: Any, limit: int, *, enforce: bool = False) -> bytes:
    """``encode(value)``.  straw-queue 0.1.6 ignores ``limit`` (its callers pass small
    ones relying on that), so by default we do too; ``enforce=True`` (ours) refuses with
    ``ResourceLimitExceeded`` an encoding longer than ``limit`` bytes."""
    check_count("limit", limit, minimum=1)
    data = encode(value)
    if enforce and len(data) > limit:
        raise ResourceLimitExceeded(f"metadata is {len(data)} bytes of JSON; the limit is "
                                    f"{limit}")
    return data


# --- tasks and leases ---------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """A task to submit.

    ``input_ref`` is retained by the queue while the task (or a reader of it) needs it;
    ``metadata`` is small JSON.  ``allow_empty``: the task may complete with an empty
    result (a record set of no records); otherwise such a result is refused.
    ``estimated_*`` are the producer's estimates of the result (carried, reported in
    ``metrics()``).  ``control`` tasks form a lane of their own, handed out only by
    ``acquire(control=True)``; they estimate no production (all ``estimated_*`` zero)."""

    task_id: str
    input_ref: RecordSetRef | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    allow_empty: bool = False
    max_attempts: int = 3
    estimated_records: int = 1
    estimated_bytes: int = 0
    estimated_tokens: int = 0
    control: bool = False
    priority: int = 0
    scheduling_key: int = 0

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> TaskSpec:
        """The TaskSpec of ``dataclasses.asdict(spec)`` (or of JSON read back)."""
        if not isinstance(value, Mapping):
            raise TypeError(f"a TaskSpec dict must be a mapping, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"not a TaskSpec dict: unknown keys {', '.join(unknown)}")
        d = dict(value)
        if d.get("input_ref") is not None and not isinstance(d["input_ref"], RecordSetRef):
            d["input_ref"] = RecordSetRef.from_dict(d["input_ref"])
        return cls(**d)


@dataclass(frozen=True)
class Lease:
    """The right to work on one attempt of a task.

    ``generation`` numbers the task's attempts (1 for its first lease; every acquire
    advances it, also across coordinator epochs); ``attempt_id`` names the attempt (unique
    in the pool: use it in result metadata and in submission ids); ``coordinator_epoch``
    is the granting coordinator's epoch (a newer epoch revokes the lease: fencing);
    ``token`` binds the other fields (a lease edited by hand is not current).  Deadlines
    live in the coordinator (renew with ``heartbeat``), so a lease is a stable value:
    ``Lease(**asdict(lease)) == lease``."""

    run_id: str
    queue_id: str
    task_id: str
    attempt_id: str
    generation: int
    coordinator_epoch: str
    token: str
    worker_id: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Lease:
        if not isinstance(d, Mapping):
            raise TypeError(f"a Lease dict must be a mapping, got {type(d).__name__}")
        missing = [k for k in _LEASE_FIELDS if k not in d]
        if missing:
            raise ValueError(f"not a Lease dict: it lacks {', '.join(missing)} (expected the "
                             "keys of dataclasses.asdict(lease))")
        return cls(*(d[k] for k in _LEASE_FIELDS))


_LEASE_FIELDS = tuple(f.name for f in dataclasses.fields(Lease))


@dataclass(frozen=True)
class Assignment:
    """One acquired task: its spec (with its current input) and the lease."""

    task: TaskSpec
    lease: Lease


@dataclass(frozen=True)
class AcquireResult:
    """``status``: ``acquired`` (assignments non-empty), ``empty`` (nothing pending now),
    ``backpressured`` (a limit holds work back: retry later), ``end_of_input`` (input
    sealed and no task pending or leased) or ``draining`` (this coordinator was
    ``drain()``-ed: it hands nothing out).  With input sealed and tasks still leased the
    answer is ``empty``, as in straw-queue: a leased task may come back to pending."""

    status: str
    assignments: tuple[Assignment, ...] = ()


@dataclass(frozen=True)
class CommitReceipt:
    """Durable acceptance of a result: its position in the commit log.  ``commit_id``
    names the commit (stable across retries and recoveries); ``digest`` is the result's
    logical digest."""

    commit_id: str
    task_id: str
    submission_id: str
    digest: str
    position: int
    result_ref: RecordSetRef

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> CommitReceipt:
        if not isinstance(value, Mapping):
            raise TypeError(f"a CommitReceipt dict must be a mapping, got "
                            f"{type(value).__name__}")
        d = dict(value)
        if not isinstance(d.get("result_ref"), RecordSetRef):
            d["result_ref"] = RecordSetRef.from_dict(d["result_ref"])
        return cls(**d)


@dataclass(frozen=True)
class CommitPage:
    """Accepted results from a cursor on.  ``cursor``: where the next page starts;
    ``end_of_input``: input is sealed, every task is terminal and this page reaches the end
    of the log (no more results will ever come)."""

    commits: tuple[CommitReceipt, ...]
    cursor: int
    end_of_input: bool


# --- limits -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """Bounds that answer with backpressure or ``ResourceLimitExceeded``.  The fields
    straw-queue 0.1.6 has (``LEGACY_LIMIT_FIELDS``) are enforced by a
    ``Coordinator(..., enforce_limits=True)`` only: straw-queue keeps them for
    compatibility and enforces none, and its callers pass small values relying on that, so
    by default a coordinator carries them and enforces none either.  Enforced, they
    bound:

    - ``pending_tasks``: pending tasks in the queue (``submit_tasks`` beyond it is refused);
    - ``inflight_tasks``: leased tasks outside the control lane (``acquire`` answers
      ``backpressured`` at it); ``control_tasks``: leased control tasks, likewise;
    - ``max_result_bytes``/``max_result_tokens``: one result's payload bytes and tokens
      (``complete_task`` refuses a larger one);
    - ``metadata_bytes``: a task's (or producer state's) metadata, as canonical JSON;
    - ``accepted_records``/``accepted_bytes``/``accepted_tokens``/``ready_bytes``: checked
      and carried, not enforced (accepted history is bounded by the consumer's progress and
      retention, not by the queue).

    straw's own bounds, enforced either way: ``max_tasks_per_request``, ``max_leases_per_worker``,
    ``max_unconsumed_results`` (acquire backpressure while the designated consumer lags by
    that many results; None: off) and ``max_ready_batches``.  Defaults of the enforced
    counts are straw-queue's (a caller comparing or printing ``Limits()`` sees its
    values); enforcing them is a caller's choice, so a caller who enforces sets them."""

    pending_tasks: int = 10_000
    inflight_tasks: int = 256
    control_tasks: int = 1
    accepted_records: int = 100_000
    accepted_bytes: int = 64 * 1024**3
    accepted_tokens: int = 100_000_000
    ready_bytes: int = 64 * 1024**3
    max_result_bytes: int = 4 * 1024**3
    max_result_tokens: int = 100_000_000
    metadata_bytes: int = 256 * 1024
    max_tasks_per_request: int = 100_000
    max_leases_per_worker: int = 1_000_000
    max_unconsumed_results: int | None = None
    max_ready_batches: int = 10_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "max_unconsumed_results" and value is None:
                continue
            try:
                check_count(f"Limits.{f.name}", value, minimum=1)
            except ValueError as e:  # straw-queue's phrase first: its callers match on it
                raise ValueError(f"Queue limits must be positive: {e}") from None


# straw-queue 0.1.6's own fields (the ones its callers set): a coordinator without
# enforce_limits carries them and enforces none.  straw's additions
# (max_tasks_per_request, max_leases_per_worker, max_unconsumed_results,
# max_ready_batches) are always enforced: no straw-queue caller sets them, and a straw
# caller who sets one means it.
LEGACY_LIMIT_FIELDS = ("pending_tasks", "inflight_tasks", "control_tasks", "accepted_records",
                       "accepted_bytes", "accepted_tokens", "ready_bytes", "max_result_bytes",
                       "max_result_tokens", "metadata_bytes")


def unenforced(limits: Limits) -> Limits:
    """What a coordinator without enforce_limits checks against: ``limits`` with every
    straw-queue field at the largest the journal holds (so one code path serves both
    modes), straw's own bounds as given."""
    return dataclasses.replace(limits, **{name: INT64_MAX for name in LEGACY_LIMIT_FIELDS})


__all__ = [
    "encode", "decode", "digest", "bounded_metadata",
    "TaskSpec", "Lease", "Assignment", "AcquireResult", "CommitReceipt", "CommitPage",
    "Limits", "LEGACY_LIMIT_FIELDS", "unenforced",
    "SegmentRef", "RecordRef", "RecordSetRef", "Record", "Publication",
]
