"""The rollout layer's state machine (issue 14 item 7; checkpoints: issue 15 item 5).

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

* the **trainer** saves a **joint checkpoint** of step k between training steps: capture
  (snapshot, retention and floor registration), each component durable in turn, the commit
  marker last; the job's policy **releases** superseded checkpoints;
* after a **crash of the whole job** (volatile state and non-durable files lost) it starts
  again as a new run in an isolated queue: a **fork** (exact restore of a committed
  checkpoint) or a **salvage** (the dead run's durable queue, its consumer rewound to its
  latest checkpoint T, every accepted group not trained by T restored); which one, and
  from which step, is **resolution**'s choice (`straw/rollout/resolve.py`), read from the
  commit markers, the framework's tracker and ``current.json``;
* the **builder** may be restarted with another conversion configuration or parallel
  layout: what its plans' digests cover;
* with an **environment mix**, the producer admits fresh prompts only while the mix admits
  them (``admits_fresh``: a backlog that fills its quota drains first).

Faults: the controller, a worker, the builder and the trainer may crash (volatile state lost),
a lease may expire, a reply may be lost, a refill's publication may fail, the whole job may
crash, the builder may be restarted with another configuration.

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
* **RL6** a fork never changes its source (step check).
* **RL7** shared payloads stay reachable while any checkpoint or branch needs them.
* **RL8** salvage restores exactly the accepted-after-T, untrained-by-T set and never
  regenerates a durable group (step check).
* **RL9** a commit marker implies every component durable.
* **RL10** a restart resumes from a commit: the automatic resume of a crashed job starts
  from the newest step a commit marker names (never a save interrupted before its marker,
  whose model and tracker are on disk), and a job that committed a checkpoint never starts
  again as a new run from dataset offset 0 (step check).
* **RL11** a batch is bound to its plan: a planned batch is built, and a ready one is
  handed to the trainer, only by a builder that plans it the same way (its conversion
  configuration and parallel layout are the plan's) (step check).
* **RL12** (liveness) a mix whose backlog is short of its quota admits fresh work: while
  the dataset lasts, batches keep being composed and trained.

Each rule has a mutant (``RolloutMutants``) that the explorer must catch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace

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
    # Joint checkpoints (issue 15): how many the trainer may save in a run of the machine (0:
    # none, and the model is durable with every finished training step, as RL1-RL5 assume),
    # and how many times the crashed job may be started again by a fork or a salvage.
    checkpoints: int = 0
    restores: int = 0
    # How many conversion configurations / parallel layouts the builder may be restarted
    # with (a restart draws on the fault budget); 1: the builder keeps its configuration.
    layouts: int = 1
    # With an environment mix, the producer admits fresh prompts only while the mix admits
    # them (RL12).  The admission rule is per environment, against its own backlog and its
    # own quota, and a batch needs every environment's quota filled: one environment whose
    # quota is the whole batch stands for each environment of a weighted mix (the rotation
    # of extra groups changes a quota from batch to batch, not the rule).  False: the
    # producer refills whenever no prompt is pending, as RL1-RL11 need no more.
    mix: bool = False

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
        # Checkpoints, restores and releases: two saves (so that one supersedes the other and
        # a release moves the floor), one crash of the whole job, one restore after it.
        RolloutConfig("rollout-ckpt", dataset=2, epochs=1, refill=1, workers=1, steps=2,
                      batch=1, faults=1, checkpoints=2, restores=1),
        # RL11: two batches and two restarts of the builder: with another layout around a
        # planned or a ready batch, and back (the remedy the refusal names).
        RolloutConfig("rollout-layout", dataset=2, epochs=1, refill=1, workers=1, steps=2,
                      batch=1, faults=2, layouts=2),
        # RL12: refills smaller than the quota, so that a backlog short of it is reached
        # with prompts left, and two batches; no faults (the liveness rule assumes none).
        RolloutConfig("rollout-mix", dataset=4, epochs=1, refill=1, workers=2, steps=1,
                      batch=2, faults=0, mix=True),
    )
}
CONFIG_SETS: dict[str, tuple[str, ...]] = {
    "small": ("rollout-small", "rollout-ckpt", "rollout-layout", "rollout-mix"),
    "full": ("rollout-small", "rollout-workers", "rollout-faults", "rollout-ckpt",
             "rollout-layout", "rollout-mix"),
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
    # RL6: the fork journals its restore decision (every batch the source planned taken as
    # finished, so that the branch never meets the source's later samples) in the SOURCE
    # queue's consumer instead of its own.
    fork_writes_source: bool = False
    # RL7: the fork leaves what it shares with the checkpoint (its seeded tasks' inputs, the
    # groups its builder holds by reference) retained only by the checkpoint's owner:
    # releasing the checkpoint then drops payloads the branch still needs.
    fork_keeps_checkpoint_retention: bool = False
    # RL7: an acknowledgement releases a group even after the latest checkpoint (the
    # checkpoint floor ignored): a salvage from that checkpoint needs it again.
    ack_ignores_checkpoint_floor: bool = False
    # RL7: a checkpoint's retention is taken with its commit marker instead of with its
    # capture: what the snapshot names may be collected while the components are written.
    checkpoint_retained_at_commit: bool = False
    # RL8: salvage from checkpoint T takes batch T (the first one planned after it) as
    # trained by T (`b <= T` for `b < T`): its groups are neither replayed nor restored.
    salvage_boundary_inclusive: bool = False
    # RL8: salvage keeps the dead run's acknowledgements of batches after T (its future
    # markers) as consumed in the new timeline: they hide the groups they name.
    salvage_keeps_dead_markers: bool = False
    # RL5: salvage restores the completed groups only (the Megatron bank's rule): every
    # unfinished task returns to its prompt, dropping the partial groups made durable.
    salvage_restarts_partial: bool = False
    # RL9: the commit marker is written once every component is written, not once each is
    # durable (no fsync before the marker): a power loss leaves a marker naming lost files.
    marker_before_components_durable: bool = False
    # RL10: the automatic resume takes a tracker that differs from current.json's for the
    # user's edit: the framework's save of step k wrote the model and the tracker, died
    # before the commit marker, and step k is selected with an empty queue from dataset
    # offset 0 (no marker, no queue snapshot) instead of the newest commit.
    resume_follows_tracker: bool = False
    # RL10: with current.json lost, the automatic start takes the save directory for a
    # fresh one: a new run from dataset offset 0 although a checkpoint is committed.
    lost_current_starts_new: bool = False
    # RL11: a ready batch is handed back as stored to a builder restarted with another
    # conversion configuration or parallel layout (its plan digest unchecked, as a planned
    # batch's is): the trainer gets data converted the old way.
    ready_replay_ignores_plan: bool = False
    # RL12: an environment admits fresh prompts only once its backlog is empty: a backlog
    # short of its quota (quota 2, backlog 1) never fills a batch, and none is made again.
    admits_only_empty_backlog: bool = False


CORRECT = RolloutMutants()
MUTANT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RolloutMutants))
# Where each mutant is hunted first: a configuration family, or the one configuration whose
# bounds enable its behaviour (the others cannot catch it, and exploring them costs).
MUTANT_HOME: dict[str, str] = {name: "rollout" for name in MUTANT_NAMES} | {
    "resume_follows_tracker": "rollout-ckpt",
    "lost_current_starts_new": "rollout-ckpt",
    "ready_replay_ignores_plan": "rollout-layout",
    "admits_only_empty_backlog": "rollout-mix",
}
# Mutants only the liveness check catches (the whole graph is needed: they run first).
LIVENESS_MUTANTS = frozenset({"admits_only_empty_backlog"})


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
    src: int = 0  # the run that wrote its durable input (or result): payload (src, pos, progress)


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


# A payload's identity: (the run that wrote it, task position, progress). The run is the
# per-run nonce of group ids: a branch that generates a position again writes a new payload.
Payload = tuple[int, int, int]

# The components of a joint checkpoint, written in this order before its commit marker.
COMPONENTS = ("model", "queue_state", "builder_state")
ABSENT, WRITTEN, DURABLE = 0, 1, 2  # a component's file: missing, written not fsynced, durable


@dataclass(frozen=True)
class Run:
    """One run's durable state: its queue (cursor, tasks) and its builder's consumer (plans,
    ready/trained/acked), with the step it started from.  The active run keeps these as
    `State`'s top-level fields; earlier runs and checkpoint snapshots keep them here."""

    cursor: int
    tasks: tuple[Task, ...]
    accepts: tuple[int, ...]
    plans: tuple[tuple[int, ...], ...]
    plan_layouts: tuple[int, ...]
    hooked: tuple[tuple[tuple[int, ...], ...], ...]
    ready: int
    trained: int
    acked: int
    best: tuple[int, ...]
    base: int
    mode: str  # how the run started: "new", "fork" (an exact restore) or "salvage" (or,
    # under a mutant of RL10, "empty": a model without marker or snapshot, an empty queue)


RUN_FIELDS = tuple(f.name for f in fields(Run))


@dataclass(frozen=True)
class Checkpoint:
    """The joint checkpoint of step `step` of run `run` (durable records): what its
    components hold (`snap`, the run captured with leases returned as pending), each
    component file's state, its commit marker, and whether its retention was released."""

    run: int
    step: int
    snap: Run
    components: tuple[int, ...] = (ABSENT,) * len(COMPONENTS)
    committed: bool = False
    released: bool = False
    # derived: what an exact restore of it reads (what its retention keeps)
    reads: frozenset[Payload] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads",
                           _needed_by_restore(self.snap.tasks, self.snap.plans, self.step))

    @property
    def name(self) -> str:
        return f"r{self.run}.k{self.step}"


@dataclass(frozen=True)
class State:
    # durable (the queue and the pool)
    cursor: int = 0  # committed dataset cursor (producer state)
    tasks: tuple[Task, ...] = ()
    accepts: tuple[int, ...] = ()  # per task: accepted groups recorded
    plans: tuple[tuple[int, ...], ...] = ()  # durable batch plans, in batch order
    # per plan: the builder layout (conversion configuration, parallel layout) its digest
    # covers, so a builder configured otherwise would plan that batch differently
    plan_layouts: tuple[int, ...] = ()
    hooked: tuple[tuple[tuple[int, ...], ...], ...] = ()  # per batch: plans its hooks saw
    ready: int = 0  # batches [0, ready) are ready (shards published)
    trained: int = 0  # batches [0, trained) finished training (durable with the model)
    acked: int = 0  # consumer cursor: inputs of batches [0, acked) acknowledged
    collected: frozenset[Payload] = frozenset()  # payloads reclaimed by collection
    # history variable for RL5: the highest durable progress each task ever had
    best: tuple[int, ...] = ()
    base: int = 0  # the step this run started from (its restored checkpoint's; 0 at first)
    mode: str = "new"  # how it started: "new", "fork" (an exact restore) or "salvage"
    # durable, issue 15: the active run's id, every checkpoint captured so far, and whether
    # the whole job crashed (then only a fork or a salvage starts it again)
    run: int = 0
    ckpts: tuple[Checkpoint, ...] = ()
    down: bool = False
    # The earlier runs' durable state, by run id, kept for RL6's step check only.  Nothing
    # else reads it (an abandoned queue keeps nothing anyone needs: a restore retains what
    # it shares under its own queue, a checkpoint under its own owner), so states that
    # differ only here have the same futures: the explorer takes them as one state.
    past: tuple[Run, ...] = field(default=(), compare=False)
    # volatile
    refill: Refill | None = None
    memory_cursor: int | None = None  # the controller's cursor; None until it starts
    holds: tuple[Hold | None, ...] = ()
    selection: tuple[int, ...] | None = None  # builder's in-memory selection (next batch)
    layout: int = 0  # the builder's configuration, given when it is (re)started
    saving: int | None = None  # the trainer's save in progress (index in ckpts)
    faults: int = 0

    @property
    def run_id(self) -> int:
        return self.run


def initial_state(cfg: RolloutConfig) -> State:
    return State(holds=(None,) * cfg.workers)


# ---------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------


def _set(t: tuple, i: int, v: object) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


def _admit(s: State, start: int, end: int) -> State:
    new = tuple(Task(p, src=s.run_id) for p in range(start, end))
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
        # Refill only when every admitted prompt is taken or done (the queue ran dry), and
        # with a mix only while it admits fresh work.
        start = s.memory_cursor
        if (start < cfg.positions and all(t.status != PENDING for t in s.tasks)
                and _admits_fresh(cfg, mut, s)):
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


def _backlog(s: State) -> int:
    """The mix's backlog: accepted groups in no plan (what the next batches take first)."""
    taken = _planned(s)
    return sum(1 for i, t in enumerate(s.tasks) if t.status == DONE and i not in taken)


def _admits_fresh(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> bool:
    """Whether the environment admits fresh prompts (``EnvironmentMix.admits_fresh``): while
    its backlog is short of max(1, its quota).  A backlog that fills the quota drains first;
    one short of it can only be completed by fresh groups."""
    if not cfg.mix:
        return True
    if mut.admits_only_empty_backlog:
        return _backlog(s) == 0
    return _backlog(s) < max(1, cfg.batch)


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
            t2 = replace(t, status=PENDING, progress=h.progress, src=s.run_id)
            yield Action("worker_yield_partial", (name, f"t{h.task}"), WORKER), replace(
                s, tasks=_set(s.tasks, h.task, t2), holds=_set(s.holds, w, None),
                best=_set(s.best, h.task, max(s.best[h.task], h.progress)))
        if h.progress == cfg.steps:
            t2 = replace(t, status=DONE, progress=h.progress, src=s.run_id)
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
        # A builder configured otherwise would plan it differently: refused (RL11).
        if s.plan_layouts[s.ready] != s.layout:
            return
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
        s, plans=s.plans + (s.selection,), plan_layouts=s.plan_layouts + (s.layout,),
        hooked=hooked, selection=None)


def _trainer(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> Iterator[tuple[Action, State]]:
    # A save runs between training steps.  The trainer gets the batch from the builder's
    # replay of the ready batch, which a builder configured otherwise refuses (RL11).
    bound = mut.ready_replay_ignores_plan or (
        s.trained < s.ready and s.plan_layouts[s.trained] == s.layout)
    if s.trained < s.ready and s.saving is None and bound:
        yield Action("trainer_finish", (f"b{s.trained}",), TRAINER), replace(
            s, trained=s.trained + 1)
    limit = s.ready if mut.ack_before_training else s.trained
    if s.acked < limit:
        yield Action("builder_ack", (f"b{s.acked}",), BUILDER), replace(s, acked=s.acked + 1)


def _collector(cfg: RolloutConfig, mut: RolloutMutants, s: State
               ) -> Iterator[tuple[Action, State]]:
    # Collection reclaims a payload that no root keeps: the first one, in a fixed order
    # (whatever it reclaims later stays unkept: one order reaches every collected set).
    for p in sorted(_named(s) - _roots(cfg, mut, s) - s.collected):
        yield Action("collect", (_pname(p),), BUILDER), replace(s, collected=s.collected | {p})
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
    for layout in range(cfg.layouts):
        if layout != s.layout:
            # The operator restarts the builder with another conversion configuration or
            # parallel layout (its selection is lost, as in a crash).
            yield Action("builder_restart", (f"layout {layout}",), FAULT), replace(
                s, layout=layout, selection=None, faults=f)
    if cfg.restores:
        # The whole job dies (every process, or a power loss): all volatile state is lost,
        # with the save in progress and every component file not yet durable.
        ckpts = tuple(replace(c, components=tuple(ABSENT if x == WRITTEN else x
                                                  for x in c.components)) for c in s.ckpts)
        yield Action("crash_job", (), FAULT), replace(
            s, memory_cursor=None, refill=None, holds=(None,) * cfg.workers, selection=None,
            saving=None, ckpts=ckpts, down=True, faults=f)


# ---------------------------------------------------------------------------------------------
# Checkpoints, restores and retention (issue 15)
# ---------------------------------------------------------------------------------------------


def _pname(p: Payload) -> str:
    return f"t{p[1]}@{p[2]}/r{p[0]}"


def _run_of(s: State) -> Run:
    """The active run's durable state."""
    return Run(**{f: getattr(s, f) for f in RUN_FIELDS})


def _returned(tasks: tuple[Task, ...]) -> tuple[Task, ...]:
    """What a snapshot or a new queue holds: leases returned as pending, and attempts
    counted afresh (no lease of the old queue survives into a new one)."""
    return tuple(replace(t, status=PENDING if t.status == LEASED else t.status, attempt=0)
                 for t in tasks)


def _payload(i: int, t: Task) -> Payload:
    return (t.src, i, t.progress)


def _needed_by_restore(tasks: tuple[Task, ...], plans: tuple[tuple[int, ...], ...], step: int
                       ) -> frozenset[Payload]:
    """What a restore of a run (its tasks and plans) resuming at model step `step` reads:
    every unfinished task's durable input and every accepted group not trained by `step`
    (in no batch below it)."""
    trained = {i for plan in plans[:step] for i in plan}
    return frozenset(_payload(i, t) for i, t in enumerate(tasks)
                     if t.status != DONE or i not in trained)


def _target(cfg: RolloutConfig, s: State) -> int:
    """The model step a salvage of the active run resumes from: its latest committed (and
    so unreleased) checkpoint's, else the step the run started from.  Without checkpoints
    the model is durable with every finished training step."""
    if cfg.checkpoints == 0:
        return s.trained
    steps = [c.step for c in s.ckpts if c.run == s.run_id and c.committed and not c.released]
    return max(steps, default=s.base)


def _tracker(s: State) -> int:
    """The step the framework's tracker names for the active run: its newest save whose
    model is durable (the framework writes the model, then the tracker, before the joint
    commit marker), else the step the run started from.  ``current.json``'s tracker follows
    the marker: it names the newest commit, so the two differ only after a save that died
    before its marker."""
    steps = [c.step for c in s.ckpts if c.run == s.run_id and c.components[0] == DURABLE]
    return max(steps, default=s.base)


def _empty_run(step: int, mode: str) -> Run:
    """A run with an empty queue from dataset offset 0, its model at `step` (what a start
    from a model without marker or queue snapshot, or a new run, holds)."""
    return Run(cursor=0, tasks=(), accepts=(), plans=(), plan_layouts=(), hooked=(), ready=0,
               trained=0, acked=0, best=(), base=step, mode=mode)


def _floor(cfg: RolloutConfig, s: State, r: int, run: Run) -> int:
    """A run keeps an acknowledged group for a salvage unless its batch is below the floor:
    the lowest step of the run's registered checkpoints (captured, not released) and, until
    one of them is committed, the step the run started from (the core's checkpoint_floor)."""
    if cfg.checkpoints == 0:
        return run.trained
    own = [c for c in s.ckpts if c.run == r and not c.released]
    steps = [c.step for c in own]
    if not any(c.committed for c in own):
        steps.append(run.base)
    return min(steps)


def _roots(cfg: RolloutConfig, mut: RolloutMutants, s: State) -> set[Payload]:
    """What collection keeps (the mechanism): the active run's queue keeps its unfinished
    tasks' inputs and its accepted groups, restored ones included, until acknowledged below
    the floor; every captured checkpoint keeps what its snapshot names until released.  An
    earlier run's queue is taken to keep nothing (it may be deleted once abandoned): what
    is needed must not depend on it."""
    keep: set[Payload] = set()
    r, run = s.run_id, _run_of(s)
    limit = run.acked if mut.ack_ignores_checkpoint_floor else min(
        run.acked, _floor(cfg, s, r, run))
    released = {i for plan in run.plans[:limit] for i in plan}
    borrowed = mut.fork_keeps_checkpoint_retention and run.mode == "fork"
    for i, t in enumerate(run.tasks):
        if borrowed and t.src != r:
            continue  # shared with the checkpoint, kept only by the checkpoint's owner
        if t.status != DONE or i not in released:
            keep.add(_payload(i, t))
    for c in s.ckpts:
        if not c.released and (c.committed or not mut.checkpoint_retained_at_commit):
            keep |= c.reads
    return keep


def _named(s: State) -> set[Payload]:
    """The payloads the active run or a checkpoint names: the candidates for collection
    (collecting one only an earlier run names changes nothing anyone reads)."""
    out = {_payload(i, t) for i, t in enumerate(s.tasks)}
    for c in s.ckpts:
        out |= c.reads
    return out


def _needs(cfg: RolloutConfig, s: State) -> Iterator[tuple[str, frozenset[Payload]]]:
    """What must stay readable (RL7's oracle): what an exact restore of every committed,
    unreleased checkpoint reads, and what a salvage of the active run (live, or crashed and
    not yet restored) reads."""
    for c in s.ckpts:
        if c.committed and not c.released:
            yield f"checkpoint {c.name} (an exact restore)", c.reads
    step = _target(cfg, s)
    yield (f"run r{s.run_id} (to go on, or a salvage of it from step {step})",
           _needed_by_restore(s.tasks, s.plans, step))


def _checkpointer(cfg: RolloutConfig, mut: RolloutMutants, s: State
                  ) -> Iterator[tuple[Action, State]]:
    """The trainer's joint checkpoint of step k (= batches trained), between training
    steps: capture, each component written durably in order, then the commit marker."""
    if s.saving is None:
        k = s.trained
        mine = [c.step for c in s.ckpts if c.run == s.run_id]
        # a step the run trained itself, never one it already saved (the existing commit
        # is refused before anything is written)
        if len(s.ckpts) < cfg.checkpoints and k > s.base and all(m < k for m in mine):
            # One step: the snapshot (leases returned as pending) and its retention and
            # floor registration under the checkpoint's owner.  Retaining a payload that a
            # collection has tombstoned fails (D4): a save that races one fails, unmarked.
            snap = replace(_run_of(s), tasks=_returned(s.tasks), acked=k)
            yield Action("ckpt_capture", (f"k{k}",), TRAINER), replace(
                s, ckpts=s.ckpts + (Checkpoint(s.run_id, k, snap),), saving=len(s.ckpts))
        return
    n, c = s.saving, s.ckpts[s.saving]
    for j, component in enumerate(COMPONENTS):
        if c.components[j] == ABSENT:
            # write a temp file, fsync, rename, fsync the directory: durable in one step
            # (the mutant skips the fsyncs: the file is only written).  The engine writes
            # the components and the capture concurrently (straw/rollout/checkpoint.py),
            # all before the marker: one order here stands for every interleaving.
            state = WRITTEN if mut.marker_before_components_durable else DURABLE
            yield Action("ckpt_write", (c.name, component), TRAINER), replace(
                s, ckpts=_set(s.ckpts, n, replace(c, components=_set(c.components, j, state))))
            return
    # The commit marker last (RL9).  The framework's own save writes its tracker with the
    # model component, before the marker (`_tracker`); straw's trackers and current.json
    # follow the marker.  Resolution reads markers (RL10: a tracker newer than the newest
    # marker is not followed), so the trackers are not steps of their own here.
    yield Action("ckpt_commit", (c.name,), TRAINER), replace(
        s, ckpts=_set(s.ckpts, n, replace(c, committed=True)), saving=None)


def _releases(cfg: RolloutConfig, mut: RolloutMutants, s: State
              ) -> Iterator[tuple[Action, State]]:
    # The job's retention policy releases a committed checkpoint of an earlier run (no
    # rollback there is wanted any more), or one of the active run's that a later committed
    # checkpoint supersedes (the newest is the salvage point): its owner and its floor
    # registration go in one step.  The model files stay (a released checkpoint remains
    # a salvage base for a run started from it); it can no longer be restored exactly.
    for n, c in enumerate(s.ckpts):
        if c.committed and not c.released and (c.run != s.run_id or any(
                d.run == c.run and d.committed and d.step > c.step for d in s.ckpts)):
            yield Action("release", (c.name,), TRAINER), replace(
                s, ckpts=_set(s.ckpts, n, replace(c, released=True)))


def _start(s: State, past: tuple[Run, ...], run: Run) -> State:
    """The job started again as a new run (a new queue): `run` is its durable state."""
    return replace(s, past=past, run=len(past), down=False,
                   **{f: getattr(run, f) for f in RUN_FIELDS})


def _restores(cfg: RolloutConfig, mut: RolloutMutants, s: State
              ) -> Iterator[tuple[Action, State]]:
    """The crashed job starts again in an isolated queue: exact (a fork of a committed
    checkpoint: a rollback or another branch) or salvage (the dead run resumed from its
    latest checkpoint).  The dead run's durable state is kept as it is."""
    if s.run >= cfg.restores:
        return
    dead = _run_of(s)
    for c in s.ckpts:
        if c.committed and not c.released:
            past = s.past + (dead,)
            if mut.fork_writes_source:
                src = past[c.run]
                past = _set(past, c.run, replace(src, acked=max(src.acked, len(src.plans))))
            # Exact: the snapshot as saved; batches below k are trained by k, so the new
            # consumer starts at k; the source's later samples are not read.
            yield Action("fork", (c.name,), CONTROLLER), _start(
                s, past, replace(c.snap, acked=c.step, base=c.step, mode="fork"))
    if mut.lost_current_starts_new:
        # current.json lost (one step with the start that finds it missing): the save
        # directory is taken for a fresh one.  With a commit present the automatic start
        # is refused instead, and the operator resumes explicitly: a fork or a salvage.
        yield Action("restart_new", ("current.json lost",), CONTROLLER), _start(
            s, s.past + (dead,), _empty_run(0, "new"))
    # Salvage from step T: the dead queue's durable state (leases returned) in a new queue:
    # every accepted group kept, the batches planned after T replayed as planned, the
    # consumer rewound to T (the dead run's acknowledgements after T are not carried).
    # Resolution takes T from the commit markers: a tracker newer than the newest marker is
    # the framework's write of a save that died before its marker, never followed (RL10).
    step = _target(cfg, s)
    tracker = _tracker(s)
    if mut.resume_follows_tracker and cfg.checkpoints and tracker != step:
        # the tracker taken for the user's edit: its step has a model, no marker and no
        # queue snapshot, so the run starts empty from dataset offset 0
        yield Action("restart_empty", (f"r{s.run_id}.k{tracker}",), CONTROLLER), _start(
            s, s.past + (dead,), _empty_run(tracker, "empty"))
        return
    consumed = step
    if mut.salvage_boundary_inclusive:
        consumed = min(step + 1, len(dead.plans))
    if mut.salvage_keeps_dead_markers:
        consumed = max(consumed, dead.acked)
    tasks = _returned(dead.tasks)
    if mut.salvage_restarts_partial:
        tasks = tuple(t if t.status == DONE else replace(t, progress=0) for t in tasks)
    yield Action("salvage", (f"r{s.run_id}.k{step}",), CONTROLLER), _start(
        s, s.past + (dead,), replace(dead, tasks=tasks, trained=consumed, acked=consumed,
                                     base=step, mode="salvage"))


def successors(cfg: RolloutConfig, mut: RolloutMutants, s: State
               ) -> Iterator[tuple[Action, State]]:
    """Every enabled action of s with its next state, in a fixed order."""
    if s.down:
        yield from _collector(cfg, mut, s)
        yield from _restores(cfg, mut, s)
        return
    yield from _controller(cfg, mut, s)
    yield from _workers(cfg, mut, s)
    yield from _builder(cfg, mut, s)
    yield from _trainer(cfg, mut, s)
    yield from _collector(cfg, mut, s)
    yield from _checkpointer(cfg, mut, s)
    yield from _releases(cfg, mut, s)
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
    is not collected before the batch that trains it has finished (for a group this run
    wrote; the groups a restore shares with another run are RL7's)."""
    for i, n in enumerate(s.accepts):
        if n > 1:
            return f"task t{i}'s group was accepted {n} times"
    where: dict[int, int] = {}
    for b, plan in enumerate(s.plans):
        for i in plan:
            if i in where:
                return f"group t{i} is planned in batches b{where[i]} and b{b}"
            where[i] = b
    for i, t in enumerate(s.tasks):
        if t.status == DONE and t.src == s.run_id and _payload(i, t) in s.collected:
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


def rl6_fork_never_changes_source(cfg: RolloutConfig, s: State, a: Action, s2: State
                                  ) -> str | None:
    """RL6 (step): a fork never changes its source.  No step changes an earlier run's
    durable state or a checkpoint's snapshot, and a restore keeps the run it replaces
    exactly as the crash left it (another restore of it, or of its checkpoints, reads it)."""
    if s2.past is s.past and s2.ckpts is s.ckpts:
        return None  # (most steps: nothing of another run or a checkpoint was touched)
    n = len(s.past)
    for r, (run, run2) in enumerate(zip(s.past, s2.past, strict=False)):
        if run != run2:
            return f"{a.name} changed the durable state of the earlier run r{r}"
    if len(s2.past) > n and s2.past[n] != _run_of(s):
        return f"{a.name} changed the durable state of its source run r{n}"
    for c, c2 in zip(s.ckpts, s2.ckpts, strict=False):
        if c is not c2 and (c.run, c.step, c.snap) != (c2.run, c2.step, c2.snap):
            return f"{a.name} changed the snapshot of checkpoint {c.name}"
    return None


def rl7_shared_payloads_reachable(cfg: RolloutConfig, s: State) -> str | None:
    """RL7: payloads stay readable while a checkpoint or a branch needs them: everything an
    exact restore of a committed, unreleased checkpoint reads, and everything a salvage of
    the active run (its latest checkpoint, the groups accepted since and its unfinished
    inputs) reads.  Checked against what was collected, whatever kept it."""
    if not s.collected:
        return None
    for who, needed in _needs(cfg, s):
        lost = sorted(needed & s.collected)
        if lost:
            return f"{who} needs {', '.join(map(_pname, lost))}, which was collected"
    return None


def rl8_salvage_restores_exactly(cfg: RolloutConfig, s: State, a: Action, s2: State
                                 ) -> str | None:
    """RL8 (step): a salvage from checkpoint T restores exactly the groups accepted and not
    trained by T (in no batch below T), replays the batches planned after T as planned,
    and never generates a durable group again (each stays accepted, with its payload)."""
    if a.name != "salvage":
        return None
    dead, step = _run_of(s), _target(cfg, s)
    done = {i for i, t in enumerate(dead.tasks) if t.status == DONE}
    expected = done - {i for plan in dead.plans[:step] for i in plan}
    consumed = {i for plan in s2.plans[:max(s2.trained, s2.acked)] for i in plan}
    restored = {i for i, t in enumerate(s2.tasks) if t.status == DONE} - consumed
    if restored != expected:
        missing = ",".join(f"t{i}" for i in sorted(expected - restored)) or "-"
        extra = ",".join(f"t{i}" for i in sorted(restored - expected)) or "-"
        return (f"salvage from step {step} of run r{s.run_id}: accepted groups not trained "
                f"by {step} missing from the restore: {missing}; restored but trained by "
                f"{step}: {extra}")
    for i in sorted(done):
        t, t2 = dead.tasks[i], s2.tasks[i] if i < len(s2.tasks) else None
        if t2 is None or t2.status != DONE or _payload(i, t2) != _payload(i, t):
            return f"salvage returns t{i} to generation, but its group was durable"
    if s2.plans[: len(dead.plans)] != dead.plans:
        return "salvage does not replay the dead run's planned batches as planned"
    return None


def rl9_marker_implies_components(cfg: RolloutConfig, s: State) -> str | None:
    """RL9: a commit marker implies every component of its checkpoint durable."""
    for c in s.ckpts:
        if c.committed:
            missing = [name for name, x in zip(COMPONENTS, c.components, strict=True)
                       if x != DURABLE]
            if missing:
                return f"the commit marker of {c.name} names {', '.join(missing)}, not durable"
    return None


def rl10_restart_resumes_a_commit(cfg: RolloutConfig, s: State, a: Action, s2: State
                                  ) -> str | None:
    """RL10 (step): a restart resumes from a commit.  A fork starts from the committed
    checkpoint it names; the automatic resume of the crashed run from the newest step a
    commit marker names for it (the step it started from, if it committed none), never from
    a save that died before its marker, though its model and tracker are on disk; and once
    the job has committed a checkpoint it never starts again as a new run (an empty queue
    from dataset offset 0: every resume silently lost)."""
    if not s.down or s2.down:
        return None  # (not a restart)
    if a.name == "fork":
        c = next(c for c in s.ckpts if c.name == a.args[0])
        if not c.committed:
            return f"the fork restores {c.name}, which has no commit marker"
        if s2.base != c.step:
            return f"the fork of {c.name} starts from step {s2.base}"
        return None
    committed = [c for c in s.ckpts if c.committed]
    if s2.mode == "new":
        if committed:
            return (f"the job started again as a new run from dataset offset 0, but "
                    f"checkpoint {committed[-1].name} is committed")
        return None
    own = [c.step for c in committed if c.run == s.run_id]
    newest = max(own, default=s.base)
    if s2.base != newest:
        commit = (f"its newest commit is step {newest}" if own
                  else f"it committed none and started from step {newest}")
        return (f"{a.name} resumes run r{s.run_id} from step {s2.base}, whose save has no "
                f"commit marker: {commit}")
    return None


def rl11_batch_bound_to_plan(cfg: RolloutConfig, s: State, a: Action, s2: State
                             ) -> str | None:
    """RL11 (step): a batch is bound to its plan.  The hooks and the shards of a planned
    batch are made, and a ready batch is handed to the trainer, only by a builder whose
    configuration (conversion configuration, parallel layout) is the one the batch's
    durable plan digest covers: a builder that would plan it differently is refused."""
    if a.name == "trainer_finish":
        b = s.trained
    elif a.name in ("builder_hooks", "builder_ready") and s.ready < len(s.plans):
        b = s.ready  # (hooks before the plan are RL3's)
    else:
        return None
    if s.plan_layouts[b] != s.layout:
        use = "trained" if a.name == "trainer_finish" else "built"
        return (f"b{b} was planned under layout {s.plan_layouts[b]} but is {use} from a "
                f"builder configured with layout {s.layout}")
    return None


STATE_INVARIANTS = {
    "RL1": rl1_exactly_once_admission,
    "RL2": rl2_accepted_once_never_lost,
    "RL3": rl3_plan_never_changes,
    "RL4": rl4_ack_after_training,
    "RL5": rl5_progress_kept,
    "RL7": rl7_shared_payloads_reachable,
    "RL9": rl9_marker_implies_components,
}
STEP_INVARIANTS = {
    "RL6": rl6_fork_never_changes_source,
    "RL8": rl8_salvage_restores_exactly,
    "RL10": rl10_restart_resumes_a_commit,
    "RL11": rl11_batch_bound_to_plan,
}


@dataclass(frozen=True)
class Liveness:
    """From every reachable state of a configuration it applies to, some path of `fair`
    actions reaches a `goal` state (the explorer's AG EF over the fair edges)."""

    iid: str
    description: str
    applies: Callable[[RolloutConfig], bool]
    goal: Callable[[RolloutConfig, State], bool]
    fair: Callable[[Action], bool]


def _drained(cfg: RolloutConfig, s: State) -> bool:
    """RL12's goal: the dataset admitted in full and generated, and every batch the mix can
    compose made and trained (what still waits is short of a quota)."""
    return (s.cursor == cfg.positions and all(t.status == DONE for t in s.tasks)
            and _backlog(s) < cfg.batch and s.trained == len(s.plans))


def _fair(a: Action) -> bool:
    """The actors keep working (controller, workers, builder, trainer); no fault (a crash,
    an expiry, a builder restarted with another layout) and no lost reply is assumed."""
    return a.kind != FAULT and a.reply != "reply lost"


LIVENESS: tuple[Liveness, ...] = (
    Liveness("RL12", "the dataset is admitted and every batch the mix can compose is "
             "trained (a backlog short of its quota admits fresh work)",
             lambda cfg: cfg.mix, _drained, _fair),
)
ALL_IDS = (frozenset(STATE_INVARIANTS) | frozenset(STEP_INVARIANTS)
           | frozenset(li.iid for li in LIVENESS))


def check_state(cfg: RolloutConfig, s: State) -> tuple[str, str] | None:
    """RL1-RL5, RL7 and RL9 on the active run and the pool, in every state: every state's
    durable part is what a crash at that point leaves."""
    for iid, check in STATE_INVARIANTS.items():
        msg = check(cfg, s)
        if msg is not None:
            return iid, msg
    return None


def check_step(cfg: RolloutConfig, s: State, a: Action, s2: State) -> tuple[str, str] | None:
    """RL6, RL8, RL10 and RL11 compare a step's two sides (history variables carry the
    rest)."""
    for iid, check in STEP_INVARIANTS.items():
        msg = check(cfg, s, a, s2)
        if msg is not None:
            return iid, msg
    return None
