"""Rollout conformance (issue 14 item 7): the REAL rollout layer (``RolloutController``, two
``GenerationClient``s, a ``BatchBuilder`` and a trainer) on one ``SimFS`` pool with a
``ManualClock``, driven by a Hypothesis ``RuleBasedStateMachine`` whose rules mirror the
actions of ``spec/rollout.py``, with RL1-RL5 checked on the engine's observable state after
every step.

Processes: the *manager* (SimFS client ``manager``: the controller, its ``Coordinator`` and
the builder, which shares that coordinator, as in a job) and the generation workers ``w0``
and ``w1`` (one SimFS client and store each; heartbeats off, the machine renews nothing, so
leases expire only when a rule advances the clock past ``LEASE_SECONDS``).

Rules and the spec actions they mirror:

* ``take``: ``controller_read``/``controller_publish``/``controller_submit`` (a take that
  finds nothing pending refills) and ``worker_take``;
* ``generate``: ``worker_generate`` (volatile: one more token on every sample; the group is
  ready after ``STEPS`` steps, its samples completed with rewards);
* ``yield_partial``: ``worker_yield_partial`` (``return_groups`` of a partial group);
* ``complete``: ``worker_complete`` with optionally a lost reply and its retry
  (``worker_complete_retry``: the same receipt);
* a return refused with ``StaleAttempt``/``LeaseExpired``: ``worker_drop_stale``;
* ``expire``: the clock passes every lease's deadline (``expire``);
* ``crash_worker``: a worker dies, optionally in the middle of a return (``crash_worker``);
* ``crash_manager``: the manager process dies, optionally in the middle of a take (a
  refill), a ``next_batch`` or a ``finish_batch`` (``crash_controller`` and
  ``crash_builder``); a power loss instead of a kill drops every client's unsynced data and
  restarts the workers too; the manager reopens with ``recover=True`` (its cursor from the
  queue's producer state, the builder from its saved consumer state);
* ``crash_builder``: the builder alone dies after its k-th queue call of a ``next_batch``
  (the call made, its reply lost); a new builder replays the batch;
* ``next_batch``: ``builder_select``/``builder_plan``/``builder_hooks``/``builder_ready``;
* ``finish``: ``trainer_finish`` then ``builder_ack`` (``finish_batch``);
* ``collect``: ``collect`` (``collect_garbage``).

Checks (``check_rl*``, after every step, each failure naming the ids involved):

* **RL1**: the prompt tasks in the queue are exactly group indices ``0..cursor-1`` (the
  committed cursor: the producer state) and, per epoch, the epoch's order, each dataset
  index once;
* **RL2**: per prompt task at most one commit; every accepted group once seen stays in the
  log with the same commit and digest, is readable until its batch finished, and is in at
  most one collection (batch);
* **RL3**: a batch's durable plan never changes, and every run of the reward hook saw
  exactly the groups of a plan already durable (checked inside the hook);
* **RL4**: every input position the builder's consumer processed belongs to a batch whose
  training the trainer finished;
* **RL5**: the durable input of every unfinished prompt task holds at least the progress
  of the last partial group made durable for it, and a take hands that progress out.

Profiles: ``ci`` (default, about 30 s) and ``deep`` (``STRAW_HYPOTHESIS_PROFILE=deep``).
``pytest -s`` prints the steps by rule.  Random runs spend their fault budget over the
whole run, so crashes inside a ``next_batch`` or a ``finish_batch`` are rare there: a
sweep crashes the manager at every other filesystem call of each, with the same checks.

Negative controls (the spec's mutants, on the engine): a builder that acknowledges at
ready (RL4), one that runs the hooks before the plan is durable (RL3), and a controller
that saves its cursor apart from its tasks (RL1: caught by the crash sweep of a refill,
which the real controller passes at every point) are each caught by the checks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fault_injection.queue_campaign import crash_in
from fault_injection.simfs import SimFS
from straw import LeaseExpired, SharedFilesystemStore, StaleAttempt
from straw.clock import ManualClock
from straw.refs import RecordSetRef
from straw.rollout import EnvironmentMix, RolloutConfig, Status
from straw.rollout.builder import COLLECTION_PREFIX, BatchBuilder
from straw.rollout.codec import group_from_records
from straw.rollout.controller import RolloutController
from straw.rollout.data_source import (
    PRODUCER_ID,
    PROMPT_PREFIX,
    cursor_from_producer_state,
)
from straw.rollout.generation import GenerationClient

ROOT = "/pool"
RUN = "job"
MANAGER = "manager"
WORKERS = ("w0", "w1")
PROMPTS = [(1, 2), (3, 4), (5, 6)]  # 3 prompts: a refill of 8 groups spans 3 epochs
STEPS = 2  # generation steps to a ready group
LEASE_SECONDS = 100.0
BATCH = 2  # groups per batch
DP = 2  # ranks
# crashes, expiries and lost replies per run (as the spec's fault budget): the rest of a run's
# steps make progress, so runs reach batches, training and collection after faults
MAX_FAULTS = 3
FAULT_SPACING = 12
CONFIG = RolloutConfig(n_samples_per_prompt=2, lease_seconds=LEASE_SECONDS)
STEP_COUNT: Counter[str] = Counter()


class BuilderCrash(Exception):
    """The builder process died right after a queue call (its reply is lost)."""


class CrashingCoordinator:
    """The builder's view of the coordinator that dies after the k-th mutating call."""

    MUTATING = frozenset({"submit_tasks", "acquire", "complete_task", "plan_batch",
                          "batch_ready", "save_consumer_state"})

    def __init__(self, inner: Any, after: int) -> None:
        self._inner = inner
        self._left = after

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.MUTATING:
            return attr

        def call(*a: Any, **k: Any) -> Any:
            out = attr(*a, **k)
            self._left -= 1
            if self._left == 0:
                raise BuilderCrash(f"builder died after {name}")
            return out
        return call


def reward_of(group_index: int, j: int) -> float:
    """Unique per sample: the reward hook recognises the groups it is given."""
    return float(group_index * 10 + j)


def progress_of(group: Any) -> int:
    return group.samples[0].response_length


def step(group: Any) -> Any:
    """One generation step on every sample; ready (completed, rewarded) at STEPS."""
    done = progress_of(group) + 1 == STEPS
    samples = []
    for j, s in enumerate(group.samples):
        base = s.tokens or tuple(s.prompt)
        samples.append(dataclasses.replace(
            s, tokens=base + (100 + progress_of(group),), response_length=s.response_length + 1,
            status=Status.COMPLETED if done else Status.ABORTED,
            reward=reward_of(group.group_index, j) if done else None))
    return dataclasses.replace(group, samples=tuple(samples))


def open_store(sim: SimFS, client: str, clock: ManualClock) -> SharedFilesystemStore:
    return SharedFilesystemStore(ROOT, RUN, writer_id=client, fs=sim.client(client), clock=clock,
                                 reserve_bytes=0, visibility_retries=1)


class RolloutConformance(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**32 - 1))
    def setup(self, seed: int) -> None:
        self.sim = SimFS(seed, record_trace=False)
        self.clock = ManualClock()
        self.manager_store: SharedFilesystemStore | None = None
        self.controller: RolloutController | None = None
        self.builder: BatchBuilder | None = None
        self.clients: dict[str, GenerationClient] = {}
        self.stores: dict[str, SharedFilesystemStore] = {}
        self.held: dict[str, dict[str, Any]] = {w: {} for w in WORKERS}  # task -> group
        self.best: dict[str, int] = {}  # task -> progress of its last durable partial group
        self.accepted: dict[str, tuple[str, str]] = {}  # task -> (commit id, digest)
        self.plans: dict[str, str] = {}  # batch id -> plan digest, when first seen
        self.ready: list[str] = []  # ready batch ids, in rollout order
        self.trained: set[str] = set()  # the trainer's durable record (with the model)
        self.rollout = 0  # the trainer's next rollout id
        self.building: str | None = None  # rollout id of the next_batch under way
        self.hook_errors: list[str] = []
        self.faults = 0
        self.steps = 0  # rules run so far
        self.builder_crashed = False
        self.log: list[Any] = []  # the commit log as read so far
        self.collected: dict[str, list[int]] = {}  # batch id -> its groups' positions
        self.inputs: dict[str, list[int]] = {}  # ready batch id -> its input positions
        self.open_manager(recover=False)
        for w in WORKERS:
            self.open_worker(w)

    # --- processes ----------------------------------------------------------------------
    def open_manager(self, *, recover: bool) -> None:
        self.manager_store = open_store(self.sim, MANAGER, self.clock)
        self.controller = RolloutController(self.manager_store, PROMPTS, config=CONFIG,
                                            recover=recover, clock=self.clock, shuffle=True,
                                            seed=7)
        self.controller.coordinator.snapshot_every = 3  # recoveries read snapshots too
        self.open_builder()
        for c in self.clients.values():
            # a worker's RemoteController reconnects to the restarted controller
            c.controller = self.controller

    def open_builder(self) -> None:
        assert self.controller is not None and self.manager_store is not None
        self.builder = BatchBuilder(self.controller.coordinator, self.manager_store,
                                    EnvironmentMix.single(BATCH), dp_size=DP, config=CONFIG,
                                    reward_hook=self.reward_hook)

    def open_worker(self, w: str) -> None:
        self.stores[w] = open_store(self.sim, w, self.clock)
        self.clients[w] = GenerationClient(self.controller, self.stores[w], worker_id=w,
                                           config=CONFIG, clock=self.clock, heartbeat=False)
        self.held[w] = {}

    @property
    def coord(self) -> Any:
        assert self.controller is not None
        return self.controller.coordinator

    # --- the reward hook: RL3 is checked where the hook runs ----------------------------
    def reward_hook(self, raw: list[list[Any]]) -> list[list[float]]:
        STEP_COUNT["(hook runs)"] += 1
        seen = [int(r[0]) // 10 for r in raw]
        rid = self.building
        receipt = None if rid is None else self.coord.lookup_submission(COLLECTION_PREFIX + rid)
        view = None if receipt is None else self.coord.get_batch("batch:" + receipt.commit_id)
        if view is None:
            self.hook_errors.append(f"RL3: the reward hook of rollout {rid} ran on groups "
                                    f"{seen} before the batch's plan was durable")
        else:
            plan = self.read_json(RecordSetRef.from_dict(view["plan_ref"]))
            planned = [self.group_at(g["position"]) for g in plan["groups"]]
            if planned != seen:
                self.hook_errors.append(f"RL3: the reward hook of {view['batch_id']} ran on "
                                        f"groups {seen}, its durable plan holds {planned}")
        return [list(map(float, r)) for r in raw]

    # --- observation helpers ------------------------------------------------------------
    def read_json(self, ref: RecordSetRef) -> Any:
        assert self.manager_store is not None
        (rec,) = list(self.manager_store.read(ref))
        return json.loads(bytes(rec.payload))

    def commits(self) -> list[Any]:
        """The commit log, read on from where the last read ended: what ``read_commits``
        returned was durable, and positions a collection released cannot be read again
        (``check_rl2`` re-reads every position whose batch has not trained)."""
        while True:
            page = self.coord.read_commits(len(self.log), 256)
            self.log += page.commits
            if not page.commits:
                return self.log
    def group_at(self, position: int) -> int:
        c = self.commits()[position]
        return int(c.task_id[len(PROMPT_PREFIX):])

    def durable_group(self, tid: str) -> Any:
        status = self.coord.task_status(tid)
        ref = RecordSetRef.from_dict(status["spec"]["input_ref"])
        assert self.manager_store is not None
        return group_from_records(list(self.manager_store.read(ref)))

    def collections(self) -> dict[str, list[int]]:
        """batch id -> the commit positions of its groups (every collection committed; each
        read once, when first seen: a collection of a trained batch may be reclaimed)."""
        for c in self.commits():
            bid = "batch:" + c.commit_id
            if c.task_id.startswith(COLLECTION_PREFIX) and bid not in self.collected:
                body = self.read_json(c.result_ref)
                self.collected[bid] = [g["position"] for g in body["groups"]]
        return self.collected

    # --- the checks ---------------------------------------------------------------------
    def check_rl1(self) -> None:
        cursor = cursor_from_producer_state(self.coord.producer_state(PRODUCER_ID))
        n = 0 if cursor is None else cursor.sample_group_index
        metas = [self.coord.task_status(t)["spec"]["metadata"]
                 for t in self.coord.tasks if t.startswith(PROMPT_PREFIX)]
        groups = sorted(m["group_index"] for m in metas)
        assert groups == list(range(n)), (
            f"RL1: the queue holds prompt groups {groups} but the committed cursor is at "
            f"group {n}: each group below the cursor must be queued once, none above it")
        by_epoch: dict[int, list[int]] = {}
        for m in sorted(metas, key=lambda m: m["group_index"]):
            by_epoch.setdefault(m["epoch_id"], []).append(m["dataset_index"])
        assert self.controller is not None
        for epoch, indices in by_epoch.items():
            want = self.controller.source.order(epoch)[:len(indices)]
            assert indices == want, (f"RL1: epoch {epoch} admitted dataset indices {indices}, "
                                     f"not its order {want} (each index once per epoch)")

    def check_rl2(self) -> None:
        commits = self.commits()
        prompt = [c for c in commits if c.task_id.startswith(PROMPT_PREFIX)]
        per_task = Counter(c.task_id for c in prompt)
        twice = sorted(t for t, k in per_task.items() if k > 1)
        assert not twice, f"RL2: groups {twice} were accepted more than once"
        for c in prompt:
            self.accepted.setdefault(c.task_id, (c.commit_id, c.result_ref.digest))
        where: dict[int, str] = {}
        for bid, positions in self.collections().items():
            for p in positions:
                assert p not in where, (f"RL2: the group committed at {p} ({commits[p].task_id})"
                                        f" is in batches {where[p]} and {bid}")
                where[p] = bid
        assert self.manager_store is not None
        for c in prompt:
            bid = where.get(c.position)
            if bid is not None and bid in self.trained:
                continue  # its batch trained: its payload may be reclaimed
            try:
                (again,) = self.coord.read_commits(c.position, 1).commits
                assert again == c, f"its receipt changed from {c} to {again}"
                self.manager_store.checked_manifest(c.result_ref)
            except Exception as e:  # noqa: BLE001 - any failure is the violation
                raise AssertionError(f"RL2: the accepted group of {c.task_id} (batch {bid}, "
                                     f"not finished training) is lost: {e!r}") from e

    def check_rl3(self) -> None:
        assert not self.hook_errors, self.hook_errors[0]
        for bid in self.collections():
            if bid in self.trained:
                continue  # trained: its plan may be reclaimed
            view = self.coord.get_batch(bid)
            if view is None:
                continue
            digest = self.read_json(RecordSetRef.from_dict(view["plan_ref"]))["digest"]
            first = self.plans.setdefault(bid, digest)
            assert digest == first, f"RL3: the plan of {bid} changed from {first} to {digest}"

    def check_rl4(self) -> None:
        assert self.builder is not None
        view = self.coord.load_consumer_state(self.coord.consumer_id)
        if view is None:
            return
        processed = set(range(view["processed_cursor"]))
        finished: list[str] = []
        if "progress_ref" in view:
            progress = self.read_json(RecordSetRef.from_dict(view["progress_ref"]))
            processed |= set(progress["processed_positions"])
            finished = progress["finished_batches"]
        untrained = sorted(set(finished) - self.trained)
        assert not untrained, f"RL4: batches {untrained} are finished but were never trained"
        allowed: set[int] = set()
        for bid in self.trained:
            allowed |= set(self.inputs[bid])
        early = sorted(processed - allowed)
        assert not early, (f"RL4: input positions {early} are acknowledged but no batch "
                           f"holding them finished training (trained: {sorted(self.trained)})")

    def check_rl5(self) -> None:
        for tid, best in self.best.items():
            status = self.coord.task_status(tid)
            if status["state"] == "completed":
                continue
            got = progress_of(self.durable_group(tid))
            assert got >= best, (f"RL5: task {tid} holds progress {got} as its input, after a "
                                 f"partial group of progress {best} was durable")

    @invariant()
    def rollout_invariants(self) -> None:
        if not hasattr(self, "controller"):
            return
        STEP_COUNT["(checks)"] += 1
        self.steps += 1
        self.check_rl1()
        self.check_rl2()
        self.check_rl3()
        self.check_rl4()
        self.check_rl5()

    # --- preconditions -------------------------------------------------------------------
    def holds(self, pred: Any) -> bool:
        return any(pred(g) for w in WORKERS for g in self.held[w].values())

    def batchable(self) -> bool:
        """Enough accepted groups for the next batch (or one planned, not returned yet)."""
        return len(self.accepted) >= (self.rollout + 1) * BATCH

    def fault_allowed(self) -> bool:
        """Within the budget, and spread over the run (a fault every FAULT_SPACING steps at
        most): runs reach batches, training and collection between faults."""
        return self.faults < MAX_FAULTS and self.steps >= FAULT_SPACING * (self.faults + 1)

    def fault(self) -> None:
        self.faults += 1

    # --- workers ------------------------------------------------------------------------
    def stale(self, w: str, tid: str, e: BaseException) -> None:
        """worker_drop_stale: the lease ended (expired or revoked by a restart)."""
        assert isinstance(e, (StaleAttempt, LeaseExpired)), e
        STEP_COUNT["drop_stale"] += 1
        self.held[w].pop(tid, None)

    @precondition(lambda self: any(len(self.held[w]) < 2 for w in WORKERS))
    @rule(w=st.sampled_from(WORKERS), count=st.integers(1, 2))
    def take(self, w: str, count: int) -> None:
        if len(self.held[w]) >= 2:
            return  # a worker generates at most two groups at a time
        STEP_COUNT["take"] += 1
        for g in self.clients[w].take(count):
            tid = f"{PROMPT_PREFIX}{g.group_index}"
            # RL5: the take hands out the durable progress, not the prompt
            assert progress_of(g) >= self.best.get(tid, 0), (
                f"RL5: {w} took {tid} at progress {progress_of(g)}, its durable partial "
                f"group had {self.best[tid]}")
            self.held[w][tid] = g

    @precondition(lambda self: self.holds(lambda g: progress_of(g) < STEPS))
    @rule(w=st.sampled_from(WORKERS), k=st.integers(0, 3))
    def generate(self, w: str, k: int) -> None:
        live = sorted(t for t, g in self.held[w].items() if progress_of(g) < STEPS)
        if live:
            tid = live[k % len(live)]
            STEP_COUNT["generate"] += 1
            self.held[w][tid] = step(self.held[w][tid])

    @precondition(lambda self: self.holds(lambda g: 0 < progress_of(g) < STEPS))
    @rule(w=st.sampled_from(WORKERS), k=st.integers(0, 3))
    def yield_partial(self, w: str, k: int) -> None:
        part = sorted(t for t, g in self.held[w].items() if 0 < progress_of(g) < STEPS)
        if not part:
            return
        tid = part[k % len(part)]
        g = self.held[w][tid]
        try:
            (r,) = self.clients[w].return_groups([g])
        except (StaleAttempt, LeaseExpired) as e:
            self.stale(w, tid, e)
            return
        assert r.action == "returned", r
        STEP_COUNT["yield_partial"] += 1
        self.best[tid] = max(self.best.get(tid, 0), progress_of(g))
        del self.held[w][tid]

    @precondition(lambda self: self.holds(lambda g: progress_of(g) == STEPS))
    @rule(w=st.sampled_from(WORKERS), k=st.integers(0, 3), lost=st.booleans())
    def complete(self, w: str, k: int, lost: bool) -> None:
        ready = sorted(t for t, g in self.held[w].items() if progress_of(g) == STEPS)
        if not ready:
            return
        tid = ready[k % len(ready)]
        g = self.held[w][tid]
        try:
            (r,) = self.clients[w].return_groups([g])
        except (StaleAttempt, LeaseExpired) as e:
            self.stale(w, tid, e)
            return
        assert r.action == "completed" and r.receipt is not None, r
        STEP_COUNT["complete"] += 1
        if lost:  # the reply was lost: the retry returns the same receipt (RL2)
            (again,) = self.clients[w].return_groups([g])
            assert again.receipt == r.receipt, (f"RL2: the retried completion of {tid} got "
                                                f"{again.receipt}, first {r.receipt}")
            STEP_COUNT["complete_retry"] += 1
        del self.held[w][tid]

    @precondition(lambda self: self.fault_allowed())
    @rule(w=st.sampled_from(WORKERS), nth=st.integers(0, 12))
    def crash_worker(self, w: str, nth: int) -> None:
        """The worker dies (mid-return when nth > 0 and it holds a returnable group)."""
        self.fault()
        returnable = sorted(t for t, g in self.held[w].items() if progress_of(g) > 0)
        if nth and returnable:
            self.sim.crash_at(nth, client=w)
            try:
                self.clients[w].return_groups([self.held[w][returnable[0]]])
                STEP_COUNT["crash_worker (after its return)"] += 1
            except BaseException as e:  # noqa: BLE001 - only a simulated crash is expected
                if crash_in(e) is None and not isinstance(e, (StaleAttempt, LeaseExpired)):
                    raise
                STEP_COUNT["crash_worker (mid-return)"] += 1
            self.sim.plan.crash_points.clear()
            # a crash may leave a partial group durable that this machine did not see as
            # returned; RL5's history follows what the queue made durable
            tid = returnable[0]
            g = self.held[w][tid]
            if 0 < progress_of(g) < STEPS and \
                    self.coord.task_status(tid)["state"] == "pending" and \
                    progress_of(self.durable_group(tid)) == progress_of(g):
                self.best[tid] = max(self.best.get(tid, 0), progress_of(g))
        else:
            STEP_COUNT["crash_worker"] += 1
        self.sim.kill_client(w)
        self.open_worker(w)

    @precondition(lambda self: self.fault_allowed())
    @rule()
    def expire(self) -> None:
        self.fault()
        STEP_COUNT["expire"] += 1
        self.clock.advance(LEASE_SECONDS + 1)

    # --- manager: controller + builder --------------------------------------------------
    @precondition(lambda self: self.fault_allowed())
    @rule(nth=st.integers(0, 40), pick=st.integers(0, 5), power=st.booleans())
    def crash_manager(self, nth: int, pick: int, power: bool) -> None:
        """The manager process dies, mid-operation when nth > 0 (in a next_batch or a
        finish_batch when one has work, else in a take), and restarts."""
        self.fault()
        ops = [op for op, able in (("next_batch", self.batchable()),
                                   ("finish", len(self.trained) < len(self.ready)))
               if able] or ["take"]
        op = ops[pick % len(ops)]
        if nth and op == "take" and pick % 2:
            # a take without a refill makes only a few manager syscalls: half of the take
            # crashes land among its first three, so runs reach a crash inside one (drawn
            # from 1..40 alone, 27 crashes could all land after it: a CI run did); the
            # other half still reach any step of a refill
            nth = 1 + nth % 3
        if nth:
            self.sim.crash_at(nth, client=MANAGER)
            try:
                if op == "take":
                    self.clients[WORKERS[0]].take(1)
                elif op == "next_batch":
                    self.next_batch()
                else:
                    self.finish()
                STEP_COUNT[f"crash_manager (after {op})"] += 1
            except BaseException as e:  # noqa: BLE001 - only a simulated crash is expected
                if crash_in(e) is None:
                    raise
                STEP_COUNT[f"crash_manager (mid-{op})"] += 1
            self.sim.plan.crash_points.clear()
        else:
            STEP_COUNT["crash_manager"] += 1
        if power:
            self.sim.crash("clear-cache")
            STEP_COUNT["power_loss"] += 1
        else:
            self.sim.kill_client(MANAGER)
        self.open_manager(recover=True)
        if power:  # every process restarts after a power loss
            for w in WORKERS:
                self.open_worker(w)

    @precondition(lambda self: not self.builder_crashed and self.batchable())
    @rule(after=st.integers(1, 6))
    def crash_builder(self, after: int) -> None:
        """The builder alone dies after its ``after``-th queue call of a next_batch; a new
        builder (on the same coordinator) replays the batch from what is durable.  Once a
        run (its own budget: the other faults are spent early in most runs)."""
        self.builder_crashed = True
        assert self.builder is not None
        self.builder.coord = CrashingCoordinator(self.coord, after)
        try:
            self.next_batch()
            STEP_COUNT["crash_builder (after next_batch)"] += 1
        except BuilderCrash:
            STEP_COUNT["crash_builder (mid-next_batch)"] += 1
        self.builder.coord = self.coord
        # the owner is gone: its consumer is given up, then a new builder opens it
        self.coord.close_consumer(self.coord.consumer_id, self.builder._token)
        self.open_builder()

    def next_batch(self) -> None:
        assert self.builder is not None
        rid = str(self.rollout)
        self.building = rid
        try:
            refs = self.builder.next_batch(rid)
        finally:
            self.building = None
        if refs is None:
            return
        bid = refs[0].batch_id
        assert len(refs) == DP and all(r.batch_id == bid for r in refs)
        view = self.coord.get_batch(bid)
        assert view is not None and view["ready"], f"{bid} was returned but is not ready"
        plan = self.read_json(RecordSetRef.from_dict(view["plan_ref"]))
        planned = sorted(self.group_at(g["position"]) for g in plan["groups"])
        assert self.manager_store is not None
        shard = sorted({s["group_index"] for r in refs
                        for s in r.load(self.manager_store, rank=r.rank).samples})
        assert shard == planned, (f"RL3: the shards of {bid} hold groups {shard}, its plan "
                                  f"{planned}")
        self.ready.append(bid)
        self.inputs[bid] = list(view["input_positions"])
        self.rollout += 1

    @precondition(lambda self: self.batchable())
    @rule()
    def build(self) -> None:
        STEP_COUNT["next_batch"] += 1
        self.next_batch()

    def finish(self) -> None:
        assert self.builder is not None
        todo = [b for b in self.ready if b not in self.trained or not self.finished(b)]
        if not todo:
            return
        bid = todo[0]
        self.trained.add(bid)  # trainer_finish: durable with the model
        self.builder.finish_batch(bid)  # builder_ack

    def finished(self, bid: str) -> bool:
        view = self.coord.get_batch(bid)
        return view is None or bool(view["finished"])  # None: finished and collected

    @precondition(lambda self: len(self.trained) < len(self.ready))
    @rule()
    def train(self) -> None:
        STEP_COUNT["finish"] += 1
        self.finish()

    @precondition(lambda self: bool(self.trained))
    @rule()
    def collect(self) -> None:
        STEP_COUNT["collect"] += 1
        self.coord.collect_garbage()

    def teardown(self) -> None:
        if not hasattr(self, "controller"):
            return
        for c in self.clients.values():
            c._closed = True  # their leases die with the run; nothing to release
        for closing in (self.builder, self.controller):
            try:
                if closing is not None:
                    closing.close()
            except Exception:  # noqa: BLE001 - a broken run may leave them unusable
                pass


PROFILES = {
    "ci": settings(max_examples=50, stateful_step_count=80, deadline=None,
                   suppress_health_check=list(HealthCheck)),
    "deep": settings(max_examples=500, stateful_step_count=80, deadline=None,
                     suppress_health_check=list(HealthCheck)),
}


def test_rollout_conformance() -> None:
    STEP_COUNT.clear()
    profile = os.environ.get("STRAW_HYPOTHESIS_PROFILE", "ci")
    RolloutConformance.TestCase.settings = PROFILES[profile]
    RolloutConformance.TestCase().runTest()
    print(f"\nrollout conformance ({profile}): " +
          ", ".join(f"{k} {v}" for k, v in sorted(STEP_COUNT.items())))
    # the runs did reach every part of the layer
    for what in ("complete", "complete_retry", "yield_partial", "drop_stale", "(hook runs)",
                 "finish", "collect", "crash_manager (mid-take)",
                 "crash_worker (mid-return)"):
        assert STEP_COUNT[what] > 0, f"no run reached {what}: {dict(STEP_COUNT)}"


# --- negative controls: deliberately broken layers are caught --------------------------------


def fresh_machine(seed: int = 0) -> RolloutConformance:
    m = RolloutConformance()
    m.setup(seed=seed)
    return m


def run_steps(m: RolloutConformance, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run rules by name, each followed by the checks (as Hypothesis does)."""
    m.rollout_invariants()
    for name, kwargs in steps:
        getattr(m, name)(**kwargs)
        m.rollout_invariants()


def accept_two_groups() -> list[tuple[str, dict[str, Any]]]:
    one = [("take", {"w": "w0", "count": 1}), ("generate", {"w": "w0", "k": 0}),
           ("generate", {"w": "w0", "k": 0}), ("complete", {"w": "w0", "k": 0, "lost": False})]
    return one + one


def crash_sweep(prefix: list[tuple[str, dict[str, Any]]], op: str,
                then: list[tuple[str, dict[str, Any]]]) -> int:
    """After ``prefix``, the manager crashes at its nth filesystem call of ``op`` for every
    other n (a kill or a power loss, alternately), recovers, and the run goes on with
    ``then``; the checks run after every step.  Returns the calls ``op`` made."""
    STEP_COUNT.pop(f"crash_manager (after {op})", None)  # what other runs counted
    for nth in range(1, 400, 2):
        m = fresh_machine(nth)
        try:
            run_steps(m, prefix)
            m.crash_manager(nth=nth, pick=0, power=nth % 4 == 3)
            m.rollout_invariants()
            run_steps(m, then)
        finally:
            m.teardown()
        if STEP_COUNT.pop(f"crash_manager (after {op})", 0):
            return nth
    raise AssertionError(f"{op} never ended within 400 calls")


def test_a_manager_crash_at_every_point_of_a_batch_and_its_acknowledgement() -> None:
    """Systematic crashes where random runs rarely land: every filesystem call of a
    ``next_batch`` (collection, plan, hooks, shards, ready) and of a ``finish_batch``;
    after each, the recovered layer replays the same plan (RL3), acknowledges only after
    training (RL4) and keeps every accepted group (RL2)."""
    built = crash_sweep(accept_two_groups(), "next_batch",
                        [("build", {}), ("train", {}), ("collect", {})])
    finished = crash_sweep(accept_two_groups() + [("build", {})], "finish",
                           [("finish", {}), ("collect", {})])
    print(f"\nmanager crashes: next_batch {built} calls, finish_batch {finished} calls")
    assert built > 10 and finished > 3, (built, finished)
    # the builder alone, after each of its queue calls of a next_batch
    STEP_COUNT.pop("crash_builder (after next_batch)", None)
    for after in range(1, 12):
        m = fresh_machine(after)
        try:
            run_steps(m, accept_two_groups() + [("crash_builder", {"after": after}),
                                                ("build", {}), ("train", {}), ("collect", {})])
            assert m.trained, f"no batch trained after the builder crashed ({after})"
        finally:
            m.teardown()
        if STEP_COUNT.pop("crash_builder (after next_batch)", 0):
            break
    assert after > 3, f"a next_batch made only {after - 1} queue calls"


def test_a_builder_that_acknowledges_at_ready_is_caught(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """RL4 negative control (spec mutant ``ack_before_training``): the builder acknowledges
    a batch's inputs as soon as it is ready.  The same steps pass with the real builder."""
    steps = accept_two_groups() + [("build", {}), ("train", {})]
    m = fresh_machine()
    try:
        run_steps(m, steps)  # the real layer: RL1-RL5 hold
        assert m.trained and m.ready
    finally:
        m.teardown()
    real = BatchBuilder.next_batch

    def ack_at_ready(self: BatchBuilder, rollout_id: Any) -> Any:
        refs = real(self, rollout_id)
        if refs is not None:
            self.finish_batch(refs[0].batch_id)  # before the trainer trained on it
        return refs

    monkeypatch.setattr(BatchBuilder, "next_batch", ack_at_ready)
    m = fresh_machine()
    try:
        with pytest.raises(AssertionError, match="RL4"):
            run_steps(m, steps)
    finally:
        m.teardown()
    # the random machine finds it too
    RolloutConformance.TestCase.settings = settings(
        PROFILES["ci"], max_examples=200, database=None, phases=(Phase.generate,),
        report_multiple_bugs=False)
    with pytest.raises(AssertionError, match="RL4"):
        RolloutConformance.TestCase().runTest()


def test_a_builder_that_runs_hooks_before_the_plan_is_durable_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RL3 negative control (spec mutant ``hooks_before_plan``): the reward hook runs on
    the selection before ``plan_batch`` (the same steps pass with the real builder: the
    first negative control runs them)."""
    real = BatchBuilder._plan

    def hooks_first(self: BatchBuilder, batch_id: str, rid: str, receipt: Any,
                    groups: list[Any]) -> Any:
        self._rewards(batch_id, groups)  # the hooks, before the plan is durable
        return real(self, batch_id, rid, receipt, groups)

    monkeypatch.setattr(BatchBuilder, "_plan", hooks_first)
    m = fresh_machine()
    try:
        with pytest.raises(AssertionError, match="RL3: the reward hook of rollout 0 ran on"):
            run_steps(m, accept_two_groups() + [("build", {})])
    finally:
        m.teardown()


def test_a_controller_that_saves_its_cursor_apart_is_caught(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """RL1 negative control (spec mutant ``cursor_saved_apart``): a refill commits the
    advanced cursor in one transaction and its tasks in a second one.  A manager crash at
    every point of a take's refill: the real controller passes them all; the broken one
    is caught (a crash between the two transactions skips the refill's prompts)."""

    def sweep() -> list[str]:
        caught = []
        STEP_COUNT.pop("crash_manager (after take)", None)  # what other runs counted
        for nth in range(1, 200):
            m = fresh_machine(nth)
            try:
                m.crash_manager(nth=nth, pick=0, power=False)
                m.rollout_invariants()
            except AssertionError as e:
                caught.append(str(e))
            finally:
                m.teardown()
            if STEP_COUNT.pop("crash_manager (after take)", 0):
                return caught  # nth is past the take's last call: every point was tried
        raise AssertionError("the take's refill never ended within 200 calls")

    assert sweep() == []

    def cursor_apart(self: RolloutController, refill: Any, tasks: list[Any]) -> None:
        self.coordinator.submit_tasks(refill.request_id + ":cursor", [],
                                      producer_id=PRODUCER_ID,
                                      producer_state=refill.producer_state)
        self.coordinator.submit_tasks(refill.request_id, tasks)

    monkeypatch.setattr(RolloutController, "_submit", cursor_apart)
    caught = sweep()
    assert caught and all("RL1" in c for c in caught), caught
    print(f"\ncursor saved apart: {len(caught)} crash points caught; first: {caught[0]}")
