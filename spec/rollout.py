"""The rollout layer's state machine (issue 14, item 7): one readable file.

Role: what `straw.rollout` (controller, generation clients, batch builder, trainer) must
guarantee, stated **on top of the queue's guarantees** (`spec/actions.py` proves those: a
transaction is atomic and durable before its reply, a retried request id is answered from the
journal (Q7), a lease of an older attempt never commits (Q3), an expired lease returns its task
with its last durable input (D5, Q6)).  Here a queue transaction is therefore one atomic step,
and the rollout layer's own choices are what is explored:

* the **controller** reads prompts at its dataset cursor, publishes a refill's groups, then
  submits the tasks and the advanced cursor (producer state) in ONE transaction; it restarts
  from the committed cursor;
* a **generation worker** takes a prompt group under a lease, generates (volatile progress),
  persists a partial group for continuation (yield: progress becomes durable input), or
  completes a ready group (the accepted result), and may lose the reply and retry;
* the **batch builder** selects accepted groups not yet in any plan, makes the plan durable,
  then runs the reward/conversion hooks on it, publishes every rank's shard and marks the
  batch ready;
* the **trainer** trains a ready batch (finished = durable with the model), then the builder
  acknowledges the batch's inputs (the consumer cursor), after which collection may reclaim
  their payloads.

Faults: the controller, a worker, the builder and the trainer may crash (volatile state lost),
a lease may expire, a reply may be lost, a refill's publication may fail.

Abstractions: a dataset position ``pos = epoch * dataset + index`` (the per-epoch shuffle is a
bijection, so exactly-once over positions is exactly-once over indices); a group's
generation progress is a count of steps 0..``steps`` (``steps`` means ready: every sample
completed or truncated, with a reward); payload bytes are abstract (a group's payload exists
until collected).

Invariants (ids used in SPEC.md, tests and `straw/rollout/`):

* **RL1** exactly-once dataset admission per epoch: the queue holds exactly one prompt task
  per position below the committed cursor and none at or above it.
* **RL2** an accepted group is accepted at most once, never lost once accepted (its payload
  is not collected before the batch that trains it has finished), and planned in at most
  one batch (no group trained twice).
* **RL3** a planned batch never changes: hooks run only on the durable plan, and every run of
  a batch's hooks saw the same plan.
* **RL4** nothing is acknowledged before its training finished.
* **RL5** partial work is resumed, not restarted: a group's durable progress never decreases.

Each rule has a mutant (``RolloutMutants``) that the explorer must catch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

from spec.actions import Action

# Actors (Action.kind)
CONTROLLER = "controller"
WORKER = "worker"
BUILDER = "builder"
TRAINER = "trainer"
FAULT = "fault"

# Task status in the queue
PENDING = "pending"
LEASED = "leased"
DONE = "done"  # completed: the accepted group is the task's result


@dataclass(frozen=True)
class RolloutConfig:
    """A bounded run: positions = dataset * epochs; refills of ``refill`` groups; ``workers``
    generation workers; ``steps`` generation steps to a ready group; batches of ``batch``
    groups; ``faults`` crashes/expiries/lost replies/failed publishes in total."""

    name: str
    dataset: int
    epochs: int
    refill: int
    workers: int
    steps: int
    batch: int
    faults: int

    @property
    def positions(self) -> int:
        return self.dataset * self.epochs


# Bounds: positions are linear across epochs (``pos = epoch * dataset + index``), so an epoch
# boundary is not a behaviour of its own here and the bounded runs use one epoch; ``workers``
# and ``faults`` are what multiply interleavings, so the full set has one configuration for
# concurrency (two workers, one fault) and one for fault combinations (three faults).
CONFIGS: dict[str, RolloutConfig] = {
    c.name: c
    for c in (
        RolloutConfig("rollout-small", dataset=2, epochs=1, refill=1, workers=1, steps=2,
                      batch=1, faults=2),
        RolloutConfig("rollout-workers", dataset=3, epochs=1, refill=2, workers=2, steps=2,
                      batch=2, faults=1),
        RolloutConfig("rollout-faults", dataset=3, epochs=1, refill=2, workers=1, steps=2,
                      batch=2, faults=3),
    )
}
CONFIG_SETS: dict[str, tuple[str, ...]] = {
    "small": ("rollout-small",),
    "full": ("rollout-small", "rollout-workers", "rollout-faults"),
}


@dataclass(frozen=True)
class RolloutMutants:
    """One switch per broken variant; all False is the protocol straw.rollout implements."""

    # RL1: the refill commits the cursor in one transaction and its tasks in a second one
    # (controller_commit_cursor, then controller_commit_tasks): a crash between skips prompts.
    cursor_saved_apart: bool = False
    # RL1: a failed refill keeps its advanced in-memory cursor (the next refill starts after
    # the prompts that never entered the queue).
    failed_refill_moves_cursor: bool = False
    # RL1: a refill retried after a lost reply is sent under a new request id (the queue
    # cannot recognise it and admits its prompts again).
    refill_retry_new_request: bool = False
    # RL2: a completion retried after a lost reply records a second accepted group.
    completion_not_idempotent: bool = False
    # RL2: after a builder crash the selection takes accepted groups that are not
    # acknowledged (instead of not planned), so a planned group is planned again.
    replan_ignores_planned: bool = False
    # RL3: hooks run on the builder's in-memory selection before the plan is durable.
    hooks_before_plan: bool = False
    # RL4: the builder acknowledges a batch's inputs when the batch is ready, before training.
    ack_before_training: bool = False
    # RL5: an expired lease returns its task from the prompt, dropping its partial group.
    expiry_restarts_from_prompt: bool = False


CORRECT = RolloutMutants()
MUTANT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RolloutMutants))
MUTANT_HOME: dict[str, str] = {name: "rollout" for name in MUTANT_NAMES}


def mutant(name: str) -> RolloutMutants:
    if name not in MUTANT_NAMES:
        raise ValueError(f"unknown rollout mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")
    return replace(CORRECT, **{name: True})


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A prompt task in the queue (durable) with its group's durable progress."""

    pos: int
    status: str = PENDING
    progress: int = 0  # durable input: 0 = the prompt, k = a partial group after k steps
    attempt: int = 0  # the current (or last) lease's attempt number


@dataclass(frozen=True)
class Refill:
    """The controller's refill in progress (volatile): positions [start, end)."""

    start: int
    end: int
    published: bool = False
    sent: bool = False  # the submit transaction was sent and its reply lost
    cursor_only: bool = False  # mutant cursor_saved_apart: cursor committed, tasks not yet


@dataclass(frozen=True)
class Hold:
    """A worker's lease (volatile view): task index, attempt, in-memory progress."""

    task: int
    attempt: int
    progress: int
    completed: bool = False  # the completion was durable but its reply was lost


@dataclass(frozen=True)
class State:
    # durable (the queue and the pool)
    cursor: int = 0  # committed dataset cursor (producer state)
    tasks: tuple[Task, ...] = ()
    accepts: tuple[int, ...] = ()  # per task: accepted groups recorded
    plans: tuple[tuple[int, ...], ...] = ()  # durable batch plans, in batch order
    hooked: tuple[tuple[tuple[int, ...], ...], ...] = ()  # per batch: plans its hooks saw
    ready: int = 0  # batches [0, ready) are ready (shards published)
    trained: int = 0  # batches [0, trained) finished training (durable with the model)
    acked: int = 0  # consumer cursor: inputs of batches [0, acked) acknowledged
    collected: frozenset[int] = frozenset()  # tasks whose payload was reclaimed
    # history variable for RL5: the highest durable progress each task ever had
    best: tuple[int, ...] = ()
    # volatile
    refill: Refill | None = None
    memory_cursor: int | None = None  # the controller's cursor; None until it starts
    holds: tuple[Hold | None, ...] = ()
    selection: tuple[int, ...] | None = None  # builder's in-memory selection (next batch)
    faults: int = 0


def initial_state(cfg: RolloutConfig) -> State:
    return State(holds=(None,) * cfg.workers)


# ---------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------


def _set(t: tuple, i: int, v: object) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


def _admit(s: State, start: int, end: int) -> State:
    new = tuple(Task(p) for p in range(start, end))
    return replace(s, tasks=s.tasks + new, accepts=s.accepts + (0,) * len(new),
                   best=s.best + (0,) * len(new))


def _controller(cfg: RolloutConfig, mut: RolloutMutants, s: State
                ) -> Iterator[tuple[Action, State]]:
    if s.memory_cursor is None:
        # (Re)start: read the committed cursor from the queue's producer state.
        yield Action("controller_start", (str(s.cursor),), CONTROLLER), replace(
            s, memory_cursor=s.cursor)
        return
    r = s.refill
    if r is None:
        # Refill only when every admitted prompt is taken or done (the queue ran dry).
        start = s.memory_cursor
        if start < cfg.positions and all(t.status != PENDING for t in s.tasks):
            end = min(cfg.positions, start + cfg.refill)
            yield Action("controller_read", (f"{start}..{end}",), CONTROLLER), replace(
                s, refill=Refill(start, end), memory_cursor=end)
        return
    if not r.published:
        yield Action("controller_publish", (f"{r.start}..{r.end}",), CONTROLLER), replace(
            s, refill=replace(r, published=True))
        if s.faults < cfg.faults:
            back = r.end if mut.failed_refill_moves_cursor else s.cursor
            yield Action("controller_publish", (f"{r.start}..{r.end}",), FAULT, "failed"), replace(
                s, refill=None, memory_cursor=back, faults=s.faults + 1)
        return
    if mut.cursor_saved_apart:
        if not r.cursor_only:
            yield Action("controller_commit_cursor", (str(r.end),), CONTROLLER), replace(
                s, cursor=r.end, refill=replace(r, cursor_only=True))
        else:
            yield Action("controller_commit_tasks", (f"{r.start}..{r.end}",), CONTROLLER), replace(
                _admit(s, r.start, r.end), refill=None)
        return
    if r.sent:
        # Retry after a lost reply: the same request id is answered from the journal (Q7).
        if mut.refill_retry_new_request:
            s2 = _admit(s, r.start, r.end)
            yield Action("controller_submit_retry", (f"{r.start}..{r.end}",), CONTROLLER,
                         "new request"), replace(s2, cursor=r.end, refill=None)
        else:
            yield Action("controller_submit_retry", (f"{r.start}..{r.end}",), CONTROLLER,
                         "answered"), replace(s, refill=None)
        return
    # ONE transaction: the refill's tasks and the advanced cursor (RL1).
    committed = replace(_admit(s, r.start, r.end), cursor=r.end)
    yield Action("controller_submit", (f"{r.start}..{r.end}",), CONTROLLER), replace(
        committed, refill=None)
    if s.faults < cfg.faults:
        yield Action("controller_submit", (f"{r.start}..{r.end}",), CONTROLLER, "reply lost"), \
            replace(committed, refill=replace(r, sent=True), faults=s.faults + 1)


def _workers(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> Iterator[tuple[Action, State]]:
    for w, h in enumerate(s.holds):
        name = f"w{w}"
        if h is None:
            # take: the first pending prompt task (FIFO within a stage is the queue's order)
            for i, t in enumerate(s.tasks):
                if t.status == PENDING:
                    t2 = replace(t, status=LEASED, attempt=t.attempt + 1)
                    hold = Hold(i, t2.attempt, t.progress)
                    yield Action("worker_take", (name, f"t{i}"), WORKER), replace(
                        s, tasks=_set(s.tasks, i, t2), holds=_set(s.holds, w, hold))
                    break
            continue
        t = s.tasks[h.task]
        live = t.status == LEASED and t.attempt == h.attempt
        if h.completed:
            # The completion is durable; the worker retries for its lost reply.
            accepts = s.accepts
            if mut.completion_not_idempotent:
                accepts = _set(accepts, h.task, accepts[h.task] + 1)
            yield Action("worker_complete_retry", (name, f"t{h.task}"), WORKER, "same receipt"), \
                replace(s, accepts=accepts, holds=_set(s.holds, w, None))
            continue
        if not live:
            # Q3: a lease of an older attempt never commits; the worker drops it.
            yield Action("worker_drop_stale", (name, f"t{h.task}"), WORKER, "StaleAttempt"), \
                replace(s, holds=_set(s.holds, w, None))
            continue
        if h.progress < cfg.steps:
            yield Action("worker_generate", (name, f"t{h.task}"), WORKER), replace(
                s, holds=_set(s.holds, w, replace(h, progress=h.progress + 1)))
        if t.progress < h.progress < cfg.steps:
            # yield a partial group: published, then its input replaced in one transaction
            t2 = replace(t, status=PENDING, progress=h.progress)
            yield Action("worker_yield_partial", (name, f"t{h.task}"), WORKER), replace(
                s, tasks=_set(s.tasks, h.task, t2), holds=_set(s.holds, w, None),
                best=_set(s.best, h.task, max(s.best[h.task], h.progress)))
        if h.progress == cfg.steps:
            t2 = replace(t, status=DONE, progress=h.progress)
            done = replace(s, tasks=_set(s.tasks, h.task, t2),
                           accepts=_set(s.accepts, h.task, s.accepts[h.task] + 1),
                           best=_set(s.best, h.task, max(s.best[h.task], h.progress)))
            yield Action("worker_complete", (name, f"t{h.task}"), WORKER), replace(
                done, holds=_set(s.holds, w, None))
            if s.faults < cfg.faults:
                yield Action("worker_complete", (name, f"t{h.task}"), WORKER, "reply lost"), \
                    replace(done, holds=_set(s.holds, w, replace(h, completed=True)),
                            faults=s.faults + 1)


def _planned(s: State) -> set[int]:
    return {i for plan in s.plans for i in plan}


def _acked_tasks(s: State) -> set[int]:
    return {i for plan in s.plans[: s.acked] for i in plan}


def _builder(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> Iterator[tuple[Action, State]]:
    b = len(s.plans)
    if s.ready < b:
        # Continue the first durable plan that is not ready: hooks on the durable plan, then
        # shards published and the batch marked ready (one step: both come after the hooks).
        plan = s.plans[s.ready]
        seen = s.hooked[s.ready]
        if plan not in seen:
            yield Action("builder_hooks", (f"b{s.ready}",), BUILDER), replace(
                s, hooked=_set(s.hooked, s.ready, seen + (plan,)))
        else:
            yield Action("builder_ready", (f"b{s.ready}",), BUILDER), replace(
                s, ready=s.ready + 1)
        return
    if s.selection is None:
        taken = _acked_tasks(s) if mut.replan_ignores_planned else _planned(s)
        # Scheduling order (completed groups only here): FIFO by task index.
        pick = tuple(i for i, t in enumerate(s.tasks)
                     if t.status == DONE and i not in taken)[: cfg.batch]
        if len(pick) == cfg.batch:
            yield Action("builder_select", (f"b{b}", ",".join(f"t{i}" for i in pick)),
                         BUILDER), replace(s, selection=pick)
        return
    if mut.hooks_before_plan and (len(s.hooked) <= b or s.selection not in s.hooked[b]):
        hooked = s.hooked if len(s.hooked) > b else s.hooked + ((),)
        yield Action("builder_hooks", (f"b{b}",), BUILDER, "before plan"), replace(
            s, hooked=_set(hooked, b, hooked[b] + (s.selection,)))
    hooked = s.hooked if len(s.hooked) > b else s.hooked + ((),)
    yield Action("builder_plan", (f"b{b}",), BUILDER), replace(
        s, plans=s.plans + (s.selection,), hooked=hooked, selection=None)


def _trainer(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> Iterator[tuple[Action, State]]:
    if s.trained < s.ready:
        yield Action("trainer_finish", (f"b{s.trained}",), TRAINER), replace(
            s, trained=s.trained + 1)
    limit = s.ready if mut.ack_before_training else s.trained
    if s.acked < limit:
        yield Action("builder_ack", (f"b{s.acked}",), BUILDER), replace(s, acked=s.acked + 1)
    # Collection may reclaim any acknowledged group's payload.
    for i in sorted(_acked_tasks(s) - s.collected):
        yield Action("collect", (f"t{i}",), BUILDER), replace(s, collected=s.collected | {i})
        break


def _faults(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> Iterator[tuple[Action, State]]:
    if s.faults >= cfg.faults:
        return
    f = s.faults + 1
    if s.memory_cursor is not None:
        yield Action("crash_controller", (), FAULT), replace(
            s, memory_cursor=None, refill=None, faults=f)
    for w, h in enumerate(s.holds):
        if h is not None:
            yield Action("crash_worker", (f"w{w}",), FAULT), replace(
                s, holds=_set(s.holds, w, None), faults=f)
    for i, t in enumerate(s.tasks):
        if t.status == LEASED:
            progress = 0 if mut.expiry_restarts_from_prompt else t.progress
            yield Action("expire", (f"t{i}",), FAULT), replace(
                s, tasks=_set(s.tasks, i, replace(t, status=PENDING, progress=progress)),
                faults=f)
    if s.selection is not None:
        yield Action("crash_builder", (), FAULT), replace(s, selection=None, faults=f)


def successors(cfg: RolloutConfig, mut: RolloutMutants, s: State
               ) -> Iterator[tuple[Action, State]]:
    """Every enabled action of s with its next state, in a fixed order."""
    yield from _controller(cfg, mut, s)
    yield from _workers(cfg, mut, s)
    yield from _builder(cfg, mut, s)
    yield from _trainer(cfg, mut, s)
    yield from _faults(cfg, mut, s)


# ---------------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------------


def rl1_exactly_once_admission(cfg: RolloutConfig, s: State) -> str | None:
    """RL1: the queue holds exactly one prompt task per position below the committed cursor
    and none at or above it.  Checked in every state: every state's durable part is what a
    crash at that point leaves."""
    seen: dict[int, int] = {}
    for t in s.tasks:
        seen[t.pos] = seen.get(t.pos, 0) + 1
    for pos, n in sorted(seen.items()):
        if n > 1:
            return f"position {pos} was admitted {n} times"
        if pos >= s.cursor:
            return f"position {pos} is in the queue but the committed cursor is {s.cursor}"
    missing = [p for p in range(s.cursor) if p not in seen]
    if missing:
        return f"positions {missing} are below the committed cursor {s.cursor} but not queued"
    return None


def rl2_accepted_once_never_lost(cfg: RolloutConfig, s: State) -> str | None:
    """RL2: a group is accepted at most once, planned in at most one batch, and its payload
    is not collected before the batch that trains it has finished."""
    for i, n in enumerate(s.accepts):
        if n > 1:
            return f"task t{i}'s group was accepted {n} times"
    where: dict[int, int] = {}
    for b, plan in enumerate(s.plans):
        for i in plan:
            if i in where:
                return f"group t{i} is planned in batches b{where[i]} and b{b}"
            where[i] = b
    for i in sorted(s.collected):
        batch = where.get(i)
        if batch is None or batch >= s.trained:
            return f"group t{i} was collected but its batch has not finished training"
    return None


def rl3_plan_never_changes(cfg: RolloutConfig, s: State) -> str | None:
    """RL3: every run of a batch's hooks saw its durable plan, and only it."""
    for b, seen in enumerate(s.hooked):
        for plan in seen:
            if b >= len(s.plans):
                return f"hooks of b{b} ran on {plan} but no plan of b{b} is durable"
            if b < len(s.plans) and plan != s.plans[b]:
                return f"hooks of b{b} ran on {plan} but its durable plan is {s.plans[b]}"
    return None


def rl4_ack_after_training(cfg: RolloutConfig, s: State) -> str | None:
    """RL4: the consumer cursor never passes a batch whose training has not finished."""
    if s.acked > s.trained:
        return f"batches up to b{s.acked - 1} are acknowledged but only {s.trained} finished"
    return None


def rl5_progress_kept(cfg: RolloutConfig, s: State) -> str | None:
    """RL5: a group's durable progress never decreases (partial work resumed)."""
    for i, t in enumerate(s.tasks):
        if t.status != DONE and t.progress < s.best[i]:
            return (f"task t{i} returned with progress {t.progress} after a partial group "
                    f"of progress {s.best[i]} was durable")
    return None


STATE_INVARIANTS = {
    "RL1": rl1_exactly_once_admission,
    "RL2": rl2_accepted_once_never_lost,
    "RL3": rl3_plan_never_changes,
    "RL4": rl4_ack_after_training,
    "RL5": rl5_progress_kept,
}
ALL_IDS = frozenset(STATE_INVARIANTS)


def check_state(cfg: RolloutConfig, s: State) -> tuple[str, str] | None:
    for iid, check in STATE_INVARIANTS.items():
        msg = check(cfg, s)
        if msg is not None:
            return iid, msg
    return None


def check_step(cfg: RolloutConfig, s: State, a: Action, s2: State) -> tuple[str, str] | None:
    """The rollout rules are all state invariants (history variables carry what a step
    check would need)."""
    return None
