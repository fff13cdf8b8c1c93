"""The rollout controller: one per job, the owner of the queue's ``Coordinator`` and of the
``DataSource`` (issue 14, item 1).

Generation clients (``straw.rollout.generation``) call it, in process or over
``RolloutServer``/``RemoteController`` (``straw.rpc``'s wire format plus the controller's
calls); payloads never travel through it: clients read inputs and publish groups in the
pool themselves, the controller sees leases, references and receipts.

``take(worker_id, count)`` leases up to ``count`` prompt groups (tasks ``prompt:<gid>``
only): acquire; if nothing is pending, under the producer lock acquire again (another
worker may have refilled), and if still nothing, refill:

1. reset the data source to the cursor the queue holds (``producer_state("dataset")``):
   the committed one, whatever an earlier refill did in memory;
2. publish the refill's groups, one ``publish_many`` (submission ``input:<request id>``);
3. ONE ``submit_tasks`` transaction carrying the tasks *and* the advanced cursor as the
   producer state (request id ``dataset:<first group index>``; a lost reply is retried
   with the same id, D7), then ``commit`` the cursor in memory;
4. acquire again.

**RL1, exactly-once dataset admission per epoch**: the queue's cursor moves only in the
transaction that creates the tasks before it, and every refill starts at the queue's
cursor; so whatever crashed or failed between publish, submit and commit, the prompt
tasks in the queue are the epochs' orders up to the cursor, each dataset index once per
epoch.  (A crash after publishing leaves unreferenced staged data, collected as garbage;
a crash after the transaction leaves the cursor advanced, so the next refill goes on.)
``tests/rollout/test_controller.py`` crashes a SimFS at every step of refills and checks
this.

The controller also tracks the weight version now served (``serving_version``, set by the
trainer's weight update with ``set_serving_version``) and the staleness of what it accepts
(``staleness_metrics``: the clients send each accepted sample's staleness against the
serving version their staleness bound applied or, without a bound, the versions its
tokens were generated under, measured here against the version served at acceptance).

Example (in one process; ``generation.GenerationClient`` is the worker side)::

    import tempfile
    from straw import SharedFilesystemStore
    from straw.rollout import RolloutConfig
    from straw.rollout.controller import RolloutController
    from straw.rollout.generation import GenerationClient
    from straw.rollout.samples import Status
    import dataclasses

    root = tempfile.mkdtemp()
    config = RolloutConfig(n_samples_per_prompt=2, lease_seconds=60)
    store = SharedFilesystemStore(root, "job", writer_id="controller")
    controller = RolloutController(store, [(1, 2, 3), (4, 5)], config=config)
    client = GenerationClient(controller, SharedFilesystemStore(root, "job"),
                              worker_id="gen-0", config=config)
    groups = client.take(2)
    done = [dataclasses.replace(g, samples=tuple(
                dataclasses.replace(s, tokens=s.tokens + (7, 8), response_length=2,
                                    status=Status.COMPLETED, reward=1.0)
                for s in g.samples)) for g in groups]
    returned = client.return_groups(done)   # ready groups: completed, with receipts
    assert all(r.action == "completed" for r in returned)
    client.close(); controller.close()
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from straw import (
    Coordinator,
    IndeterminateCommit,
    Publication,
    SharedFilesystemStore,
    StrawError,
    TaskSpec,
)
from straw.coordinator import NAMESPACE_FALSE, NAMESPACE_TRUE
from straw.protocol import AcquireResult, CommitReceipt, Lease
from straw.refs import Record, RecordSetRef

from .codec import group_records
from .config import RolloutConfig
from .data_source import PRODUCER_ID, PROMPT_PREFIX, DataSource, Refill, cursor_from_producer_state
from .scheduling import SUBMITTED_PROMPT_KEY, StalenessTally, staleness_of_span


def _checked_span(span: Any, where: str) -> list[int] | None:
    """A ``scheduling.version_span`` as a client sent it: None, ``[]`` or ``[oldest,
    newest]`` (ints, oldest <= newest)."""
    if span is None:
        return None
    if isinstance(span, (str, bytes)) or not isinstance(span, Sequence) \
            or len(span) not in (0, 2) or any(type(v) is not int for v in span) \
            or (span and span[0] > span[1]):
        raise TypeError(f"{where} must be None, [] or [oldest, newest] (ints), got {span!r}")
    return list(span)


# a lost reply of the refill transaction (IndeterminateCommit, or ConnectionError when a
# remote coordinator stands in) is retried with the same request id this many times
SUBMIT_ATTEMPTS = 3
# takes remembered per worker for retries under their request id (a generation client has
# at most two in flight: its own take and one folded into a return)
TAKES_KEPT = 4


def named_records(records: Sequence[Record], **names: str) -> list[Record]:
    """``records`` with ``names`` added to record 0's metadata: a result names its lease
    (``task_id``, ``attempt_id``), an input its task (``task_id``)."""
    first = records[0]
    return [dataclasses.replace(first, metadata={**first.metadata, **names}), *records[1:]]


def check_worker_id(worker_id: object) -> str:
    if not isinstance(worker_id, str) or not worker_id:
        raise ValueError(f"worker_id must be a non-empty str, got {worker_id!r}")
    return worker_id


def check_count(count: object) -> int:
    """The number of prompt groups a take asks for, checked."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1 (prompt groups), got {count!r}")
    return count


def check_take(worker_id: object, count: object, request_id: object, *,
               required: bool = False) -> None:
    """The arguments of a take checked (``required``: a request id must be given)."""
    check_worker_id(worker_id)
    check_count(count)
    if (required or request_id is not None) and \
            (not isinstance(request_id, str) or not request_id):
        raise ValueError(f"request_id must be a non-empty str (a retry after a lost reply "
                         f"gives the same one), got {request_id!r}")


def _check_handed_over(coord: Any, store: Any, queue_id: str, namespace: bool | str,
                       lease_seconds: float) -> None:
    """A coordinator handed to ``RolloutController(coordinator=...)`` is the open queue
    the controller would have opened (``ValueError`` naming the difference otherwise)."""
    if not isinstance(coord, Coordinator):
        raise TypeError(f"coordinator must be a straw.Coordinator, got "
                        f"{type(coord).__name__}")
    ns = (NAMESPACE_TRUE if namespace else NAMESPACE_FALSE) if isinstance(namespace, bool) \
        else namespace
    closed = bool(getattr(coord, "_closed", True))
    got = (coord.store is store, coord.queue_id, coord.namespace, coord.lease_seconds)
    want = (True, queue_id, ns, float(lease_seconds))
    if got != want or closed:
        raise ValueError(f"the coordinator handed to RolloutController must be an open "
                         f"coordinator of this store's queue {ns}/{queue_id} with "
                         f"lease_seconds {lease_seconds} (got queue "
                         f"{coord.namespace}/{coord.queue_id}, lease_seconds "
                         f"{coord.lease_seconds}, same store {coord.store is store}, closed "
                         f"{closed}): open it with those, or let the controller open "
                         "the queue")


class RolloutController:
    """The job's controller (see the module docstring).

    ``dataset``: a ``DataSource``, or a sequence of prompts (then ``seed``, ``shuffle``
    and ``keep`` build the data source, with ``config.n_samples_per_prompt``);
    ``recover=True`` opens an existing queue (its cursor resumes from the producer state);
    ``queue_id``, ``namespace``, ``exclusive_owner``, ``takeover`` and ``clock`` go to the
    ``Coordinator``, with ``config.lease_seconds``.

    ``coordinator``: an open ``Coordinator`` of that queue to own instead of opening one
    (the controller closes it): a restore hands over the queue it just seeded, so the
    queue is opened once, not closed and reopened (a second epoch).  It must be open, of
    ``store``'s pool and run, of ``queue_id``/``namespace``, and hold leases of
    ``config.lease_seconds``; ``recover``, ``takeover`` and ``exclusive_owner`` do not
    apply (it is open already)."""

    def __init__(self, store: SharedFilesystemStore, dataset: DataSource | Sequence[Any], *,
                 config: RolloutConfig | None = None, queue_id: str = "rollout",
                 namespace: bool | str = True, exclusive_owner: str | None = None,
                 recover: bool = False, takeover: bool = False, clock: Any = None,
                 seed: int = 0, shuffle: bool = False,
                 keep: Callable[[Any], bool] | None = None,
                 serving_version: int | str = 0,
                 coordinator: Coordinator | None = None) -> None:
        self.config = RolloutConfig() if config is None else config
        if not isinstance(self.config, RolloutConfig):
            raise TypeError(f"config must be a RolloutConfig, got {type(config).__name__}")
        if isinstance(dataset, DataSource):
            if dataset.n_samples_per_prompt != self.config.n_samples_per_prompt:
                raise ValueError(
                    f"the DataSource makes groups of {dataset.n_samples_per_prompt} samples but "
                    f"config.n_samples_per_prompt is {self.config.n_samples_per_prompt}: give "
                    "both the same value (or pass the prompts and let the controller build it)")
            self.source = dataset
        else:  # an empty dataset or a bad n is DataSource's clear ValueError
            self.source = DataSource(dataset, n_samples_per_prompt=self.config.n_samples_per_prompt,
                                     seed=seed, shuffle=shuffle, keep=keep)
        serving = _check_version(serving_version)  # checked before the queue opens
        self.store = store
        if coordinator is not None:
            _check_handed_over(coordinator, store, queue_id, namespace,
                               self.config.lease_seconds)
            self.coordinator = coordinator
        else:
            # a resume revokes the dead job's leases without spending their budget: a job
            # preempted every day must not turn its in-flight prompts into failed tasks
            # (their generation is lost, not wrong; expiry and fail still spend it)
            self.coordinator = Coordinator(store, queue_id=queue_id, namespace=namespace,
                                           exclusive_owner=exclusive_owner, recover=recover,
                                           takeover=takeover, clock=clock,
                                           lease_seconds=self.config.lease_seconds,
                                           recovery_spends_budget=False)
        self._producer = threading.Lock()  # one refill at a time
        self._state = threading.Lock()  # serving version and staleness tally
        self._serving: int | str = serving
        self._staleness = StalenessTally()
        # worker -> its last TAKES_KEPT takes by request id: a client may have two in
        # flight (its own take and one folded into a return, complete_and_take)
        self._takes: dict[str, OrderedDict[str, AcquireResult]] = {}
        self._taker: concurrent.futures.ThreadPoolExecutor | None = None  # complete_and_take
        self.refills = 0
        try:  # resume the cursor the queue holds (None: a new queue starts at the start)
            self.source.reset(cursor_from_producer_state(
                self.coordinator.producer_state(PRODUCER_ID)))
        except BaseException:
            self.coordinator.close()
            raise

    # --- producer side ------------------------------------------------------------------
    def take(self, worker_id: str, count: int, *, request_id: str | None = None
             ) -> AcquireResult:
        """Lease up to ``count`` prompt groups for ``worker_id``, refilling from the
        dataset when none is pending (module docstring).  The result's assignments carry
        the leases and the input references; the status is the queue's (``acquired``,
        ``empty`` when a refill could not be leased right away, ``backpressured``, ...).

        ``request_id`` makes a retry after a lost reply safe: one of the worker's last
        ``TAKES_KEPT`` takes with the same id returns the same result (leasing nothing
        more), for as long as this controller lives (a new one revokes every lease
        anyway)."""
        check_take(worker_id, count, request_id)
        if request_id is not None:
            with self._state:
                kept = self._takes.get(worker_id)
                last = None if kept is None else kept.get(request_id)
            if last is not None:
                return last  # the reply of this request was lost: the same leases
        got = self._take(worker_id, count)
        if request_id is not None:
            with self._state:
                kept = self._takes.setdefault(worker_id, OrderedDict())
                kept[request_id] = got
                while len(kept) > TAKES_KEPT:
                    kept.popitem(last=False)
        return got

    def _take(self, worker_id: str, count: int) -> AcquireResult:
        got = self.coordinator.acquire(worker_id, count, task_prefix=PROMPT_PREFIX)
        if got.status != "empty":
            return got
        with self._producer:
            got = self.coordinator.acquire(worker_id, count, task_prefix=PROMPT_PREFIX)
            if got.status != "empty":
                return got  # another worker refilled meanwhile
            self._refill(count)
        return self.coordinator.acquire(worker_id, count, task_prefix=PROMPT_PREFIX)

    def _refill(self, count: int) -> None:
        """One refill, under the producer lock (invariant RL1: module docstring)."""
        # RL1: start from the queue's cursor, never from what memory holds (a refill that
        # failed after advancing memory would skip prompts)
        self.source.reset(cursor_from_producer_state(
            self.coordinator.producer_state(PRODUCER_ID)))
        refill = self.source.refill(count, minimum=self.config.min_refill,
                                    maximum=self.config.max_refill)
        refs = self._publish_inputs(refill)
        tasks = [TaskSpec(tid, ref, metadata={"group_index": g.group_index,
                                              "epoch_id": g.metadata["epoch_id"],
                                              "dataset_index": g.metadata["dataset_index"]},
                          priority=0, scheduling_key=SUBMITTED_PROMPT_KEY,
                          estimated_tokens=ref.tokens, max_attempts=self.config.max_attempts)
                 for tid, g, ref in zip(refill.task_ids, refill.groups, refs, strict=True)]
        self._submit(refill, tasks)
        # RL1: the transaction holding tasks and cursor is durable: now memory may follow
        self.source.commit(refill)
        self.refills += 1

    def _publish_inputs(self, refill: Refill) -> tuple[RecordSetRef, ...]:
        pubs = []
        for tid, group in zip(refill.task_ids, refill.groups, strict=True):
            records, deps = group_records(group)
            pubs.append(Publication(named_records(records, task_id=tid), tuple(deps)))
        # publish first (D1): the transaction below only names durable publications
        return self.store.publish_many(pubs, submission_id="input:" + refill.request_id)

    def _submit(self, refill: Refill, tasks: list[TaskSpec]) -> None:
        """RL1: the tasks and the advanced cursor in ONE transaction; a lost reply is
        retried with the same request id, which answers from the journal if it was
        durable (D7)."""
        lost: BaseException | None = None
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                self.coordinator.submit_tasks(refill.request_id, tasks, producer_id=PRODUCER_ID,
                                              producer_state=refill.producer_state)
                return
            except (IndeterminateCommit, ConnectionError) as e:
                if attempt + 1 == SUBMIT_ATTEMPTS:
                    raise  # the cursor did not move in memory: the next take starts over
                lost = e
            except BaseException as e:
                if lost is None:
                    raise
                raise e from lost  # a retry refused: say what the first attempt met

    @property
    def cursor(self) -> Any:
        """The committed dataset cursor (a ``data_source.Cursor``)."""
        return self.source.cursor

    # --- serving version and staleness --------------------------------------------------
    @property
    def serving_version(self) -> int | str:
        """The weight version the generation engines serve now."""
        with self._state:
            return self._serving

    def current_version(self) -> int | str:
        """``serving_version`` as a call (what ``RemoteController`` asks over RPC)."""
        return self.serving_version

    def set_serving_version(self, version: int | str) -> None:
        """The engines now serve ``version`` (call it after each weight update)."""
        version = _check_version(version)
        with self._state:
            self._serving = version

    def staleness_metrics(self) -> dict[str, float]:
        """``staleness/mean``, ``staleness/max``, ``staleness/unknown_count`` over every
        sample accepted through this controller, each measured against the serving
        version when it was accepted."""
        with self._state:
            return self._staleness.metrics()

    # --- worker side: what generation clients call --------------------------------------
    def heartbeat(self, leases: Sequence[Lease]) -> list[str]:
        """Renew leases (the coordinator's outcomes, one per lease)."""
        return self.coordinator.heartbeat(leases)

    def complete_many(self, items: Sequence[Mapping[str, Any]]
                      ) -> list[CommitReceipt | StrawError]:
        """Accept ready groups: each item ``{"lease", "result_ref", "staleness"}`` (the
        group's per-sample staleness, None for unknown) or ``{"lease", "result_ref",
        "versions"}`` (per sample, its ``scheduling.version_span``: staleness is measured
        against the serving version now) is completed with submission id
        ``result:<attempt_id>`` (a retry returns the same receipt; other content under
        the attempt is ``IdempotencyConflict``).  All of them are one journal frame
        (``Coordinator.complete_tasks``); one outcome per item: its receipt, or the straw
        error that refused it (a stale lease does not stop the others)."""
        if isinstance(items, Mapping) or not isinstance(items, Sequence):
            raise TypeError("items must be a list of {'lease', 'result_ref', 'staleness'}")
        checked = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or not {"lease", "result_ref"} <= set(item):
                raise TypeError(f"items[{i}] must be a dict with 'lease' and 'result_ref'")
            if "staleness" in item and "versions" in item:
                raise TypeError(f"items[{i}] gives 'staleness' and 'versions': give one")
            key = "versions" if "versions" in item else "staleness"
            values = item.get(key) or ()
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise TypeError(f"items[{i}][{key!r}] must be a list (one entry a sample)")
            if key == "versions":
                values = [_checked_span(span, f"items[{i}]['versions'][{j}]")
                          for j, span in enumerate(values)]
            if not isinstance(item["lease"], Lease):
                raise TypeError(f"lease must be a Lease, got {type(item['lease']).__name__}")
            checked.append((item["lease"], item["result_ref"], key, list(values)))
        if not checked:
            return []
        # one journal frame and one catalog adoption for the whole call (the core's batch
        # completion): 64 complete_task calls on threads cost the controller ~0.7 ms of
        # CPU per group, most of it per-call overhead
        outcomes = self.coordinator.complete_tasks([
            {"lease": lease, "submission_id": "result:" + lease.attempt_id,
             "result_ref": ref, "result_digest": ref.digest} for lease, ref, _, _ in checked])
        accepted = [(key, values) for (_, _, key, values), o
                    in zip(checked, outcomes, strict=True) if isinstance(o, CommitReceipt)]
        with self._state:
            for key, values in accepted:
                if key == "versions":  # measured against the version served now
                    values = [staleness_of_span(span, self._serving) for span in values]
                self._staleness.add(values)
        return outcomes

    def complete(self, lease: Lease, result_ref: RecordSetRef,
                 staleness: Sequence[int | None] = ()) -> CommitReceipt:
        """``complete_many`` of one group; its error is raised."""
        (out,) = self.complete_many([{"lease": lease, "result_ref": result_ref,
                                      "staleness": list(staleness)}])
        if isinstance(out, BaseException):
            raise out
        return out

    def complete_and_take(self, items: Sequence[Mapping[str, Any]], worker_id: str,
                          count: int, *, request_id: str
                          ) -> tuple[list[CommitReceipt | StrawError], AcquireResult]:
        """``complete_many(items)`` and ``take(worker_id, count, request_id=...)`` in one
        call: a generation client returning finished groups leases the next ones in the
        same round trip.  The two run at once (the take on the controller's own thread),
        so their journal entries share a group commit: the call waits for about one
        durable write, not two in a row.  Each half keeps its retry rule: a retry answers
        the same receipts and, under the same request id, the same leases; so when one
        half raises, the other's result stands (the leases of a take whose completions
        failed are answered again to the retry that follows, or expire)."""
        check_take(worker_id, count, request_id, required=True)
        with self._state:
            if self._taker is None:
                self._taker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="straw.rollout take")
            taker = self._taker
        took = taker.submit(self.take, worker_id, count, request_id=request_id)
        try:
            outcomes = self.complete_many(items)
        except BaseException:
            concurrent.futures.wait([took])  # its leases stay recorded for the retry
            raise
        return outcomes, took.result()

    def yield_groups(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        """Return partial and fresh groups to pending with their new inputs, priority and
        scheduling key (``Coordinator.yield_tasks``: one transaction, no retry spent)."""
        return self.coordinator.yield_tasks(updates, request_id=request_id)

    def save_progress(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        """Make continuations the inputs of leased tasks, keeping the leases."""
        return self.coordinator.save_task_progress_many(updates, request_id=request_id)

    def reject(self, lease: Lease, *, category: str, reason: str) -> str:
        """Fail a group for good with its reason (request id ``reject:<attempt_id>``)."""
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, got {type(lease).__name__}")
        if not isinstance(reason, str) or not reason:
            raise ValueError("a rejected group needs its reason (a non-empty str)")
        return self.coordinator.fail_task(lease, request_id="reject:" + lease.attempt_id,
                                          failure={"category": category, "reason": reason},
                                          retryable=False)

    def release(self, leases: Sequence[Lease], *, request_id: str) -> list[str]:
        """Give leases back without spending a failure: their tasks resume from their
        previous durable inputs."""
        return self.coordinator.release_tasks(leases, request_id=request_id)

    def task_status(self, task_id: str) -> dict[str, Any] | None:
        return self.coordinator.task_status(task_id)

    # --- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Close the coordinator (the store is the caller's)."""
        with self._state:
            taker, self._taker = self._taker, None
        if taker is not None:
            taker.shutdown(wait=True)
        self.coordinator.close()

    def __enter__(self) -> RolloutController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_version(version: object) -> int | str:
    if isinstance(version, bool) or not isinstance(version, (int, str)):
        raise TypeError(f"a serving version is an int or a str, got {type(version).__name__}")
    return version


__all__ = ["RolloutController", "named_records", "SUBMIT_ATTEMPTS"]
