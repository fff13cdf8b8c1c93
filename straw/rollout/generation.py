"""The generation client: one per generation process, between its engine and the queue
(issue 14, item 2).

``GenerationClient(controller, store, worker_id=..., config=...)``: ``controller`` is the
job's ``RolloutController`` (same process) or a ``remote.RemoteController`` (another
one); ``store`` is this process's own pool client: inputs are read and groups published
here, never sent through the control path.

* ``take(n)`` leases up to ``n`` prompt groups (prompt tasks only) and reads their inputs
  (``group_from_records``, one read session): a fresh prompt, or the durable continuation
  an earlier attempt returned.  A heartbeat thread renews every held lease each
  ``config.heartbeat_seconds`` (measured on the injectable ``clock``; renewals in batches
  of 128); a lease the queue answers ``StaleAttempt`` or ``LeaseExpired`` for is dropped
  locally (another worker has the task now).
* ``return_groups(groups)`` gives groups back, each by its stage and state:

  - captures (R3 routes, score-centering top-k rows) that do not cover its tokens:
    **released** (no failure spent), the task resumes from its previous durable input;
  - the optional staleness bound (``config.staleness_bound``): REJECT fails the task for
    good (category ``Stale``, with the reason); REQUEUE returns the prompt alone, as fresh;
  - **ready** (every sample completed or truncated, with a reward): published (record 0
    names the lease) and **completed**: submission ``result:<attempt_id>``, a receipt;
  - **partial** / **fresh**: published and **returned** (``yield_tasks``, one transaction)
    with priority 1 / 0, the scheduling key (the oldest numeric generated-token version;
    int64 max when none) and metadata ``stage``, ``returned``.

  Groups are published first (one ``publish_many``), then the queue transactions run.
  The outcome of each group is a ``Returned``; a group refused by the queue (a stale
  lease) raises its error after the others were returned.
* ``complete(groups)`` returns ready groups, their receipts; ``reject(group, reason)``
  fails a filtered group without retry, with its reason; ``save_progress(groups)`` makes
  partial groups the durable inputs of their tasks while keeping the leases.
* ``close()`` releases every held lease (no failure spent) and stops the heartbeat.

Every call is safe to retry after a lost reply (D7): a ``take`` is retried under the
same request id (the controller answers it with the same leases); request and submission
ids of returns derive from the attempt (``result:<attempt_id>``, ``reject:<attempt_id>``,
``release:`` and ``return:`` digests), the publication of an attempt's group is remembered (the same
content gets the same reference; other content under the same attempt is
``IdempotencyConflict``, as the queue says for a completion), and a lease that ended stays
known for a while so that a retry reaches the queue, which answers it from its journal: a
completed group's retry returns the same receipt (RL2: a group is accepted at most once).
Partial work is never restarted (RL5): a returned or saved continuation is the task's
durable input, and a lease that expires, is released or closed leaves it in place.

Bad input raises before anything changes: a group that is not a ``SampleGroup``, one the
client holds no lease for (never taken, or from another client), one whose samples answer
another prompt than its task's, the same group twice in a call.  (A group mixing prompts,
or with a NaN reward, cannot be built: ``SampleGroup``/``Sample`` refuse it.)

Example: see ``straw.rollout.controller``.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from straw import (
    CorruptData,
    IdempotencyConflict,
    IndeterminateCommit,
    LeaseExpired,
    Publication,
    SharedFilesystemStore,
    StaleAttempt,
    StrawError,
)
from straw.protocol import AcquireResult, Assignment, CommitReceipt, Lease, TaskSpec, digest
from straw.refs import RecordSetRef

from .codec import group_from_records, group_records
from .config import RolloutConfig
from .controller import check_count, check_worker_id, named_records
from .data_source import task_id as task_id_of
from .returns import COMPLETED as COMPLETED
from .returns import REJECTED as REJECTED
from .returns import RELEASED as RELEASED
from .returns import REQUEUED as REQUEUED
from .returns import RETURNED as RETURNED
from .returns import Returned as Returned
from .returns import ReturnPlan, content_digest
from .samples import SampleGroup, Stage, _same_prompt, captures_cover_group, classify
from .scheduling import (
    Decision,
    Verdict,
    decide,
    priority,
    restart_from_prompt,
    scheduling_key,
    staleness,
    version_span,
)

HEARTBEAT_BATCH = 128
HEARTBEAT_POLL = 0.05  # real seconds between looks at the clock
ENDED_KEPT = 4096  # ended leases (and their publications) kept for retries

KEEP = Verdict(Decision.KEEP, None)  # what decide() answers for any group without a bound

class GenerationClient:
    """One generation process's queue client (see the module docstring)."""

    def __init__(self, controller: Any, store: SharedFilesystemStore, *, worker_id: str,
                 config: RolloutConfig | None = None, clock: Any = None,
                 heartbeat: bool = True) -> None:
        self.config = RolloutConfig() if config is None else config
        if not isinstance(self.config, RolloutConfig):
            raise TypeError(f"config must be a RolloutConfig, got {type(config).__name__}")
        if not isinstance(store, SharedFilesystemStore):
            raise TypeError(f"store must be a SharedFilesystemStore, got "
                            f"{type(store).__name__}")
        self.controller = controller
        self.store = store
        self.worker_id = check_worker_id(worker_id)
        self.clock = clock if clock is not None else store.clock
        self._lock = threading.RLock()
        self._leases: dict[str, Lease] = {}  # task id -> the lease held
        self._taken: dict[str, tuple[TaskSpec, SampleGroup]] = {}  # task id -> as taken
        # task id -> (lease, spec, group) of ended leases, kept so a retry reaches the queue
        self._ended: OrderedDict[str, tuple[Lease, TaskSpec, SampleGroup]] = OrderedDict()
        # attempt id -> (content digest, reference) of the group returned under it
        self._published: OrderedDict[str, tuple[str, RecordSetRef]] = OrderedDict()
        self._heartbeat_error: BaseException | None = None
        self._closed = False
        self.last_status = ""
        self.renewals = 0
        self._incarnation = uuid.uuid4().hex[:12]  # take request ids: this client's own
        self._takes = 0
        self._take_requests: dict[str, str] = {}  # channel -> its pending take's request id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, daemon=True,
                                            name=f"straw.rollout heartbeat {worker_id}")
            self._thread.start()

    # --- leases -------------------------------------------------------------------------
    @property
    def leases(self) -> dict[str, Lease]:
        """The leases held now, by task id."""
        with self._lock:
            return dict(self._leases)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"generation client {self.worker_id!r} is closed")
        if self._heartbeat_error is not None:
            raise RuntimeError(f"generation client {self.worker_id!r}: its lease heartbeat "
                               f"failed ({self._heartbeat_error}); its leases will expire: "
                               "close it and start another") from self._heartbeat_error

    def _end(self, tid: str) -> None:
        """The lease of ``tid`` is over for this client (kept for retries)."""
        with self._lock:
            lease = self._leases.pop(tid, None)
            taken = self._taken.pop(tid, None)
            if lease is not None and taken is not None:
                self._ended[tid] = (lease, *taken)
                while len(self._ended) > ENDED_KEPT:
                    self._ended.popitem(last=False)

    def heartbeat_now(self) -> int:
        """Renew every held lease now; returns how many were extended (the others are
        dropped locally: ``StaleAttempt`` or ``LeaseExpired``)."""
        with self._lock:
            held = list(self._leases.values())
        extended = 0
        for i in range(0, len(held), HEARTBEAT_BATCH):
            chunk = held[i:i + HEARTBEAT_BATCH]
            for lease, outcome in zip(chunk, self.controller.heartbeat(chunk), strict=True):
                if outcome == "extended":
                    extended += 1
                else:  # another worker has the task now (or will): not ours to return
                    with self._lock:
                        if self._leases.get(lease.task_id) == lease:
                            self._end(lease.task_id)
        self.renewals += 1
        return extended

    def _beat(self) -> None:
        interval = self.config.heartbeat_seconds
        due = self.clock.now() + interval
        while not self._stop.wait(HEARTBEAT_POLL):
            if self.clock.now() < due:
                continue
            try:
                self.heartbeat_now()
            except (ConnectionError, IndeterminateCommit, TimeoutError):
                pass  # a lost renewal: the lease has two more intervals before it expires
            except BaseException as e:  # noqa: BLE001 - latched, raised by later calls
                self._heartbeat_error = e
                return
            due = self.clock.now() + interval

    # --- taking -------------------------------------------------------------------------
    def _take_id(self, channel: str) -> str:
        """The request id of ``channel``'s take (``take`` or ``return``): kept until its
        reply arrives, so a take whose reply was lost is retried under the same id."""
        with self._lock:
            rid = self._take_requests.get(channel)
            if rid is None:
                self._takes += 1
                rid = self._take_requests[channel] = \
                    f"take:{self._incarnation}:{self._takes}"
            return rid

    def _answered(self, channel: str) -> None:
        with self._lock:
            self._take_requests.pop(channel, None)

    def take(self, count: int) -> list[SampleGroup]:
        """Lease up to ``count`` prompt groups and read their inputs (module docstring).
        Fewer (or none: ``last_status`` says why) when the queue has no more now."""
        self._check_usable()
        check_count(count)
        got = self.controller.take(self.worker_id, count, request_id=self._take_id("take"))
        self._answered("take")
        return self._inputs(got)

    def _inputs(self, got: AcquireResult) -> list[SampleGroup]:
        """Hold the leases of ``got`` and read their inputs (one read session); if that
        fails, the leases are given back unspent (the tasks stay pending) and the error
        raised."""
        self.last_status = got.status
        assignments = list(got.assignments)
        with self._lock:
            for a in assignments:
                self._leases[a.lease.task_id] = a.lease
        try:
            groups = []
            with self.store.read_session() as reader:
                for a in assignments:
                    if a.task.input_ref is None:
                        raise CorruptData(f"task {a.task.task_id!r} has no input: it is not "
                                          "a prompt group of this rollout")
                    group = group_from_records(list(reader.read(a.task.input_ref)))
                    if group.group_index is None or \
                            task_id_of(group.group_index) != a.task.task_id:
                        raise CorruptData(f"the input of task {a.task.task_id!r} holds group "
                                          f"{group.group_index}: not this task's group")
                    groups.append(group)
        except BaseException:
            self._give_back(assignments)
            raise
        with self._lock:
            for a, g in zip(assignments, groups, strict=True):
                self._taken[a.task.task_id] = (a.task, g)
        return groups

    def _give_back(self, assignments: Sequence[Assignment]) -> None:
        """Release leases just taken, unspent (nothing was done under them)."""
        with self._lock:
            for a in assignments:
                self._leases.pop(a.lease.task_id, None)
        if assignments:
            self.controller.release([a.lease for a in assignments], request_id=(
                "release:" + digest(sorted(a.lease.attempt_id for a in assignments))))

    # --- returning ----------------------------------------------------------------------
    def _lease_for(self, group: object, where: str) -> tuple[str, Lease, TaskSpec]:
        """The task, lease and spec a returned group belongs to (checked)."""
        if not isinstance(group, SampleGroup):
            raise TypeError(f"{where} must be a SampleGroup, got {type(group).__name__}")
        if group.group_index is None:
            raise ValueError(f"{where} has no group index: it was not taken from the queue, "
                             "so it has no lease (take groups with take())")
        tid = task_id_of(group.group_index)
        with self._lock:
            if tid in self._leases:
                lease, (spec, taken) = self._leases[tid], self._taken[tid]
            elif tid in self._ended:
                lease, spec, taken = self._ended[tid]
            else:
                raise ValueError(f"{where} (group {group.group_index}, task {tid!r}) has no "
                                 f"lease held by generation client {self.worker_id!r}: take "
                                 "it first, and return it through the client that took it")
        if not _same_prompt(group.prompt, taken.prompt) or \
                sorted(s.index or 0 for s in group) != sorted(s.index or 0 for s in taken):
            raise ValueError(f"{where} answers another prompt (or holds other samples) than "
                             f"task {tid!r} it claims: return the samples of the prompt you "
                             "took, with their indices")
        return tid, lease, spec

    def _serving(self) -> object:
        """The serving version a staleness bound is applied with (a call to the
        controller); None without a bound: nothing here needs it then (``ReturnPlan``)."""
        if self.config.staleness_bound is None:
            return None
        return self.controller.serving_version

    def _plans(self, groups: Sequence[SampleGroup], current: object) -> list[ReturnPlan]:
        """Decide what becomes of each group; raises on bad input, before any change."""
        plans: list[ReturnPlan] = []
        seen: set[str] = set()
        bound = self.config.staleness_bound
        for i, g in enumerate(groups):
            tid, lease, _ = self._lease_for(g, f"groups[{i}]")
            if tid in seen:
                raise ValueError(f"groups[{i}] returns task {tid!r} a second time in one call")
            seen.add(tid)
            if not captures_cover_group(g):
                plans.append(ReturnPlan(tid, lease, g, RELEASED, "captures do not cover tokens"))
                continue
            # without a bound every group is kept (decide's answer, without measuring the
            # group's staleness a second time: a ready group's is measured below)
            verdict = KEEP if bound is None else decide(g, current, bound)
            if verdict.decision is Decision.REJECT:
                plans.append(ReturnPlan(tid, lease, g, REJECTED, verdict.reason))
            elif verdict.decision is Decision.REQUEUE:
                plans.append(ReturnPlan(tid, lease, restart_from_prompt(g), REQUEUED,
                                   verdict.reason))
            elif classify(g) is not Stage.READY:
                plans.append(ReturnPlan(tid, lease, g, RETURNED))
            elif bound is None:
                plans.append(ReturnPlan(tid, lease, g, COMPLETED,
                                   versions=[version_span(s) for s in g]))
            else:
                plans.append(ReturnPlan(tid, lease, g, COMPLETED, staleness=[
                    staleness(s, current) for s in g]))
        return plans

    def _publish(self, plans: Sequence[ReturnPlan]) -> None:
        """Publish the groups of ``plans`` (one publication each, record 0 naming the
        lease), once per attempt: a retry reuses the reference."""
        new: list[tuple[ReturnPlan, str, Publication]] = []
        for p in plans:
            records, deps = group_records(p.group)
            records = named_records(records, task_id=p.task_id,
                                    attempt_id=p.lease.attempt_id)
            content = content_digest(records, deps)
            with self._lock:
                known = self._published.get(p.lease.attempt_id)
            if known is not None:
                if known[0] != content:
                    raise IdempotencyConflict(
                        f"task {p.task_id!r} attempt {p.lease.attempt_id!r} was already "
                        "returned with other content; an attempt returns one group (take "
                        "the task again for a new attempt)")
                p.ref = known[1]
                continue
            new.append((p, content, Publication(records, tuple(deps))))
        if not new:
            return
        sid = "groups:" + digest([[p.lease.attempt_id, c] for p, c, _ in new])
        refs = self.store.publish_many([pub for _, _, pub in new], submission_id=sid)
        with self._lock:
            for (p, content, _), ref in zip(new, refs, strict=True):
                p.ref = ref
                self._published[p.lease.attempt_id] = (content, ref)
            while len(self._published) > ENDED_KEPT:
                self._published.popitem(last=False)

    def return_groups(self, groups: Iterable[SampleGroup]) -> list[Returned]:
        """Give groups back by their stage and state (module docstring); one ``Returned``
        per group, in order.  A group the queue refuses (``StaleAttempt``: its lease is
        gone) raises that error once the others are returned; retrying the same call
        returns the same outcomes (a completed group's receipt again)."""
        returned, _ = self.return_and_take(groups, 0)
        return returned

    def return_and_take(self, groups: Iterable[SampleGroup], count: int
                        ) -> tuple[list[Returned], list[SampleGroup]]:
        """``return_groups(groups)``, then ``take(count)`` (``count`` 0: no take): with
        ready groups among them, the take rides the call that completes them
        (``complete_and_take``: one controller round trip instead of two).  The returns
        keep their rules and retries; the take keeps its request id until answered.  If
        the returns raise (a stale lease) or the inputs cannot be read, the groups just
        leased are given back unspent before the error is raised: a retry returns the
        same outcomes and takes again."""
        self._check_usable()
        if count != 0:
            check_count(count)
        groups = list(groups)
        plans = self._plans(groups, self._serving()) if groups else []
        self._publish([p for p in plans if p.action in (COMPLETED, RETURNED, REQUEUED)])
        out: dict[str, Returned] = {}
        errors: list[BaseException] = []
        self._release([p for p in plans if p.action == RELEASED], out, errors)
        for p in plans:
            if p.action == REJECTED:
                self._reject(p, "Stale", out, errors)
        got = self._complete([p for p in plans if p.action == COMPLETED], out, errors,
                             take=count)
        try:
            self._yield([p for p in plans if p.action in (RETURNED, REQUEUED)], out, errors)
            if errors:
                raise errors[0]
        except BaseException:
            if got is not None:  # not handed to the caller: unspent back to the queue
                self._give_back(got.assignments)
            raise
        returned = [out[p.task_id] for p in plans]
        if not count:
            return returned, []
        if got is None:  # nothing completed to ride on: a take of its own
            return returned, self.take(count)
        return returned, self._inputs(got)

    def _failed(self, p: ReturnPlan, e: BaseException, errors: list[BaseException]) -> None:
        if isinstance(e, (StaleAttempt, LeaseExpired)):
            self._end(p.task_id)  # the lease is gone: nothing of it is ours any more
            if p.ref is not None:
                # the queue will never adopt this attempt's group: its bytes need no
                # staging protection (else they would stay until this writer retires)
                self.store.release_publications([p.ref])
        errors.append(e)

    def _release(self, plans: list[ReturnPlan], out: dict[str, Returned],
                 errors: list[BaseException]) -> None:
        if not plans:
            return
        rid = "release:" + digest(sorted(p.lease.attempt_id for p in plans))
        outcomes = self.controller.release([p.lease for p in plans], request_id=rid)
        for p, o in zip(plans, outcomes, strict=True):
            if o == "released":
                self._end(p.task_id)
                out[p.task_id] = Returned(p.task_id, RELEASED, classify(p.group),
                                          reason=p.reason)
            else:
                self._failed(p, StaleAttempt(
                    f"task {p.task_id!r}: lease {p.lease.attempt_id!r} is no longer current "
                    "(it expired or was taken over); nothing to release"), errors)

    def _reject(self, p: ReturnPlan, category: str, out: dict[str, Returned],
                errors: list[BaseException]) -> None:
        try:
            self.controller.reject(p.lease, category=category, reason=p.reason)
        except StrawError as e:
            self._failed(p, e, errors)
            return
        self._end(p.task_id)
        out[p.task_id] = Returned(p.task_id, REJECTED, classify(p.group), reason=p.reason)

    def _complete(self, plans: list[ReturnPlan], out: dict[str, Returned],
                  errors: list[BaseException], *, take: int = 0) -> AcquireResult | None:
        """Complete ``plans``; with ``take``, lease that many groups in the same call
        (its result; None when nothing was completed, so nothing taken)."""
        if not plans:
            return None
        items = [{"lease": p.lease, "result_ref": p.ref, "staleness": p.staleness}
                 if p.versions is None else
                 {"lease": p.lease, "result_ref": p.ref, "versions": p.versions}
                 for p in plans]
        got = None
        if take:
            outcomes, got = self.controller.complete_and_take(
                items, self.worker_id, take, request_id=self._take_id("return"))
            self._answered("return")
        else:
            outcomes = self.controller.complete_many(items)
        for p, o in zip(plans, outcomes, strict=True):
            if isinstance(o, BaseException):
                self._failed(p, o, errors)
            else:
                self._end(p.task_id)
                out[p.task_id] = Returned(p.task_id, COMPLETED, Stage.READY, receipt=o)
        return got

    def _update(self, p: ReturnPlan) -> dict[str, Any]:
        with self._lock:
            taken = self._taken.get(p.task_id)
            spec = taken[0] if taken is not None else self._ended[p.task_id][1]
        stage = classify(p.group)
        return {"lease": p.lease, "input_ref": p.ref, "priority": priority(p.group),
                "scheduling_key": scheduling_key(p.group),
                "metadata": {**spec.metadata, "stage": stage.name.lower(), "returned": True}}

    def _yield(self, plans: list[ReturnPlan], out: dict[str, Returned],
               errors: list[BaseException]) -> None:
        if not plans:
            return
        updates = [self._update(p) for p in plans]
        try:  # publish first (above), then one transaction for the whole batch
            self.controller.yield_groups(updates, request_id="return:" + digest(updates))
            done = plans
        except (StaleAttempt, LeaseExpired):
            # the batch holds a lease that is gone: return the others one by one
            done = []
            for p, u in zip(plans, updates, strict=True):
                try:
                    self.controller.yield_groups([u], request_id="return:" + digest([u]))
                    done.append(p)
                except StrawError as e:
                    self._failed(p, e, errors)
        for p in done:
            self._end(p.task_id)
            out[p.task_id] = Returned(p.task_id, p.action, classify(p.group), reason=p.reason)

    def complete(self, groups: Iterable[SampleGroup]) -> list[CommitReceipt]:
        """Complete ready groups; their receipts.  A group that is not ready (or that the
        staleness bound or its captures turn away) is a ``ValueError``, before anything
        is returned."""
        self._check_usable()
        groups = list(groups)
        for i, p in enumerate(self._plans(groups, self._serving())):
            if p.action != COMPLETED:
                why = p.reason or ("it is not ready (every sample completed or truncated, "
                                   "with a reward)")
                raise ValueError(f"groups[{i}] (task {p.task_id!r}) cannot be completed: "
                                 f"{why}; return it with return_groups()")
        receipts = [r.receipt for r in self.return_groups(groups)]
        return [r for r in receipts if r is not None]

    def reject(self, group: SampleGroup, reason: str) -> Returned:
        """Fail a filtered group without retry, with its reason (category ``Filtered``)."""
        self._check_usable()
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("a filtered group is rejected with its reason (a non-empty str)")
        tid, lease, _ = self._lease_for(group, "group")
        out: dict[str, Returned] = {}
        errors: list[BaseException] = []
        self._reject(ReturnPlan(tid, lease, group, REJECTED, reason), "Filtered", out, errors)
        if errors:
            raise errors[0]
        return out[tid]

    def save_progress(self, groups: Iterable[SampleGroup]) -> str:
        """Make each group the durable input of its task, keeping the leases: if this
        process dies, the next attempt resumes from here, not from the prompt.  Groups
        whose captures do not cover their tokens are a ``ValueError`` (their continuation
        would not be replayable)."""
        self._check_usable()
        groups = list(groups)
        plans = []
        for i, g in enumerate(groups):
            tid, lease, _ = self._lease_for(g, f"groups[{i}]")
            if not captures_cover_group(g):
                raise ValueError(f"groups[{i}] (task {tid!r}): its captures do not cover its "
                                 "tokens; save progress only of consistent groups")
            plans.append((tid, lease, g))
        if not plans:
            return "saved"
        pubs, contents = [], []
        for tid, _, g in plans:
            records, deps = group_records(g)
            records = named_records(records, task_id=tid)
            contents.append(content_digest(records, deps))
            pubs.append(Publication(records, tuple(deps)))
        key = digest([[lease.attempt_id, c]
                      for (_, lease, _), c in zip(plans, contents, strict=True)])
        refs = self.store.publish_many(pubs, submission_id="progress:" + key)
        updates = [{"lease": lease, "input_ref": ref}
                   for (_, lease, _), ref in zip(plans, refs, strict=True)]
        return self.controller.save_progress(updates, request_id="progress:" + key)

    # --- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Stop the heartbeat and release every held lease (no failure spent: the tasks
        resume from their durable inputs).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            held = list(self._leases.values())
        if held:
            self.controller.release(held, request_id="close:" + digest(
                sorted(le.attempt_id for le in held)))
            for le in held:
                self._end(le.task_id)

    def __enter__(self) -> GenerationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["GenerationClient", "Returned", "COMPLETED", "RETURNED", "REQUEUED", "RELEASED",
           "REJECTED", "HEARTBEAT_BATCH"]
