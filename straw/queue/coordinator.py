"""``Coordinator``: the single writer of one queue's journal.

Callers import it as ``straw.coordinator`` (the same module, aliased there).

The coordinator is assembled from one class per concern in this package (see its
docstring): the commit pipeline and retention (``pipeline``, D2), epochs,
recovery and fencing (``epochs``, D8, D9), leases and readers (``leases``, Q3, D5),
completions (``completions``, D7), consumers, batches and checkpoints, and the views.
This class opens the queue and holds the other task calls: each checks its arguments,
then runs the commit pipeline with its decision.

Argument checks raise ``TypeError`` or ``ValueError`` naming the argument
(``straw.checks``, ``straw.queue.checks``): everything the journal stores as an integer
(priorities, scheduling keys, attempts, cursors, tokens, counts) is range-checked to 64
bits and refuses bools, and metadata is checked JSON (``canonical_metadata``), all before
anything is adopted or journaled.

Leases carry the epoch; deadlines are in memory (recovery revokes all leases anyway).
Expired leases are journaled as ``expire`` when noticed (acquire, heartbeat, complete).

Fork safety (``straw.process``).  A coordinator belongs to the process that opened it: its
epoch lock, its journal and its in-memory queue state are the parent's after a fork (the
child's copy of the lock descriptor shares the parent's open file description: it would
not keep the child out, and its unlock would release the parent's lock).  In a forked
child every method, ``close()`` too, raises ``ForkedProcess`` before taking any lock
(``__exit__`` there does not raise; ``straw.process``).  Opening a coordinator in a child on a
store the child inherited is refused before anything is created (a new epoch file would
fence the parent).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..checks import check_count, check_int, check_seconds, check_u64, short_repr
from ..clock import Clock
from ..errors import (
    IdempotencyConflict,
    ResourceLimitExceeded,
    StorageUnavailable,
    UnsafeRecovery,
)
from ..pool.ref_forms import ref_identity
from ..pool.refs import NAME_RE, RecordSetRef, record_sets_in
from ..pool.store import SharedFilesystemStore
from ..process import OPEN_QUEUE_IN_CHILD
from ..protocol import (
    Lease,
    Limits,
    TaskSpec,
    unenforced,
)
from ..siblings import DEFAULT_GROUP_WAIT
from . import rules
from .checks import check_id as _check_id
from .checks import check_int64 as _check_int64
from .checks import check_lease_fields as _check_lease_fields
from .checks import digest as _digest
from .checks import ref_tuple as _ref_tuple
from .completions import QueueCompletions
from .epochs import queue_dir
from .ids import check_queue_id
from .marker import QueueMarker
from .names import QueueNames
from .replay import read_state, replay
from .tasks import PENDING
from .views import QueueViews

DEFAULT_CONSUMER = "training"


class _CallableClock:
    """A straw-queue clock (a callable returning seconds, ``time.monotonic`` by default) as
    a ``Clock``; it is itself callable, like the clock straw-queue's coordinator exposes."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn = fn

    def now(self) -> float:
        return float(self._fn())

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def __call__(self) -> float:
        return self.now()


# namespace=False/True (straw-queue) name these namespaces; a str names its own
NAMESPACE_FALSE = "default"
NAMESPACE_TRUE = "namespaced"


def _checked_identity(store: object, queue_id: object, namespace: object,
                      exclusive_owner: object) -> str:
    """The store, queue id, namespace (returned as its name) and ``exclusive_owner``
    checked, before anything is created."""
    if not isinstance(store, SharedFilesystemStore):
        raise TypeError(f"store must be a SharedFilesystemStore, got {type(store).__name__}")
    store._check_process()  # an inherited store: refused before any epoch is created
    if isinstance(namespace, bool):
        namespace = NAMESPACE_TRUE if namespace else NAMESPACE_FALSE
    if exclusive_owner is not None and (not isinstance(exclusive_owner, str)
                                        or not exclusive_owner.strip()):
        # straw-queue's class for a missing single-owner guarantee (None is ours: the
        # epoch lock enforces exclusivity without a description)
        raise UnsafeRecovery(f"exclusive_owner {short_repr(exclusive_owner)} must "
                             "describe, in a non-empty str, what makes this the queue's "
                             "only coordinator (or leave it out)")
    check_queue_id(queue_id)
    if not isinstance(namespace, str) or not NAME_RE.match(namespace):
        raise ValueError(f"namespace {short_repr(namespace)} must be 1-128 letters, "
                         "digits, '.', '_' or '-'")
    return namespace


def _check_settings(*, lease_seconds: object, group_wait: object, snapshot_every: object,
                    segment_target_bytes: object, consumer_id: object, limits: object,
                    enforce_limits: object, recovery_spends_budget: object) -> None:
    """The coordinator's tuning arguments checked (``TypeError``/``ValueError`` naming
    the argument)."""
    check_seconds("lease_seconds", lease_seconds, positive=True)
    check_seconds("group_wait", group_wait, positive=False)
    check_count("snapshot_every", snapshot_every, minimum=1)
    check_count("segment_target_bytes", segment_target_bytes, minimum=1)
    _check_id("consumer_id", consumer_id)
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a straw Limits, got {type(limits).__name__}")
    for flag, setting in (("enforce_limits", enforce_limits),
                          ("recovery_spends_budget", recovery_spends_budget)):
        if not isinstance(setting, bool):
            raise TypeError(f"{flag} must be a bool, got {type(setting).__name__}")


class Coordinator(QueueCompletions, QueueViews):
    """The coordinator of queue ``queue_id`` in ``namespace`` of ``store``'s pool.

    straw-queue 0.1.6's constructor: ``namespace`` False (the run's default namespace) or
    True (a namespace of its own, beside the default one), or the name of a namespace;
    ``exclusive_owner`` describes the external guarantee that this is the queue's only
    coordinator (recorded with the epoch lock: a second coordinator's error quotes it; the
    lock itself enforces exclusivity either way); ``clock`` is a callable returning seconds
    (it times lease deadlines, which live in memory) or a ``straw.clock.Clock`` (then it
    also stamps the journal).  straw's additions: ``takeover`` (fence a paused holder),
    ``consumer_id``, ``snapshot_every``, ``segment_target_bytes``, ``group_wait``,
    ``recovery_spends_budget``.

    A recovery (``recover=True``, ``takeover=True``) revokes every lease of the older
    epoch.  With ``recovery_spends_budget`` (the default, straw-queue's rule) each
    revocation spends one unit of its task's ``max_attempts``, like an expiry: a leased
    attempt was made, so ``max_attempts=1`` means at most one, and a task leased across
    ``max_attempts`` coordinator crashes ends ``failed``.  ``False`` returns revoked tasks
    to pending unspent (the rollout layer's choice: a job preempted every day must not
    fail its in-flight prompts).  The policy is journaled with the new epoch (spec Q6)."""

    _process_state = "its epoch lock, journal and queue state"
    _process_remedy = OPEN_QUEUE_IN_CHILD

    def __init__(
        self,
        store: SharedFilesystemStore,
        *,
        queue_id: str = "rollout",
        namespace: bool | str = False,
        exclusive_owner: str | None = None,
        recover: bool = False,
        limits: Limits | None = None,
        lease_seconds: float = 300,
        clock: Clock | Callable[[], float] | None = None,
        takeover: bool = False,
        consumer_id: str = DEFAULT_CONSUMER,
        # a recovery replays at most this many transactions after the snapshot: more
        # makes an open slower, fewer makes snapshots (which move history) more frequent
        snapshot_every: int = 5_000,
        segment_target_bytes: int = 64 << 20,
        group_wait: float = DEFAULT_GROUP_WAIT,
        enforce_limits: bool = False,
        recovery_spends_budget: bool = True,
    ) -> None:
        self._bind_process()
        namespace = _checked_identity(store, queue_id, namespace, exclusive_owner)
        _check_settings(lease_seconds=lease_seconds, group_wait=group_wait,
                        snapshot_every=snapshot_every,
                        segment_target_bytes=segment_target_bytes, consumer_id=consumer_id,
                        limits=limits, enforce_limits=enforce_limits,
                        recovery_spends_budget=recovery_spends_budget)
        self.recovery_spends_budget = recovery_spends_budget
        self._set_identity(store, queue_id, namespace, exclusive_owner)
        self.lease_seconds = float(lease_seconds)
        self._set_clock(store, clock)
        self._set_limits(limits, enforce_limits)
        self.consumer_id = consumer_id
        self.snapshot_every = snapshot_every
        self.segment_target_bytes = segment_target_bytes
        self.group_wait = group_wait
        self._init_pipeline()
        self._start(recover, takeover)

    def _set_identity(self, store: SharedFilesystemStore, queue_id: str, namespace: str,
                      exclusive_owner: str | None) -> None:
        """The queue's identity: its store, owner, derived names and directories."""
        self.store = store
        self.fs = store.fs
        self.queue_id = queue_id
        self.namespace = namespace
        self.owner = f"queue:{namespace}/{queue_id}"
        self._names = QueueNames(store.run_id, namespace, queue_id)  # derived names
        self.exclusive_owner = exclusive_owner
        self.dir = queue_dir(store.root, store.run_id, namespace, queue_id)
        self.epochs_dir = os.path.join(self.dir, "epochs")
        self.journal_dir = os.path.join(self.dir, "journal")
        self.history_dir = os.path.join(self.dir, "history")
        # straw-queue's ``queues/<digest>/run.json``, which its callers probe (``marker``)
        self._marker = (QueueMarker(self.fs, store.root, run_id=store.run_id,
                                    queue_id=queue_id, namespace=namespace)
                        if namespace == NAMESPACE_TRUE else None)

    def _set_clock(self, store: SharedFilesystemStore,
                   clock: Clock | Callable[[], float] | None) -> None:
        """Deadlines follow the caller's clock; the journal and lock stamps a wall clock."""
        if clock is None:
            self.clock: Clock = store.clock
            self._wall: Clock = store.clock
        elif hasattr(clock, "now"):
            self.clock = self._wall = clock  # type: ignore[assignment]
        elif callable(clock):
            self.clock, self._wall = _CallableClock(clock), store.clock
        else:
            raise TypeError(f"clock must be a callable returning seconds or a straw Clock, "
                            f"got {type(clock).__name__}")

    def _set_limits(self, limits: Limits | None, enforce_limits: bool) -> None:
        """straw-queue 0.1.6 keeps Limits as fields that reject and throttle nothing, and its
        callers pass small values relying on that: its fields are enforced only with
        ``enforce_limits=True`` (ours, an addition); otherwise they are carried
        (``limits``).  straw's own bounds are enforced either way (``protocol.unenforced``)."""
        self.limits = limits or Limits()
        self._bounds = self.limits if enforce_limits else unenforced(self.limits)
        self._enforce_limits = enforce_limits

    # --- tasks --------------------------------------------------------------------------
    def submit_tasks(self, request_id: str, tasks: Sequence[TaskSpec], *,
                     producer_id: str | None = None,
                     producer_state: Mapping[str, Any] | None = None) -> list[str]:
        """Submit tasks atomically; returns their ids.  A retry with the same
        ``request_id`` and content returns the original ids; different content raises
        ``IdempotencyConflict`` (so does a task id another request submitted).
        ``producer_state`` (small JSON, ``producer_state(producer_id)`` reads it back) is
        saved in the same journal transaction: a producer's cursor advances exactly when
        its tasks exist."""
        self._check_process()
        _check_id("request_id", request_id)
        if isinstance(tasks, TaskSpec) or not isinstance(tasks, Sequence):
            raise TypeError("tasks must be a list of TaskSpec")
        if len(tasks) > self._bounds.max_tasks_per_request:
            raise ResourceLimitExceeded(
                f"{len(tasks)} tasks in one request; the limit is "
                f"{self.limits.max_tasks_per_request} (Limits.max_tasks_per_request)")
        rows = []
        seen: set[str] = set()
        for i, spec in enumerate(tasks):
            rows.append(self._task_row(f"tasks[{i}]", spec, seen))
        producer = None
        # references in a producer's state (its continuation: a cursor's record, an RNG
        # state) are queue roots while the state is the producer's latest, as a consumer's
        # state_ref is (straw-queue keeps them too); retained before the journal (D2)
        held: list[RecordSetRef] = []
        if producer_id is not None:
            _check_id("producer_id", producer_id)
            plain, found = record_sets_in(producer_state or {})
            held = [self._check_ref(r, "producer_state reference") for r in found]
            producer = [producer_id, self._meta(plain, "producer_state")]
        elif producer_state is not None:
            raise ValueError("producer_state needs a producer_id to be saved under")
        digest = _digest(["submit", rows, producer])
        with self._mutex:
            self._check_usable()
            known = self._known(request_id, digest, "submit")
        if known is not None:
            return list(self._replayed(known))
        adopted = self._adopt([self._check_ref(t.input_ref, "input_ref") for t in tasks
                               if t.input_ref is not None] + held)
        try:
            with self._mutex:
                self._check_usable()
                decision = rules.submit(self.state, self.owner, request_id, digest, rows,
                                        producer, draining=self._draining, bounds=self._bounds,
                                        limits=self.limits)
                seq = self._commit_decision(decision)
        finally:
            self._done_adopting(adopted)
        return self._reply(decision, seq, adopted)

    def _task_row(self, w: str, spec: object, seen: set[str]) -> list[Any]:
        """A TaskSpec checked and as its journal row (see ``straw.queue.state``)."""
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"{w} must be a TaskSpec, got {type(spec).__name__}")
        _check_id(f"{w}.task_id", spec.task_id)
        if spec.task_id in seen:
            raise IdempotencyConflict(f"{w}.task_id {spec.task_id!r} appears twice in the "
                                      "request; task ids are new within a queue")
        seen.add(spec.task_id)
        inp = None if spec.input_ref is None else _ref_tuple(
            self._check_ref(spec.input_ref, f"{w}.input_ref"))
        for name in ("priority", "scheduling_key"):
            _check_int64(f"{w}.{name}", getattr(spec, name))
        check_count(f"{w}.max_attempts", spec.max_attempts, minimum=1)
        for name in ("allow_empty", "control"):
            if not isinstance(getattr(spec, name), bool):
                raise TypeError(f"{w}.{name} must be a bool, got "
                                f"{type(getattr(spec, name)).__name__}")
        # unsigned 64-bit, as straw-queue's; sums of them are checked where reported
        est = [check_u64(f"{w}.estimated_{n}", getattr(spec, f"estimated_{n}"))
               for n in ("records", "bytes", "tokens")]
        if spec.control and any(est):
            raise ValueError(f"{w} is a control task: its estimated_records, estimated_bytes "
                             "and estimated_tokens must be 0 (control tasks reserve no "
                             "production)")
        return [spec.task_id, list(inp) if inp else None, self._meta(spec.metadata, w),
                spec.priority, spec.scheduling_key, spec.max_attempts, spec.control,
                spec.allow_empty, *est]

    def producer_state(self, producer_id: str) -> Any:
        """The state last saved with ``submit_tasks(..., producer_id=...)``, or None."""
        self._check_process()
        _check_id("producer_id", producer_id)
        with self._mutex:
            state = self.state.producers.get(producer_id)
        return None if state is None else json.loads(json.dumps(state))  # the caller's copy

    def fail_task(self, lease: Lease, *, request_id: str | None = None, failure: Any = None,
                  retryable: bool = True) -> str:
        """The attempt failed (``failure``: JSON describing why).  The task returns to the
        queue while its attempt budget lasts (``pending``), else, or with
        ``retryable=False``, it fails for good (``failed``); returns which.  With a
        ``request_id``, a retry after a lost reply gets the same answer."""
        self._check_process()
        request_id = self._request_id(request_id, optional=True)
        if not isinstance(retryable, bool):
            raise TypeError(f"retryable must be a bool, got {type(retryable).__name__}")
        error = self._meta({"failure": failure}, "failure")["failure"]
        lease = _check_lease_fields(lease, "lease")
        digest = _digest(["fail", lease.task_id, lease.generation, lease.attempt_id, error,
                          retryable])
        with self._mutex:
            self._check_usable()
            decision = rules.fail(self.state, self._names, lease, request_id, digest, error,
                                  retryable, self._epoch, self.clock.now(), self._deadlines)
            seq = self._commit_decision(decision, [lease.task_id])
        return self._reply(decision, seq)

    def yield_task(self, lease: Lease, *, request_id: str,
                   input_ref: RecordSetRef | None) -> str:
        """``yield_tasks`` of one lease: the task returns to pending with ``input_ref``."""
        self._check_process()
        return self.yield_tasks([{"lease": lease, "input_ref": input_ref}],
                                request_id=request_id)

    def yield_tasks(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        """Return leased tasks with continuation inputs, atomically for the batch, without
        spending a retry; returns ``pending``.  Each update: ``lease``, ``input_ref`` (None
        keeps the input), and optionally ``priority``, ``scheduling_key``, ``metadata``.
        A stale lease refuses the whole batch; a retry of the same request returns the
        same answer."""
        self._check_process()
        _check_id("request_id", request_id)
        rows = []
        for i, u in self._updates(updates):
            w = f"updates[{i}]"
            lease = _check_lease_fields(u.get("lease"), f"{w}['lease']")
            inp = u.get("input_ref")
            ref = None if inp is None else self._check_ref(inp, f"{w}['input_ref']")
            # everything that enters the digest is checked first (no OverflowError there)
            prio, key, meta = u.get("priority"), u.get("scheduling_key"), u.get("metadata")
            for name, v in (("priority", prio), ("scheduling_key", key)):
                if v is not None:
                    check_int(f"{w}[{name!r}]", v)
            meta = None if meta is None else self._meta(meta, w)
            rows.append((lease, ref, prio, key, meta))
        digest = _digest(["yield", [[r[0].task_id, r[0].generation, r[0].attempt_id,
                                     list(ref_identity(_ref_tuple(r[1]))) if r[1] else None,
                                     r[2], r[3], r[4]]
                                    for r in rows]])
        with self._mutex:
            self._check_usable()
            known = self._known(request_id, digest, "yield")
        if known is not None:
            self._replayed(known)
            return PENDING
        adopted = self._adopt([r[1] for r in rows if r[1] is not None])
        try:
            with self._mutex:
                self._check_usable()
                decision = rules.yield_tasks(self.state, self._names, rows, request_id, digest,
                                             self._epoch, self.clock.now(), self._deadlines)
                ended = [] if decision.txn is None else [r[0] for r in decision.txn["updates"]]
                seq = self._commit_decision(decision, ended)
        finally:
            self._done_adopting(adopted)
        return self._reply(decision, seq, adopted)

    def _updates(self, updates: object) -> list[tuple[int, Mapping[str, Any]]]:
        if isinstance(updates, (Mapping, str, bytes)) or not isinstance(updates, Sequence):
            raise TypeError("updates must be a list of dicts with 'lease' and 'input_ref'")
        if not updates:
            raise ValueError("updates is empty: give at least one lease")
        for i, u in enumerate(updates):
            if not isinstance(u, Mapping):
                raise TypeError(f"updates[{i}] must be a dict, got {type(u).__name__}")
        return list(enumerate(updates))

    def save_task_progress(self, lease: Lease, *, request_id: str,
                           input_ref: RecordSetRef) -> str:
        """``save_task_progress_many`` of one lease."""
        self._check_process()
        return self.save_task_progress_many([{"lease": lease, "input_ref": input_ref}],
                                            request_id=request_id)

    def save_task_progress_many(self, updates: Sequence[Mapping[str, Any]], *,
                                request_id: str) -> str:
        """Make each update's ``input_ref`` (a continuation) the input of its leased task,
        atomically for the batch, keeping the leases (``yield_tasks`` ends them); returns
        ``saved``.  A later attempt (after expiry, failure or recovery) starts from it.
        What the worker read before stays protected until its attempt ends (D5)."""
        self._check_process()
        _check_id("request_id", request_id)
        rows = []
        for i, u in self._updates(updates):
            w = f"updates[{i}]"
            lease = _check_lease_fields(u.get("lease"), f"{w}['lease']")
            rows.append((lease, self._check_ref(u.get("input_ref"), f"{w}['input_ref']")))
        digest = _digest(["progress", [[le.task_id, le.generation, le.attempt_id,
                                        list(_ref_tuple(r))] for le, r in rows]])
        with self._mutex:
            self._check_usable()
            known = self._known(request_id, digest, "save_task_progress")
        if known is not None:
            return self._replayed(known)[0]
        adopted = self._adopt([r for _, r in rows])
        try:
            with self._mutex:
                self._check_usable()
                decision = rules.save_progress(self.state, self._names, rows, request_id,
                                               digest, self._epoch, self.clock.now(),
                                               self._deadlines)
                seq = self._commit_decision(decision)
        finally:
            self._done_adopting(adopted)
        return self._reply(decision, seq, adopted)

    def release_tasks(self, leases: Sequence[Lease], *,
                      request_id: str | None = None) -> list[str]:
        """Give leased tasks back unfinished, without spending a retry.  One outcome per
        lease: ``released``, or ``StaleAttempt`` for a lease that is no longer current
        (nothing to give back).  With a ``request_id`` a retry gets the same answer."""
        self._check_process()
        request_id = self._request_id(request_id, optional=True)
        if isinstance(leases, (Lease, Mapping)) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        leases = [_check_lease_fields(le, f"leases[{i}]") for i, le in enumerate(leases)]
        digest = _digest(["release", [[le.task_id, le.generation, le.attempt_id]
                                      for le in leases]])
        with self._mutex:
            self._check_usable()
            decision = rules.release_leases(self.state, self._names, leases, request_id,
                                            digest, self._epoch)
            ended = [] if decision.txn is None else [r[0] for r in decision.txn["leases"]]
            seq = self._commit_decision(decision, ended)
        return self._reply(decision, seq)

    def cancel_task(self, task_id: str, *, request_id: str | None = None) -> str:
        """Cancel a pending or leased task (its lease can no longer commit; a reader keeps
        its protection, D5); returns ``cancelled``.  ``ValueError`` for an unknown or
        terminal task, except for a retry of the same request."""
        self._check_process()
        request_id = self._request_id(request_id, optional=True)
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        digest = _digest(["cancel", task_id])
        with self._mutex:
            self._check_usable()
            decision = rules.cancel(self.state, self.owner, task_id, request_id, digest)
            seq = self._commit_decision(decision, [task_id])
        return self._reply(decision, seq)

    def seal_input(self, request_id: str | None = None) -> str:
        """No more submissions: ``acquire`` answers ``end_of_input`` once all are done.
        Idempotent (a retry, under any request id, answers ``sealed``)."""
        self._check_process()
        self._request_id(request_id, optional=True)
        with self._mutex:
            self._check_usable()
            decision = rules.seal(self.state)
            seq = self._commit_decision(decision)
        self._wait(self._last_seq if seq is None else seq)
        return decision.reply

    # --- draining, closing ---------------------------------------------------------------

    def drain(self) -> int:
        """Stop handing out and accepting tasks, in this coordinator (not journaled):
        ``acquire`` answers ``draining``, ``submit_tasks`` refuses.  Leased tasks may still
        complete.  Returns how many tasks are leased."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            self._draining = True
            return self.state.leased_count

    def close(self) -> None:
        """Stop serving (leases stay until a recovery revokes them).  Idempotent.  In a
        forked child it raises ``ForkedProcess`` and touches nothing (the epoch lock and
        the journal are the parent's; ``__exit__`` there does not raise)."""
        if self._closed:
            return
        if self._in_forked_child():
            self.journal.close()  # child-safe: closes only its copy
            self._refuse_close_in_child()
        self._closed = True
        try:
            self.journal.close()
        finally:
            self._release_lock()

    def __enter__(self) -> Coordinator:
        self._check_process()
        return self


__all__ = ["Coordinator", "StorageUnavailable", "read_state", "replay"]
