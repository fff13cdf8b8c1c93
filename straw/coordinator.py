"""``Coordinator``: the single writer of one queue's journal (the module path callers import).

The coordinator is assembled from one class per concern in ``straw.queue`` (see its
package docstring): the commit pipeline and retention (``pipeline``, D2), epochs,
recovery and fencing (``epochs``, D8, D9), leases and readers (``leases``, Q3, D5),
consumers, batches and checkpoints, and the views.  This class holds the task calls:
each checks its arguments, then runs the commit pipeline with its decision.

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
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from .catalog import Announcement, Extent
from .catalog_roots import RootSet
from .checks import check_count, check_int, check_seconds, check_u64, short_repr
from .clock import Clock
from .errors import (
    Closed,
    Fenced,
    IdempotencyConflict,
    InvalidReference,
    ResourceLimitExceeded,
    StorageUnavailable,
    StrawError,
    UnsafeRecovery,
)
from .pack import storage_error
from .process import OPEN_QUEUE_IN_CHILD
from .protocol import (
    AcquireResult,
    Assignment,
    CommitReceipt,
    Lease,
    Limits,
    TaskSpec,
    unenforced,
)
from .queue import rules
from .queue.checks import check_id as _check_id
from .queue.checks import check_int64 as _check_int64
from .queue.checks import check_lease_fields as _check_lease_fields
from .queue.checks import digest as _digest
from .queue.checks import ref_tuple as _ref_tuple
from .queue.epochs import queue_dir
from .queue.names import QueueNames
from .queue.pipeline import _Adopted
from .queue.replay import read_state, replay
from .queue.views import QueueViews
from .queue_marker import QueueMarker
from .queue_names import check_queue_id
from .queue_state import PENDING
from .refs import (
    NAME_RE,
    RecordSetRef,
    record_sets_in,
    ref_identity,
)
from .siblings import DEFAULT_GROUP_WAIT
from .store import SharedFilesystemStore

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


class Coordinator(QueueViews):
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
        # a recovery replays at most this many transactions after the snapshot: ~30 us
        # of CPU each (5,015 cost 0.16 s), so 20,000 made a fresh open up to ~0.6 s,
        # while a snapshot moving 5,000 completions to history costs ~45 ms (issue 13)
        snapshot_every: int = 5_000,
        segment_target_bytes: int = 64 << 20,
        group_wait: float = DEFAULT_GROUP_WAIT,
        enforce_limits: bool = False,
        recovery_spends_budget: bool = True,
    ) -> None:
        self._bind_process()
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
        self.recovery_spends_budget = recovery_spends_budget
        self.store = store
        self.fs = store.fs
        self.queue_id = queue_id
        self.namespace = namespace
        self.owner = f"queue:{namespace}/{queue_id}"
        self._names = QueueNames(store.run_id, namespace, queue_id)  # derived names
        self.lease_seconds = float(lease_seconds)
        self.exclusive_owner = exclusive_owner
        # deadlines follow the caller's clock; the journal and lock stamps a wall clock
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
        self.limits = limits or Limits()
        # straw-queue 0.1.6 keeps Limits as fields that reject and throttle nothing, and its
        # callers pass small values relying on that: its fields are enforced only with
        # enforce_limits=True (ours, an addition); otherwise they are carried (``limits``).
        # straw's own bounds are enforced either way (``protocol.unenforced``).
        self._bounds = self.limits if enforce_limits else unenforced(self.limits)
        self._enforce_limits = enforce_limits
        self.consumer_id = consumer_id
        self.snapshot_every = snapshot_every
        self.segment_target_bytes = segment_target_bytes
        self.group_wait = group_wait
        self.dir = queue_dir(store.root, store.run_id, namespace, queue_id)
        self.epochs_dir = os.path.join(self.dir, "epochs")
        self.journal_dir = os.path.join(self.dir, "journal")
        self.history_dir = os.path.join(self.dir, "history")
        # straw-queue's ``queues/<digest>/run.json``, which its callers probe (queue_marker)
        self._marker = (QueueMarker(self.fs, store.root, run_id=store.run_id,
                                    queue_id=queue_id, namespace=namespace)
                        if namespace == NAMESPACE_TRUE else None)
        self._mutex = threading.RLock()
        self._deadlines: dict[str, float] = {}
        self._rooted = RootSet()  # the queue owner's roots as this coordinator knows them
        self._adding: Counter[Extent] = Counter()
        # adopted extents whose staging (and their dependencies', SPEC
        # release_publications) the next collection drops (``_Adopted``)
        self._unstage: _Adopted = {}
        # (retirement cursor, commits, sparse) of a recovered journal whose results'
        # staging the next collection drops (see _open)
        self._recovered_results: tuple[int, int, frozenset[int]] | None = None
        self._broken: BaseException | None = None
        self._closed = False
        self._last_seq = 0
        self._seq_commits: dict[int, int] = {}
        self._durable_commits = 0
        self._since_snapshot = 0
        self.snapshot_failures = 0
        # consumer id -> (token, exclusive owner): this process's open consumers
        self._consumer_owners: dict[str, tuple[str, str]] = {}
        self._draining = False  # drain(): no more acquisitions or submissions here
        self._complete_seconds: deque[float] = deque(maxlen=1024)
        self._cpu_started = time.process_time()
        self.recovery_seconds = 0.0
        self._refuse_legacy_layout()
        try:
            self.fs.makedirs_durable(self.epochs_dir)
            self.fs.makedirs_durable(self.journal_dir)
        except OSError as e:
            raise storage_error(e, f"cannot create queue directory {self.dir}") from e
        self._lock_fd: int | None = None
        self._fence_path: tuple[int, str] | None = None  # (epoch, the next epoch's file)
        try:
            self._open(recover, takeover)
        except BaseException:
            self._release_lock()
            raise

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
        """A TaskSpec checked and as its journal row (see ``straw.queue_state``)."""
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

    def acquire(self, worker_id: str, max_tasks: int = 1, *,
                task_ids: Sequence[str] | None = None, task_prefix: str | None = None,
                control: bool = False) -> AcquireResult:
        """Lease up to ``max_tasks`` pending tasks of the default lane (of the control lane
        with ``control=True``) in scheduling order; ``task_ids`` is a set filter (repeated,
        unknown or non-pending ids are skipped), ``task_prefix`` another."""
        self._check_process()
        _check_id("worker_id", worker_id)
        check_count("max_tasks", max_tasks, minimum=1)
        if task_prefix is not None and not isinstance(task_prefix, str):
            raise TypeError(f"task_prefix must be None or a str, got {type(task_prefix).__name__}")
        if isinstance(task_ids, (str, bytes)):  # a str would lease its characters
            raise TypeError("task_ids must be a list of task ids, not one str")
        if not isinstance(control, bool):
            raise TypeError(f"control must be a bool, got {type(control).__name__}")
        with self.journal.incoming(), self._mutex:
            self._check_usable()
            last = self._expire_due()
            status, chosen, grant = self._grant_locked(worker_id, max_tasks, task_ids,
                                                       task_prefix, control)
            if grant is not None:
                last = self._enqueue(grant)
            out = self._assigned(chosen)
        if last is not None:
            self._wait(last)
        return AcquireResult(status, out)

    def _grant_locked(self, worker_id: str, max_tasks: int, task_ids: Sequence[str] | None,
                      task_prefix: str | None, control: bool
                      ) -> tuple[str, list[Any], dict[str, Any] | None]:
        """acquire's choice (mutex held, expiries journaled; ``rules.acquire``): (status,
        the tasks chosen, the lease transaction granting them — for the caller to
        enqueue — or None)."""
        return rules.acquire(self.state, worker_id, max_tasks, task_ids, task_prefix, control,
                             leased=self._deadlines, draining=self._draining,
                             bounds=self._bounds, consumer_id=self.consumer_id,
                             epoch=self._epoch)

    def _assigned(self, chosen: list[Any]) -> tuple[Assignment, ...]:
        """The assignments of tasks just leased (mutex held, lease applied): their
        deadlines start now."""
        deadline = self.clock.now() + self.lease_seconds
        for t in chosen:
            self._deadlines[t.task_id] = deadline
        return tuple(Assignment(self._spec_of(t), self._lease_of(t)) for t in chosen)

    def heartbeat(self, leases: Sequence[Lease]) -> list[str]:
        """Renew leases.  One outcome per lease, in order: ``extended`` (its deadline moved
        on), ``LeaseExpired`` (its deadline had passed: it can no longer commit) or
        ``StaleAttempt`` (it is not current: completed, re-leased, cancelled, or of an older
        coordinator epoch).  ``Fenced`` if this coordinator is no longer the queue's."""
        self._check_process()
        if isinstance(leases, (Lease, Mapping)) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        leases = [_check_lease_fields(le, f"leases[{i}]") for i, le in enumerate(leases)]
        try:
            self._fence_check()  # a fenced coordinator must not keep workers busy
        except Fenced as e:
            self._fail(e)
        with self._mutex:
            self._check_usable()
            now = self.clock.now()
            out = rules.heartbeat(self.state, self._names, leases, self._epoch, now,
                                  self._deadlines)
            deadline = now + self.lease_seconds
            for lease, outcome in zip(leases, out, strict=True):
                if outcome == "extended":
                    self._deadlines[lease.task_id] = deadline
        return out

    def complete_task(self, lease: Lease, *, submission_id: str, result_ref: RecordSetRef,
                      result_digest: str | None = None) -> CommitReceipt:
        """Accept the result of a leased attempt, exactly once (receipt).  A retry with the
        same ``submission_id`` and result returns the original receipt, even after the
        lease ended; different content raises ``IdempotencyConflict``.  The result's
        records must name the lease in their metadata (``task_id``, ``attempt_id``); a
        result of no records is accepted only for a task submitted with
        ``allow_empty=True``.  ``InvalidReference`` if the result is not the attempt's or
        ``result_digest`` is not the reference's digest."""
        self._check_process()
        lease, ref, key = self._completion_args(lease, submission_id, result_ref,
                                                result_digest)
        # siblings: announced to the catalog and the journal, so that concurrent
        # completions share one catalog fsync and one journal sync (group commit)
        started = time.perf_counter()
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, done, adopted, _ = self._complete(lease, submission_id, ref, key, announced)
        self._wait(seq, adopted)
        if done is not None:
            return done
        self._complete_seconds.append(time.perf_counter() - started)
        return self._receipt(self.state.submissions[submission_id])

    def complete_and_acquire(self, lease: Lease, *, submission_id: str,
                             result_ref: RecordSetRef, result_digest: str | None = None,
                             max_tasks: int = 1, control: bool = False
                             ) -> tuple[CommitReceipt, AcquireResult]:
        """straw's addition (straw-queue has no such call): ``complete_task`` and then
        ``acquire(lease.worker_id, max_tasks, control=control)`` in ONE journal transaction,
        so a worker's loop pays one durable step per task instead of two.  Returns
        (receipt, acquire result).  The completion is checked exactly as by
        ``complete_task`` (and raises as it does, leasing nothing); the commit and the
        grant are one journal frame: a crash keeps both or neither.  A retry of an accepted
        ``submission_id`` returns the original receipt with a plain ``acquire``: a task
        granted with a reply that was lost stays leased until its deadline passes (the
        worker never saw that lease), then returns to the queue as any expired lease."""
        self._check_process()
        lease, ref, key = self._completion_args(lease, submission_id, result_ref,
                                                result_digest)
        check_count("max_tasks", max_tasks, minimum=1)
        if not isinstance(control, bool):
            raise TypeError(f"control must be a bool, got {type(control).__name__}")
        started = time.perf_counter()
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, done, adopted, got = self._complete(lease, submission_id, ref, key, announced,
                                                     then_acquire=(max_tasks, control))
        self._wait(seq, adopted)
        if done is not None:  # a retry: its grant (if any) was never seen; lease anew
            return done, self.acquire(lease.worker_id, max_tasks, control=control)
        self._complete_seconds.append(time.perf_counter() - started)
        assert got is not None
        return self._receipt(self.state.submissions[submission_id]), got

    def complete_tasks(self, items: Sequence[Mapping[str, Any]]
                       ) -> list[CommitReceipt | StrawError]:
        """straw's addition: ``complete_task`` of many leased attempts in ONE journal frame
        and one catalog adoption (a controller returning a call of 64 groups pays one
        durable step for them, not 64 shared among threads).  Each item is a dict of
        ``complete_task``'s keywords (``lease``, ``submission_id``, ``result_ref``,
        optional ``result_digest``).  Returns one outcome per item, in order: its receipt,
        or the ``StrawError`` that refused it (``StaleAttempt``, ``LeaseExpired``,
        ``InvalidReference``, ``IdempotencyConflict``, ...), exactly as ``complete_task``
        would answer it alone; a refused item does not stop the others.  The accepted
        completions are one frame: a crash keeps all of them or none, and a retry of the
        call (same submission ids) returns the same receipts.  A malformed item is a
        ``TypeError``/``ValueError`` for the whole call, before anything is written; a
        storage error is raised for the whole call (nothing was journaled: retry it)."""
        self._check_process()
        if isinstance(items, Mapping) or not isinstance(items, Sequence):
            raise TypeError("items must be a list of dicts with 'lease', 'submission_id' and "
                            "'result_ref' (optional 'result_digest')")
        args = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or not {"lease", "submission_id",
                                                     "result_ref"} <= set(item):
                raise TypeError(f"items[{i}] must be a dict with 'lease', 'submission_id' "
                                f"and 'result_ref'")
            extra = set(item) - {"lease", "submission_id", "result_ref", "result_digest"}
            if extra:
                raise TypeError(f"items[{i}] has unknown keys {sorted(extra)}")
            lease, ref, key = self._completion_args(item["lease"], item["submission_id"],
                                                    item["result_ref"], item.get("result_digest"))
            args.append((item["submission_id"], lease, ref, key))
        if not args:
            return []
        started = time.perf_counter()
        outcomes: list[CommitReceipt | StrawError | None] = [None] * len(args)
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, adopted = self._complete_batch(args, outcomes, announced)
        self._wait(seq, adopted)
        out: list[CommitReceipt | StrawError] = []
        for (sub, _, _, _), o in zip(args, outcomes, strict=True):
            out.append(o if o is not None else self._receipt(self.state.submissions[sub]))
        if any(o is None for o in outcomes):
            self._complete_seconds.append(time.perf_counter() - started)
        return out

    def _complete_batch(self, args: list[tuple[str, Lease, RecordSetRef, list[Any]]],
                        outcomes: list[CommitReceipt | StrawError | None],
                        announced: Announcement) -> tuple[int, _Adopted]:
        """complete_tasks up to the enqueue (the steps of ``_complete`` for many items):
        fills ``outcomes`` with the receipts of retries and the errors of refused items
        (None: accepted in this call's frame); returns (sequence number, extents adopted)."""
        todo: list[tuple[int, Lease, str, RecordSetRef, list[Any], bool]] = []
        with self._mutex:
            self._check_usable()
            for i, (sub, lease, ref, key) in enumerate(args):
                try:
                    done = self._completed_receipt(sub, key)
                    if done is None:
                        allow = self._check_lease(lease, allow_expired=True).allow_empty
                except StrawError as e:
                    outcomes[i] = e
                    continue
                if done is not None:
                    outcomes[i] = done
                else:
                    todo.append((i, lease, sub, ref, key, allow))
        checked = []
        for i, lease, sub, ref, key, allow in todo:
            try:
                if key[2] != ref.digest:
                    raise InvalidReference(f"result_digest {key[2]!r} differs from the "
                                           f"reference's digest {ref.digest!r}")
                self._check_result(ref, lease, allow)
            except (StorageUnavailable, Closed):  # QuotaExceeded too
                raise  # not this item's fault: the whole call, nothing journaled
            except StrawError as e:
                outcomes[i] = e
                continue
            checked.append((i, lease, sub, ref, key))
        adopted = self._adopt([c[3] for c in checked], announced)
        seq = self._last_seq
        try:
            with self._mutex:
                self._check_usable()
                now = self.clock.now()
                txns = []
                for i, lease, sub, ref, key in checked:
                    try:
                        pos, txn = rules.complete(self.state, self._names, lease, sub, key,
                                                  ref, self._epoch, now, self._deadlines)
                    except StrawError as e:
                        outcomes[i] = e
                        continue
                    if txn is None:  # a concurrent call (or an earlier item)
                        assert pos is not None
                        outcomes[i] = self._receipt(pos)
                        continue
                    self.state.apply(txn)  # journal order = apply order (one frame)
                    self._deadlines.pop(txn["task"], None)
                    txns.append(txn)
                if txns:
                    seq = self.journal.enqueue_many(
                        [msgpack.packb(t, use_bin_type=True) for t in txns])
                    self._last_seq = seq
                    self._seq_commits[seq] = len(self.state.commits)
                    self._since_snapshot += len(txns)
        finally:
            self._done_adopting(adopted)
        return seq, adopted

    def _completion_args(self, lease: object, submission_id: object, result_ref: object,
                         result_digest: object) -> tuple[Lease, RecordSetRef, list[Any]]:
        """complete_task's argument checks: (lease, reference, idempotency key)."""
        _check_id("submission_id", submission_id)
        ref = self._check_ref(result_ref, "result_ref")
        if result_digest is not None and not isinstance(result_digest, str):
            raise TypeError(f"result_digest must be None or a str, got "
                            f"{type(result_digest).__name__}")
        lease = _check_lease_fields(lease, "lease")
        # The result's logical digest (the one claimed), not its location: a retry of a lost
        # reply that republished the same records elsewhere (another pack, a restarted
        # writer) is the same completion (D7), as in straw-queue; another digest is a
        # conflict.  A claimed digest that differs from the reference's is refused by
        # _complete unless the submission is known (then it is a conflict, as there).
        key = [lease.task_id, lease.generation,
               ref.digest if result_digest is None else result_digest]
        return lease, ref, key

    def _complete(self, lease: Lease, submission_id: str, ref: RecordSetRef,
                  key: list[Any], announced: Announcement,
                  then_acquire: tuple[int, bool] | None = None,
                  ) -> tuple[int, CommitReceipt | None, _Adopted,
                             AcquireResult | None]:
        """complete_task up to the enqueue: (sequence number to wait for, the original
        receipt of a retry or None, the extents adopted, and — with ``then_acquire``
        (max_tasks, control) — the acquire result whose grant shares the commit's frame)."""
        with self._mutex:
            self._check_usable()
            done = self._completed_receipt(submission_id, key)
            if done is None:  # the lease is current, expired or not (spec complete)
                allow_empty = rules.current_task(self.state, self._names, lease, self._epoch,
                                                 None, self._deadlines).allow_empty
        if done is not None:
            return self._last_seq, done, {}, None
        if key[2] != ref.digest:
            raise InvalidReference(f"result_digest {key[2]!r} differs from the "
                                   f"reference's digest {ref.digest!r}")
        self._check_result(ref, lease, allow_empty)
        adopted = self._adopt([ref], announced)
        got = None
        try:
            with self._mutex:
                self._check_usable()
                pos, txn = rules.complete(self.state, self._names, lease, submission_id, key,
                                          ref, self._epoch, self.clock.now(), self._deadlines)
                if txn is None:  # a concurrent retry got there first
                    assert pos is not None
                    done, seq = self._receipt(pos), self._last_seq
                elif then_acquire is None:
                    seq = self._enqueue(txn)
                    self._deadlines.pop(txn["task"], None)
                else:
                    seq, got = self._complete_then_grant(txn, lease.worker_id, *then_acquire)
        finally:
            self._done_adopting(adopted)
        return seq, done, adopted, got

    def _complete_then_grant(self, complete: dict[str, Any], worker_id: str, max_tasks: int,
                             control: bool) -> tuple[int, AcquireResult]:
        """complete_and_acquire's transaction (mutex held, the lease checked): expiries
        due are journaled first (their own frames, as acquire does), then the commit and
        the grant chosen after it as one frame (``Journal.enqueue_many``)."""
        self._expire_due()  # the completed lease is current: it is not among them
        self.state.apply(complete)
        self._deadlines.pop(complete["task"], None)
        txns = [complete]
        status, chosen, grant = self._grant_locked(worker_id, max_tasks, None, None, control)
        if grant is not None:
            self.state.apply(grant)
            txns.append(grant)
        seq = self.journal.enqueue_many([msgpack.packb(t, use_bin_type=True) for t in txns])
        self._last_seq = seq
        self._seq_commits[seq] = len(self.state.commits)
        self._since_snapshot += len(txns)
        return seq, AcquireResult(status, self._assigned(chosen))

    def _completed_receipt(self, submission_id: str, key: list[Any]) -> CommitReceipt | None:
        """The receipt of an accepted completion with this submission id (D7), or None."""
        pos = rules.completed(self.state, self._names, submission_id, key)
        return None if pos is None else self._receipt(pos)

    def _check_result(self, ref: RecordSetRef, lease: Lease, allow_empty: bool) -> None:
        """The result belongs to the lease's attempt and is within the result limits."""
        manifest = self.store.checked_manifest(ref)
        if not manifest.records:
            if not allow_empty:
                raise InvalidReference(
                    f"the result of task {lease.task_id!r} has no records; the task does not "
                    "allow an empty result (submit it with allow_empty=True)")
            return
        named = False
        nbytes = tokens = 0
        for info in manifest.records:
            nbytes += info.length
            tokens += info.tokens or 0
            meta = info.metadata
            if "task_id" in meta or "attempt_id" in meta:
                if meta.get("task_id") != lease.task_id or \
                        meta.get("attempt_id") != lease.attempt_id:
                    raise InvalidReference(
                        f"result record {info.record_id!r} names task "
                        f"{meta.get('task_id')!r} attempt {meta.get('attempt_id')!r}: it belongs "
                        f"to another attempt than the lease's (task {lease.task_id!r} attempt "
                        f"{lease.attempt_id!r}); complete each task with its own result")
                named = True
        if not named:
            raise InvalidReference(
                "the result's records must name the lease in their metadata: publish them "
                f"with metadata={{'task_id': {lease.task_id!r}, 'attempt_id': "
                f"{lease.attempt_id!r}}}")
        for what, value, limit in (("bytes", nbytes, self._bounds.max_result_bytes),
                                   ("tokens", tokens, self._bounds.max_result_tokens)):
            # unenforced (INT64_MAX, the most a Limits field holds) no result is refused:
            # a result's usage may reach 2**64-1, as in straw-queue
            if value > limit and self._enforce_limits:
                raise ResourceLimitExceeded(
                    f"the result of task {lease.task_id!r} holds {value} payload {what}; the "
                    f"limit is {limit} (Limits.max_result_{what})")

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
                known = self._known(request_id, digest, "save_task_progress")
                if known is None:
                    txn_rows = [[self._check_lease(le, where=f"updates[{i}]['lease']").task_id,
                                 le.generation, list(_ref_tuple(r))]
                                for i, (le, r) in enumerate(rows)]
                    seq = self._enqueue({"t": "progress", "req": request_id, "digest": digest,
                                         "updates": txn_rows, "result": ["saved"]})
        finally:
            self._done_adopting(adopted)
        if known is not None:
            return self._replayed(known)[0]
        self._wait(seq, adopted)
        return "saved"

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
            seq = None if self.state.sealed else self._enqueue({"t": "seal"})
        self._wait(self._last_seq if seq is None else seq)
        return "sealed"

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
