"""Static universe of a bounded model: which packs, extents, queues, tasks and actors exist.

Role: everything that does not change during a run lives here, so that `spec.state.State` only
holds what actions change. Extents are declared up front (name, pack, dependencies); an action
*publishes* a declared extent. Tasks are declared with their scheduling attributes, input,
result and optional continuation extent. Bounds (attempts, epochs, crashes, pauses, checkpoint
registrations) keep the state space finite.

Owners are derived: "app" (the application's named root set), and per queue i the queue owner
"q<i>", the consumer owner "cons<i>" and the checkpoint owner "ckpt<i>".

Configurations used by the explorer, tests and the Hypothesis machine are defined at the bottom.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ExtentDecl:
    """One publication: its pack, the extents it depends on, and its writer (the pack's)."""

    name: str
    pack: int
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class TaskDecl:
    """One task of one queue. Scheduling order: priority desc, then key asc, then fifo asc."""

    name: str
    queue: int
    input: int
    result: int
    priority: int
    key: int  # rank of the scheduling key string (order-preserving abstraction)
    fifo: int
    continuation: int | None = None


@dataclass(frozen=True)
class Config:
    """A bounded configuration. `app_extents` are published by the application through
    publish actions; `preloaded` extents start durable, returned and staged (producer inputs
    already published before the run starts)."""

    name: str
    packs: tuple[str, ...]
    pack_writer: tuple[str, ...]
    extents: tuple[ExtentDecl, ...]
    app_extents: tuple[int, ...] = ()
    preloaded: tuple[int, ...] = ()
    readers: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    tasks: tuple[TaskDecl, ...] = ()
    workers: tuple[str, ...] = ()
    max_attempts: int = 2
    max_epoch: int = 1
    max_crashes: int = 0
    max_pauses: int = 0
    checkpoints: int = 0
    gc: bool = False
    consumer_queues: tuple[int, ...] = ()  # queues whose consumer (and checkpoint) act
    worker_crashes: bool = True
    cancel: bool = True
    compaction: int = 0  # catalog compactions modelled (snapshot generations; 0: none)
    history: int = 0  # queue history segment generations modelled (H1; 0: none)
    # Q6: does a recovery's revocation of an older epoch's leases spend their tasks' retry
    # budget?  True is straw-queue's rule and the engine's default (a leased attempt was
    # made, so max_attempts=1 means at most one); the rollout layer runs its queue with
    # False, so that a job preempted every day does not fail its in-flight prompts.
    recovery_spends_budget: bool = True

    # ----- derived names -----------------------------------------------------------------
    @property
    def owners(self) -> tuple[str, ...]:
        names = ["app"]
        for i in range(len(self.queues)):
            names += [f"q{i}", f"cons{i}", f"ckpt{i}"]
        return tuple(names)

    def owner(self, name: str) -> int:
        return self.owners.index(name)

    def queue_owner(self, q: int) -> int:
        return 1 + 3 * q

    def consumer_owner(self, q: int) -> int:
        return 2 + 3 * q

    def checkpoint_owner(self, q: int) -> int:
        return 3 + 3 * q

    @property
    def writers(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.pack_writer)))

    def ename(self, e: int) -> str:
        return self.extents[e].name

    def edges(self) -> tuple[tuple[int, int], ...]:
        """Dependency edges (extent, dependency)."""
        return tuple((e, d) for e, decl in enumerate(self.extents) for d in decl.deps)

    def pack_of(self) -> tuple[int, ...]:
        return tuple(decl.pack for decl in self.extents)


def _x(name: str, pack: int, *deps: int) -> ExtentDecl:
    return ExtentDecl(name, pack, tuple(deps))


# --- retention / garbage collection --------------------------------------------------------
# p0 = {a, b} (writer w0), p1 = {c -> a} (writer w0), p2 = {d} (writer w1).
# b exists so that a writer could append to p0 after it was reclaimed (path reuse, D3).

GC_SMALL = Config(
    name="gc-small",
    packs=("p0", "p1"),
    pack_writer=("w0", "w0"),
    extents=(_x("a", 0), _x("b", 0), _x("c", 1, 0)),
    app_extents=(0, 1, 2),
    readers=("r0",),
    max_crashes=1,
    gc=True,
)

GC_FULL = Config(
    name="gc-full",
    packs=("p0", "p1", "p2"),
    pack_writer=("w0", "w0", "w1"),
    extents=(_x("a", 0), _x("b", 0), _x("c", 1, 0), _x("d", 2)),
    app_extents=(0, 1, 2, 3),
    readers=("r0",),
    max_crashes=2,
    gc=True,
)

# --- catalog compaction (CS1): p0 = {a}, p1 = {c -> a}, GC, two generations, a crash ------

CATALOG = Config(
    name="catalog",
    packs=("p0", "p1"),
    pack_writer=("w0", "w0"),
    extents=(_x("a", 0), _x("c", 1, 0)),
    app_extents=(0, 1),
    max_crashes=1,
    gc=True,
    compaction=2,
)

# --- queue history segments (H1): two journal snapshots that move history, a crash ---------

HISTORY = Config(
    name="history",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=(_x("i0", 0), _x("r0", 1)),
    preloaded=(0,),
    queues=("q0",),
    tasks=(TaskDecl("t0", 0, input=0, result=1, priority=0, key=0, fifo=0),),
    workers=("w0",),
    max_attempts=1,
    max_crashes=1,
    history=2,
)

# --- queue / lease / coordinator -------------------------------------------------------------
# One task t0 (which may yield once with a continuation input k0), two workers, coordinator
# crash, pause and takeover. The scheduling order needs two pending tasks: see ORDER.

_Q_EXTENTS = (_x("i0", 0), _x("k0", 1), _x("r0", 1))
_Q_TASKS = (TaskDecl("t0", 0, input=0, result=2, priority=0, key=0, fifo=0, continuation=1),)

QUEUE_SMALL = Config(
    name="queue-small",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=_Q_EXTENTS,
    preloaded=(0,),
    queues=("q0",),
    tasks=_Q_TASKS,
    workers=("w0", "w1"),
    max_attempts=2,
    max_epoch=2,
    max_crashes=1,
    max_pauses=1,
    worker_crashes=False,
    cancel=False,
)

QUEUE_FULL = Config(
    name="queue-full",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=_Q_EXTENTS,
    preloaded=(0,),
    queues=("q0",),
    tasks=_Q_TASKS,
    workers=("w0", "w1"),
    max_attempts=2,
    max_epoch=3,
    max_crashes=2,
    max_pauses=1,
    consumer_queues=(0,),
)

# the same queue under the rollout layer's policy: recovery revokes leases without spending
QUEUE_PREEMPT = replace(QUEUE_SMALL, name="queue-preempt", recovery_spends_budget=False)

# --- scheduling order: two tasks whose priority order and key order disagree (Q4) ----------

ORDER_SMALL = Config(
    name="order-small",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=(_x("i0", 0), _x("i1", 0), _x("r0", 1), _x("r1", 1)),
    preloaded=(0, 1),
    queues=("q0",),
    tasks=(
        TaskDecl("t0", 0, input=0, result=2, priority=1, key=1, fifo=0),
        TaskDecl("t1", 0, input=1, result=3, priority=0, key=0, fifo=1),
    ),
    workers=("w0",),
    max_attempts=2,
)

ORDER_FULL = Config(
    name="order-full",
    packs=ORDER_SMALL.packs,
    pack_writer=ORDER_SMALL.pack_writer,
    extents=ORDER_SMALL.extents,
    preloaded=(0, 1),
    queues=("q0",),
    tasks=ORDER_SMALL.tasks,
    workers=("w0", "w1"),
    max_attempts=2,
    consumer_queues=(0,),
)

# --- two queues sharing data, consumers and a checkpoint replaced once ---------------------

SHARE = Config(
    name="share",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=(_x("x", 0), _x("r0", 1), _x("r1", 1)),
    preloaded=(0,),
    queues=("q0", "q1"),
    tasks=(
        TaskDecl("t0", 0, input=0, result=1, priority=0, key=0, fifo=0),
        TaskDecl("t1", 1, input=0, result=2, priority=0, key=0, fifo=0),
    ),
    workers=("w0",),
    max_attempts=1,
    checkpoints=2,
    consumer_queues=(0,),
)

# --- a consumer acknowledging out of order and restoring older views ------------------------
# consume: two results (out-of-order acknowledgement needs two), a checkpoint, no collection.
# restore: one result in its own pack, with collection, so a restore can find it reclaimed.

CONSUME = Config(
    name="consume",
    packs=("p0", "p1", "p2"),
    pack_writer=("prod", "work", "work"),
    extents=(_x("i0", 0), _x("i1", 0), _x("r0", 1), _x("r1", 2)),
    preloaded=(0, 1),
    queues=("q0",),
    tasks=(
        TaskDecl("t0", 0, input=0, result=2, priority=1, key=0, fifo=0),
        TaskDecl("t1", 0, input=1, result=3, priority=0, key=0, fifo=1),
    ),
    workers=("w0",),
    max_attempts=1,
    checkpoints=1,
    consumer_queues=(0,),
    worker_crashes=False,
    cancel=False,
)

RESTORE = Config(
    name="restore",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=(_x("i0", 0), _x("r0", 1)),
    preloaded=(0,),
    queues=("q0",),
    tasks=(TaskDecl("t0", 0, input=0, result=1, priority=0, key=0, fifo=0),),
    workers=("w0",),
    max_attempts=1,
    max_epoch=2,
    max_crashes=1,
    gc=True,
    consumer_queues=(0,),
    worker_crashes=False,
    cancel=False,
)

# --- everything at once: only for random (Hypothesis) exploration ----------------------------
# t2 (queue q1) shares its input i0 with t0 (queue q0).

LARGE = Config(
    name="large",
    packs=("p0", "p1", "p2", "p3"),
    pack_writer=("w0", "w0", "prod", "work"),
    extents=(
        _x("a", 0),
        _x("b", 0),
        _x("c", 1, 0),
        _x("i0", 2),
        _x("i1", 2),
        _x("k0", 3),
        _x("r0", 3),
        _x("r1", 3),
        _x("r2", 3),
    ),
    app_extents=(0, 1, 2),
    preloaded=(3, 4),
    readers=("r0",),
    queues=("q0", "q1"),
    tasks=(
        TaskDecl("t0", 0, input=3, result=6, priority=1, key=1, fifo=0, continuation=5),
        TaskDecl("t1", 0, input=4, result=7, priority=0, key=0, fifo=1),
        TaskDecl("t2", 1, input=3, result=8, priority=0, key=0, fifo=0),
    ),
    workers=("w0", "w1", "w2"),
    max_attempts=3,
    max_epoch=5,
    max_crashes=4,
    max_pauses=2,
    checkpoints=3,
    gc=True,
    consumer_queues=(0, 1),
)

# --- release_publications over dependencies: the producer's published m0 depends on the
# task input i0, so releasing m0 drops i0's staging too, which must wait for t0's submit.

RELEASE_CLOSURE = replace(
    RESTORE,
    name="release-closure",
    extents=(_x("i0", 0), _x("m0", 0, 0), _x("r0", 1)),
    preloaded=(0, 1),
    tasks=(TaskDecl("t0", 0, input=0, result=2, priority=0, key=0, fifo=0),),
    consumer_queues=(),
)

CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (GC_SMALL, GC_FULL, QUEUE_SMALL, QUEUE_FULL, QUEUE_PREEMPT, ORDER_SMALL, ORDER_FULL,
              SHARE, CONSUME, RESTORE, CATALOG, HISTORY, LARGE, RELEASE_CLOSURE)
}
