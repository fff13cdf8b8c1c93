"""Actions of the straw protocol: precondition, effect, reply — one function each.

Role: the transition relation. Every action function takes (cfg, mut, state, args...) and
returns None when its precondition does not hold, otherwise an `Outcome` with the reply the
caller sees and the next state. `successors()` enumerates every enabled action of a state; the
explorer (`model/explore.py`) and the Hypothesis machine both use it, so there is exactly one
definition of the protocol.

Each `mut.<switch>` read below is where that mutant changes the protocol: one place per switch,
except `journal_before_retain`, which swaps two steps and so is read by both.

Atomicity: one action is one indivisible step of one process (a fsync, a durable journal
append with its reply, a lock acquisition). Steps that the engine performs separately and that a
crash can separate are separate actions (write / sync; retain / journal; lock / scan / tombstone /
unlink / unlock; recover / persist epoch under the D9 mutant).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from spec.config import Config
from spec.helpers import (
    best_task,
    dependency_closure,
    lease_is_live,
    order_key,
    release_threshold,
    sparse_released,
    staged_closure,
    unreachable_sealed_packs,
)
from spec.mutants import Mutants
from spec.state import (
    CatalogFiles,
    Commit,
    Coordinator,
    ExtentStatus,
    Lease,
    PackStatus,
    State,
    Storage,
    Task,
    TaskStatus,
)

# Action kinds, used for fairness in liveness checks (see spec/invariants.py).
APP = "app"
COLLECTOR = "collector"
COORDINATOR = "coordinator"
WORKER = "worker"
PRODUCER = "producer"
CONSUMER = "consumer"
CLOCK = "clock"
FAULT = "fault"


@dataclass(frozen=True)
class Action:
    """A taken transition: who did what, with which reply. epoch is the acknowledging
    coordinator's epoch for actions that write a queue journal (checked by D8)."""

    name: str
    args: tuple[str, ...]
    kind: str
    reply: str = "ok"
    epoch: int | None = None
    queue: int | None = None

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.args)}) -> {self.reply}"


@dataclass(frozen=True)
class Outcome:
    reply: str
    state: State


# =============================================================================================
# Derived predicates over storage
# =============================================================================================


def protected_roots(st: Storage) -> frozenset[int]:
    """Extents protected directly: retained by an owner, pinned, or staged."""
    out: set[int] = set(st.staged)
    for roots in st.roots:
        out |= roots
    out |= {e for (_, e) in st.pins}
    return frozenset(out)


def reachable(cfg: Config, st: Storage) -> frozenset[int]:
    """The true protected set: direct protection closed over dependency edges (D4)."""
    return dependency_closure(protected_roots(st), cfg.edges())


def pack_dead(st: Storage, p: int) -> bool:
    """A pack path that carries a tombstone or is gone."""
    return p in st.tombstones or st.packs[p] == PackStatus.UNLINKED


def usable(cfg: Config, st: Storage, e: int, mut: Mutants | None = None) -> bool:
    """A reference may be (re)adopted: durable, and neither it nor any dependency lies in a
    tombstoned pack (D3). Note that an UNLINKED pack *without* tombstone is indistinguishable,
    for a client, from visibility lag — so only the tombstone makes the refusal certain."""
    if st.extents[e] != ExtentStatus.DURABLE:
        return False
    if mut is not None and mut.retain_ignores_tombstone:
        return True
    closure = dependency_closure(frozenset({e}), cfg.edges())
    return all(cfg.extents[x].pack not in st.tombstones for x in closure)


def lock_free(mut: Mutants, s: State) -> bool:
    """Root-adding operations (retain, pin, adoption) serialise with collection: they run only
    while no collector holds the lock (between its scan and its unlock)."""
    return (not s.collector.locked) or mut.collect_without_lock


def _with_roots(st: Storage, owner: int, roots: frozenset[int]) -> Storage:
    new = list(st.roots)
    new[owner] = roots
    return replace(st, roots=tuple(new))


def _with_extent(st: Storage, e: int, status: ExtentStatus) -> Storage:
    ext = list(st.extents)
    ext[e] = status
    return replace(st, extents=tuple(ext))


def _with_pack(st: Storage, p: int, status: PackStatus) -> Storage:
    packs = list(st.packs)
    packs[p] = status
    return replace(st, packs=tuple(packs))


def _with_task(s: State, t: int, task: Task) -> State:
    tasks = list(s.tasks)
    tasks[t] = task
    return replace(s, tasks=tuple(tasks))


def _with_coord(s: State, q: int, c: Coordinator) -> State:
    coords = list(s.coords)
    coords[q] = c
    return replace(s, coords=tuple(coords))


# =============================================================================================
# Derived predicates over the queue
# =============================================================================================


def queue_log(cfg: Config, s: State, q: int) -> tuple[Commit, ...]:
    """Queue q's commit log, in order."""
    return tuple(c for c in s.commits if cfg.tasks[c.lease.task].queue == q)


def journal_named(cfg: Config, s: State, q: int, mut: Mutants | None = None) -> frozenset[int]:
    """What queue q's durable journal names and still needs (D2): inputs of pending and leased
    tasks, and results of commits the consumer (or a rewind to its checkpoint) may still read:
    those at or past the release threshold, except the ones the consumer acknowledged out of
    order that no checkpoint keeps (``sparse_released``). With `mut`, the (possibly mutated)
    rule the coordinator applies when it trims; without, the true rule of the invariants."""
    named = {
        s.tasks[t].input
        for t, decl in enumerate(cfg.tasks)
        if decl.queue == q and s.tasks[t].status in (TaskStatus.PENDING, TaskStatus.LEASED)
    }
    cons = s.consumers[q]
    log = queue_log(cfg, s, q)
    thr = release_threshold(cons.cursor, cons.ck_cursor)
    ck = cons.ck_cursor
    if mut is not None and mut.sparse_ack_ignores_checkpoint:
        ck = None
    named |= {
        c.result
        for i, c in enumerate(log)
        if i >= thr and not sparse_released(i, i in cons.acked, ck)
    }
    return frozenset(named)


def may_acknowledge(c: Coordinator) -> bool:
    """D8: a coordinator acknowledges only while running under the durable (latest) epoch."""
    return c.serving is not None and c.serving == c.durable


def live(cfg: Config, s: State, lease: Lease, mut: Mutants | None = None) -> bool:
    """The lease may commit. With `mut`, the (possibly mutated) check the coordinator runs;
    without, the true rule used by the invariants."""
    task = s.tasks[lease.task]
    expired = task.expired
    if mut is not None and mut.expired_lease_commits:
        expired = False
    return lease_is_live(
        lease.attempt,
        lease.epoch,
        task.status == TaskStatus.LEASED,
        task.attempt,
        task.lease_epoch,
        expired,
    )


def task_order(cfg: Config, s: State, t: int) -> tuple[int, int, int]:
    d = cfg.tasks[t]
    return (d.priority, d.key, _fifo(cfg, s, t))


def _fifo(cfg: Config, s: State, t: int) -> int:
    """The task's FIFO position: the declared one, or the tail position a yield gave it."""
    return s.tasks[t].fifo if s.tasks[t].fifo >= 0 else cfg.tasks[t].fifo


def next_task(cfg: Config, mut: Mutants, s: State, q: int) -> int | None:
    """The pending task of queue q that acquire hands out next (Q4)."""
    pending = [
        t
        for t, d in enumerate(cfg.tasks)
        if d.queue == q and s.tasks[t].status == TaskStatus.PENDING
    ]
    if not pending:
        return None
    if mut.order_ignores_priority:
        return min(pending, key=lambda t: order_key(0, cfg.tasks[t].key, _fifo(cfg, s, t)))
    return pending[best_task([task_order(cfg, s, t) for t in pending])]


def _release_input(cfg: Config, mut: Mutants, st: Storage, q: int, e: int) -> Storage:
    """The queue stops naming input e: drop it from the queue owner's roots only."""
    if mut.release_removes_shared_root:
        return replace(st, roots=tuple(r - {e} for r in st.roots))
    o = cfg.queue_owner(q)
    return _with_roots(st, o, st.roots[o] - {e})


def _trim_results(cfg: Config, mut: Mutants, s: State, q: int) -> State:
    """The queue owner releases results its journal no longer names (below the release
    threshold, or acknowledged out of order and kept by no checkpoint)."""
    o = cfg.queue_owner(q)
    log = queue_log(cfg, s, q)
    drop = {c.result for c in log} - journal_named(cfg, s, q, mut)
    st = _with_roots(s.storage, o, s.storage.roots[o] - drop)
    return replace(s, storage=st)


def _end_lease(cfg: Config, mut: Mutants, s: State, t: int, spend: bool) -> State:
    """A lease ends without a result: back to PENDING, or — when it spends the retry budget
    (`spend`: fail, expiry) and the budget is exhausted — FAILED (then the queue releases the
    task's input). Yield and release do not spend the budget."""
    task = s.tasks[t]
    if spend:
        task = replace(task, failures=task.failures + 1)
    if spend and task.failures >= cfg.max_attempts:
        q = cfg.tasks[t].queue
        s = replace(s, storage=_release_input(cfg, mut, s.storage, q, task.input))
        return _with_task(s, t, replace(task, status=TaskStatus.FAILED, expired=False))
    return _with_task(s, t, replace(task, status=TaskStatus.PENDING, expired=False))


# =============================================================================================
# Storage actions: publish (write + sync), seal, retain, release, release_publications, pins
# =============================================================================================


def write(cfg: Config, mut: Mutants, s: State, e: int) -> Outcome | None:
    """publish, step 1: append extent e (and its manifest) to its writer's open pack.

    Pre: e not yet published; its pack is ABSENT (created now) or OPEN, and the writer has no
    other open pack; every dependency is durable, not in a tombstoned pack and protected
    (retained, pinned or staged) by the caller (D4). Effect: e VOLATILE and staged.
    Reply: nothing yet (the reference is returned by `sync`)."""
    st = s.storage
    decl = cfg.extents[e]
    p = decl.pack
    if st.extents[e] != ExtentStatus.NONE:
        return None
    if pack_dead(st, p):
        if not mut.reclaimed_path_reused:  # D3: a tombstoned path is never reused
            return None
    elif st.packs[p] not in (PackStatus.ABSENT, PackStatus.OPEN):
        return None
    writer = cfg.pack_writer[p]
    for other, w in enumerate(cfg.pack_writer):
        if other != p and w == writer and st.packs[other] == PackStatus.OPEN:
            return None
    prot = reachable(cfg, st)
    for d in decl.deps:
        if st.extents[d] != ExtentStatus.DURABLE or not usable(cfg, st, d):
            return None
        if d not in prot and not mut.dependency_not_protected:
            return None
    st = _with_pack(_with_extent(st, e, ExtentStatus.VOLATILE), p, PackStatus.OPEN)
    st = replace(st, staged=st.staged | {e})
    reply = "written"
    if mut.reply_before_fsync:  # D1 broken: the reference escapes before the fsync
        st = replace(st, returned=st.returned | {e})
        reply = f"ref {cfg.ename(e)}"
    return Outcome(reply, replace(s, storage=st))


def sync(cfg: Config, mut: Mutants, s: State, e: int) -> Outcome | None:
    """publish, step 2: fsync the pack (and its directory when new), then return the reference.

    Pre: e VOLATILE. Effect: e DURABLE, returned. Reply: the reference (D1)."""
    st = s.storage
    if st.extents[e] != ExtentStatus.VOLATILE:
        return None
    st = _with_extent(st, e, ExtentStatus.DURABLE)
    st = replace(st, returned=st.returned | {e})
    return Outcome(f"ref {cfg.ename(e)}", replace(s, storage=st))


def seal(cfg: Config, mut: Mutants, s: State, p: int) -> Outcome | None:
    """Seal an open pack. Pre: OPEN, no unsynced extent in it. Effect: SEALED."""
    st = s.storage
    if st.packs[p] != PackStatus.OPEN:
        return None
    if any(
        cfg.extents[e].pack == p and st.extents[e] == ExtentStatus.VOLATILE
        for e in range(len(cfg.extents))
    ):
        return None
    return Outcome("sealed", replace(s, storage=_with_pack(st, p, PackStatus.SEALED)))


def retain(cfg: Config, mut: Mutants, s: State, owner: int, e: int) -> Outcome | None:
    """retain(owner, roots | {e}): replace the owner's roots with a set that also holds e.

    Pre: e was returned to some client; no collector holds the lock; e not yet a root of owner.
    Effect/Reply: if e and its dependencies are usable (no tombstone, D3), roots[owner] gains e,
    reply "ok"; otherwise the reply is InvalidReference and nothing changes (not a transition)."""
    st = s.storage
    if e not in st.returned or e in st.roots[owner] or not lock_free(mut, s):
        return None
    if not usable(cfg, st, e, mut):
        return None  # reply InvalidReference, state unchanged
    return Outcome("ok", replace(s, storage=_with_roots(st, owner, st.roots[owner] | {e})))


def release(cfg: Config, mut: Mutants, s: State, owner: int) -> Outcome | None:
    """release(owner): drop all of the owner's roots. Pre: roots non-empty."""
    st = s.storage
    if not st.roots[owner]:
        return None
    return Outcome("ok", replace(s, storage=_with_roots(st, owner, frozenset())))


def release_publications(cfg: Config, mut: Mutants, s: State, e: int) -> Outcome | None:
    """release_publications([e]): drop the staging of e and of what e depends on, transitively
    (straw-queue's rule): every staged extent reachable from e through staged extents (an
    unstaged one's dependencies went with its own staging).

    Pre: e staged and durable. For every producer input among the dropped extents: every
    submit naming it is acknowledged, i.e. its journal entry is durable (D2/R1). Effect: the
    dropped extents are no longer staged. Mutant release_closure_unchecked checks e only."""
    st = s.storage
    if e not in st.staged or st.extents[e] != ExtentStatus.DURABLE:
        return None
    dropped = staged_closure(e, st.staged, cfg.edges())
    checked = {e} if mut.release_closure_unchecked else dropped
    for t, decl in enumerate(cfg.tasks):
        if decl.input in checked:
            req = s.requests[t]
            done = req.sent if mut.staging_released_before_journal else req.acked
            if not done:
                return None
    return Outcome("ok", replace(s, storage=replace(st, staged=st.staged - dropped)))


def pin(cfg: Config, mut: Mutants, s: State, reader: str, e: int) -> Outcome | None:
    """pin([e]) by a reader: a reader-held owner. Same pre/reply as retain."""
    st = s.storage
    if e not in st.returned or (reader, e) in st.pins or not lock_free(mut, s):
        return None
    if not usable(cfg, st, e, mut):
        return None  # InvalidReference
    return Outcome("ok", replace(s, storage=replace(st, pins=st.pins | {(reader, e)})))


def unpin(cfg: Config, mut: Mutants, s: State, reader: str, e: int) -> Outcome | None:
    """The reader finished: drop its pin. Pre: pinned."""
    st = s.storage
    if (reader, e) not in st.pins:
        return None
    return Outcome("ok", replace(s, storage=replace(st, pins=st.pins - {(reader, e)})))


def writer_crash(cfg: Config, mut: Mutants, s: State, writer: str) -> Outcome | None:
    """SIGKILL / power loss of a store writer: unsynced extents are LOST (their staging with
    them); its open packs are abandoned, which recovery treats as sealed (tail trimmed)."""
    st = s.storage
    if s.crashes >= cfg.max_crashes:
        return None
    mine = {p for p, w in enumerate(cfg.pack_writer) if w == writer}
    open_packs = {p for p in mine if st.packs[p] == PackStatus.OPEN}
    volatile = {
        e
        for e in range(len(cfg.extents))
        if cfg.extents[e].pack in mine and st.extents[e] == ExtentStatus.VOLATILE
    }
    if not open_packs and not volatile:
        return None
    for e in volatile:
        st = _with_extent(st, e, ExtentStatus.LOST)
    for p in open_packs:
        st = _with_pack(st, p, PackStatus.SEALED)
    st = replace(st, staged=st.staged - volatile)
    return Outcome("crashed", replace(s, storage=st, crashes=s.crashes + 1))


# =============================================================================================
# Collection: lock, scan, tombstone, unlink, unlock (separate steps); collector crash
# =============================================================================================


def gc_lock(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Take the cross-client collection lock. Pre: free."""
    if s.collector.locked:
        return None
    return Outcome("locked", replace(s, collector=replace(s.collector, locked=True)))


def gc_scan(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Compute the plan: sealed, untombstoned packs holding no reachable extent (D4).
    Pre: lock held, no plan yet. Effect: plan (volatile)."""
    st = s.storage
    if not s.collector.locked or s.collector.plan is not None:
        return None
    edges = () if mut.gc_ignores_dependencies else cfg.edges()
    reach = dependency_closure(protected_roots(st), edges)
    sealed = frozenset(
        p
        for p, status in enumerate(st.packs)
        if status == PackStatus.SEALED and p not in st.tombstones
    )
    plan = unreachable_sealed_packs(sealed, cfg.pack_of(), reach)
    names = ",".join(cfg.packs[p] for p in sorted(plan)) or "nothing"
    return Outcome(f"plan {names}", replace(s, collector=replace(s.collector, plan=plan)))


def gc_tombstone(cfg: Config, mut: Mutants, s: State, p: int) -> Outcome | None:
    """Write p's durable tombstone. Pre: lock held, p in the plan, not yet tombstoned."""
    st = s.storage
    plan = s.collector.plan
    if not s.collector.locked or plan is None or p not in plan or p in st.tombstones:
        return None
    if st.packs[p] != PackStatus.SEALED:
        return None
    return Outcome("tombstoned", replace(s, storage=replace(st, tombstones=st.tombstones | {p})))


def gc_unlink(cfg: Config, mut: Mutants, s: State, p: int) -> Outcome | None:
    """Unlink a tombstoned pack (D3). Pre: lock held; p carries a tombstone and is not yet
    unlinked — from this collection or an interrupted earlier one (which this one finishes)."""
    st = s.storage
    plan = s.collector.plan
    if not s.collector.locked or st.packs[p] != PackStatus.SEALED:
        return None
    if mut.unlink_before_tombstone:
        if not (p in st.tombstones or (plan is not None and p in plan)):
            return None
    elif p not in st.tombstones:
        return None
    if mut.interrupted_collection_abandoned and (plan is None or p not in plan):
        return None
    return Outcome("unlinked", replace(s, storage=_with_pack(st, p, PackStatus.UNLINKED)))


def gc_unlock(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Finish the collection: drop plan and lock. Pre: lock held and scanned."""
    if not s.collector.locked or s.collector.plan is None:
        return None
    return Outcome("unlocked", replace(s, collector=replace(s.collector, locked=False, plan=None)))


def collector_crash(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The collector dies holding the lock: the OS releases the lock; the plan is lost;
    tombstones already written stay."""
    if not s.collector.locked or s.crashes >= cfg.max_crashes:
        return None
    return Outcome(
        "crashed",
        replace(s, collector=replace(s.collector, locked=False, plan=None), crashes=s.crashes + 1),
    )


# =============================================================================================
# Queue: submit (retain, then journal), acquire, expiry, complete, fail, yield, cancel, reads
# =============================================================================================


def submit(cfg: Config, mut: Mutants, s: State, t: int) -> Outcome | None:
    """submit_tasks: the producer sends task t (naming its staged input). Pre: not sent."""
    if s.requests[t].sent:
        return None
    reqs = list(s.requests)
    reqs[t] = replace(reqs[t], sent=True)
    return Outcome("sent", replace(s, requests=tuple(reqs)))


def coord_retain_input(cfg: Config, mut: Mutants, s: State, t: int) -> Outcome | None:
    """Coordinator, submit step 1 (D2): retain t's input under the queue owner.

    Pre: may acknowledge; request sent and unacknowledged; task not yet journaled (under the
    journal_before_retain mutant: already journaled); input not yet a root of the queue; lock
    free; input usable (else InvalidReference, no transition)."""
    q = cfg.tasks[t].queue
    c = s.coords[q]
    task = s.tasks[t]
    st = s.storage
    o = cfg.queue_owner(q)
    if not may_acknowledge(c) or not s.requests[t].sent or s.requests[t].acked:
        return None
    expected = TaskStatus.PENDING if mut.journal_before_retain else TaskStatus.UNSUBMITTED
    if task.status != expected or task.input in st.roots[o] or not lock_free(mut, s):
        return None
    if not usable(cfg, st, task.input, mut):
        return None
    st = _with_roots(st, o, st.roots[o] | {task.input})
    return Outcome("retained", replace(s, storage=st))


def coord_journal_submit(cfg: Config, mut: Mutants, s: State, t: int) -> Outcome | None:
    """Coordinator, submit step 2: make the task's journal entry durable, then reply.

    Pre: may acknowledge; request sent, unacknowledged; task not journaled; its input retained
    under the queue owner (D2; skipped by journal_before_retain). Effect: task PENDING, request
    acknowledged. Reply: accepted (the producer may now release staging)."""
    q = cfg.tasks[t].queue
    c = s.coords[q]
    task = s.tasks[t]
    o = cfg.queue_owner(q)
    if not may_acknowledge(c) or not s.requests[t].sent or s.requests[t].acked:
        return None
    if task.status != TaskStatus.UNSUBMITTED:
        return None
    if not mut.journal_before_retain and task.input not in s.storage.roots[o]:
        return None
    s = _with_task(s, t, replace(task, status=TaskStatus.PENDING))
    reqs = list(s.requests)
    reqs[t] = replace(reqs[t], acked=True)
    return Outcome("accepted", replace(s, requests=tuple(reqs)))


def acquire(cfg: Config, mut: Mutants, s: State, w: int, q: int) -> Outcome | None:
    """acquire(worker): lease the first pending task in scheduling order (Q4) and pin its input
    for the worker's read (D5).

    Pre: may acknowledge; worker holds no lease and has no outstanding read (a worker works
    on one task at a time); some task pending; lock free (the pin adds a root).
    Effect (one durable journal entry, the lease grant, before the reply): task LEASED with
    attempt+1 and the serving epoch; worker holds the lease; read pin (worker, input); the
    worker starts reading. The grant is journaled so that recovery keeps the attempt number
    and the reader's protection (D5: coordinator change never revokes it). Reply: status
    acquired + lease (no pending task: status empty, no transition)."""
    c = s.coords[q]
    if not may_acknowledge(c) or any(le.worker == w for le in s.leases):
        return None
    if any(r[0] == w for r in s.reads):
        return None  # a worker reads one task at a time: release_reads before acquiring again
    if not lock_free(mut, s):
        return None
    t = next_task(cfg, mut, s, q)
    if t is None:
        return None
    s, lease = _grant(cfg, mut, s, w, q, t)
    return Outcome(f"acquired {cfg.tasks[t].name}#{lease.attempt}@e{lease.epoch}", s)


def _grant(cfg: Config, mut: Mutants, s: State, w: int, q: int, t: int) -> tuple[State, Lease]:
    """The journaled grant of task t to worker w (acquire, complete_and_acquire): LEASED with
    attempt+1 and the serving epoch; w holds the lease; read pin (w, input); w reads it."""
    c = s.coords[q]
    task = s.tasks[t]
    assert c.serving is not None
    attempt = task.attempt if mut.lease_attempt_not_incremented else task.attempt + 1
    lease = Lease(w, t, attempt, c.serving)
    s = _with_task(
        s,
        t,
        replace(
            task,
            status=TaskStatus.LEASED,
            attempt=lease.attempt,
            lease_epoch=c.serving,
            holder=w,
            expired=False,
        ),
    )
    wname = cfg.workers[w]
    st = replace(s.storage, pins=s.storage.pins | {(wname, task.input)})
    s = replace(
        s,
        storage=st,
        leases=s.leases | {lease},
        reads=s.reads | {(w, t, task.input)},
    )
    return s, lease


def heartbeat(cfg: Config, mut: Mutants, s: State, lease: Lease) -> Outcome | None:
    """heartbeat([lease]): extends a live lease (the abstract clock has no deadlines, so the
    state does not change); an expired or stale lease gets LeaseExpired/StaleAttempt."""
    if lease not in s.leases:
        return None
    reply = "ok" if live(cfg, s, lease) else "LeaseExpired/StaleAttempt"
    return Outcome(reply, s)


def expire(cfg: Config, mut: Mutants, s: State, t: int) -> Outcome | None:
    """The clock passes task t's lease deadline (nondeterministic). Effect: expired. The
    worker's right to commit is revoked; its read pin is NOT released (D5)."""
    task = s.tasks[t]
    if task.status != TaskStatus.LEASED or task.expired:
        return None
    s = _with_task(s, t, replace(task, expired=True))
    if mut.pin_dropped_on_expiry:
        holders = {
            cfg.workers[le.worker] for le in s.leases if le.task == t and le.attempt == task.attempt
        }
        st = s.storage
        s = replace(s, storage=replace(st, pins=st.pins - {(h, task.input) for h in holders}))
    return Outcome("expired", s)


def requeue_expired(cfg: Config, mut: Mutants, s: State, t: int) -> Outcome | None:
    """Coordinator reclaims an expired lease: task back to PENDING (FAILED when attempts are
    exhausted). Pre: may acknowledge; task LEASED and expired."""
    q = cfg.tasks[t].queue
    c = s.coords[q]
    task = s.tasks[t]
    if mut.expired_task_never_requeued:
        return None
    if not may_acknowledge(c) or task.status != TaskStatus.LEASED or not task.expired:
        return None
    s = _end_lease(cfg, mut, s, t, spend=True)
    return Outcome(s.tasks[t].status.value, s)


def complete(cfg: Config, mut: Mutants, s: State, lease: Lease, delivered: bool) -> Outcome | None:
    """complete_task(lease, submission_id=lease, result_ref): accept a result.

    Pre: the worker holds the lease; the task's coordinator may acknowledge.
    Retry (D7): a commit with this submission id exists → reply the original receipt, nothing
    is committed again. Fresh: the lease is live (attempt, epoch, not expired: Q3) → the result
    (published by the worker) is retained under the queue owner, then the commit entry is
    journaled (D2), the task's input released by the queue, task COMPLETED. Reply: receipt;
    `delivered=False` models a lost reply (the worker keeps the lease and retries).
    Otherwise: StaleAttempt/LeaseExpired (modelled by `abandon`)."""
    t = lease.task
    q = cfg.tasks[t].queue
    c = s.coords[q]
    if lease not in s.leases or not may_acknowledge(c):
        return None
    already = any(cm.lease == lease for cm in s.commits)
    if already and not mut.retry_without_idempotency:
        if not delivered:
            return None  # a lost reply to a retry changes nothing
        return Outcome("receipt (original)", replace(s, leases=s.leases - {lease}))
    if not already and not live(cfg, s, lease, mut):
        return None
    if not lock_free(mut, s):
        return None
    s = _commit(cfg, mut, s, lease)
    if delivered:
        return Outcome("receipt", replace(s, leases=s.leases - {lease}))
    return Outcome("reply lost", s)


def complete_and_acquire(
    cfg: Config, mut: Mutants, s: State, lease: Lease, delivered: bool
) -> Outcome | None:
    """complete_and_acquire(lease, submission_id=lease, result_ref): straw's addition (not in
    straw-queue): the worker's result is accepted and its next task leased in ONE journal
    transaction (one durable step instead of two).

    Pre: complete's fresh case (the worker holds the lease, it is live: Q3; may acknowledge;
    lock free) and acquire's (the worker has no outstanding read — it released its reads
    first —, some other task pending). Effect: exactly complete's commit (D2: the result is
    retained by q before the transaction is journaled) followed by acquire's grant of the
    first pending task in scheduling order (Q4), atomically: a crash keeps both or neither.
    Reply: the receipt and the new lease; `delivered=False` models a lost reply (the worker
    keeps the old lease and retries with complete: the original receipt; the lease granted
    with it is held by nobody until it expires). A retry of an accepted submission is
    `complete`'s retry, not this action. Mutants: `combined_commit_skips_liveness` (the
    combined path does not check the completed lease: Q3), `combined_grant_without_read_pin`
    (its grant does not record the reader's protection of the new task's input: Q5)."""
    t = lease.task
    q = cfg.tasks[t].queue
    if lease not in s.leases or not may_acknowledge(s.coords[q]):
        return None
    if any(cm.lease == lease for cm in s.commits):
        return None  # a retry: complete's retry path answers it
    if not mut.combined_commit_skips_liveness and not live(cfg, s, lease, mut):
        return None
    if any(r[0] == lease.worker for r in s.reads) or not lock_free(mut, s):
        return None
    s = _commit(cfg, mut, s, lease)
    s = replace(s, leases=s.leases - {lease})
    nxt = next_task(cfg, mut, s, q)
    if nxt is None:
        return None  # nothing to lease: the engine's reply is complete's (acquire empty)
    s, granted = _grant(cfg, mut, s, lease.worker, q, nxt)
    if mut.combined_grant_without_read_pin:
        pin = (cfg.workers[lease.worker], s.tasks[nxt].input)
        s = replace(s, storage=replace(s.storage, pins=s.storage.pins - {pin}))
    if not delivered:
        s = replace(s, leases=s.leases - {granted} | {lease},
                    reads=frozenset(r for r in s.reads if r[1] != nxt or r[0] != lease.worker))
        return Outcome("reply lost", s)
    name = f"{cfg.tasks[nxt].name}#{granted.attempt}@e{granted.epoch}"
    return Outcome(f"receipt + acquired {name}", s)


def _commit(cfg: Config, mut: Mutants, s: State, lease: Lease) -> State:
    """Publish the result, retain it under the queue owner, journal the commit (D2), release the
    task's input from the queue owner, mark the task COMPLETED."""
    t = lease.task
    decl = cfg.tasks[t]
    q = decl.queue
    o = cfg.queue_owner(q)
    st = s.storage
    r = decl.result
    st = _with_extent(st, r, ExtentStatus.DURABLE)
    if st.packs[cfg.extents[r].pack] == PackStatus.ABSENT:
        st = _with_pack(st, cfg.extents[r].pack, PackStatus.OPEN)
    st = replace(st, returned=st.returned | {r})
    st = _with_roots(st, o, st.roots[o] | {r})
    task = s.tasks[t]
    if task.status in (TaskStatus.PENDING, TaskStatus.LEASED):
        st = _release_input(cfg, mut, st, q, task.input)
    s = replace(s, storage=st, commits=s.commits + (Commit(lease, r),))
    return _with_task(s, t, replace(task, status=TaskStatus.COMPLETED, expired=False))


def fail(cfg: Config, mut: Mutants, s: State, lease: Lease, delivered: bool) -> Outcome | None:
    """fail_task(lease, request_id=...): the lease ends and spends one unit of the retry
    budget; task PENDING, or FAILED when the budget (max_attempts failures) is exhausted.
    The request id is journaled with it (`answered`). Pre: lease held; may acknowledge.
    **Retry** (the request is journaled: its reply was lost): nothing changes, the worker
    gets the original outcome (Q7) and drops the lease. **Fresh**: the lease is live.
    `delivered=False` models a lost reply (the worker keeps the lease and retries)."""
    q = cfg.tasks[lease.task].queue
    if lease not in s.leases or not may_acknowledge(s.coords[q]):
        return None
    if lease in s.answered:
        if not delivered:
            return None  # a lost reply to a retry changes nothing
        # request_retry_refused: the lease is checked before the request id, so the retry
        # of a fail that took effect is told StaleAttempt
        reply = "StaleAttempt" if mut.request_retry_refused else "failed (original)"
        return Outcome(reply, replace(s, leases=s.leases - {lease}))
    if not live(cfg, s, lease, mut):
        return None
    s = _end_lease(cfg, mut, s, lease.task, spend=True)
    s = replace(s, answered=s.answered | {lease})
    if not delivered:
        return Outcome("reply lost", s)
    s = replace(s, leases=s.leases - {lease})
    return Outcome(s.tasks[lease.task].status.value, s)


def release_lease(cfg: Config, mut: Mutants, s: State, lease: Lease) -> Outcome | None:
    """release_tasks([lease]): give a leased task back unfinished without spending the retry
    budget; task PENDING. Pre: lease held; may acknowledge; the lease is the task's current
    one (attempt and epoch) — an expired but not yet requeued lease may still be released.

    Not enumerated by `successors`: acquire/release can repeat forever (attempt numbers
    grow without bound), so the explorer would not terminate. It has the shape of `yield`
    without a new input; the conformance machine (tests/conformance) drives it."""
    t = lease.task
    q = cfg.tasks[t].queue
    task = s.tasks[t]
    if lease not in s.leases or not may_acknowledge(s.coords[q]):
        return None
    if task.status != TaskStatus.LEASED or (task.attempt, task.lease_epoch) != (
        lease.attempt,
        lease.epoch,
    ):
        return None
    s = _end_lease(cfg, mut, s, t, spend=False)
    return Outcome("released", replace(s, leases=s.leases - {lease}))


def yield_task(cfg: Config, mut: Mutants, s: State, lease: Lease) -> Outcome | None:
    """yield_tasks(lease, continuation): the worker publishes a continuation input (a partial
    rollout); the coordinator retains it under the queue owner, journals the task as PENDING
    with the continuation as its input, and releases the old input (D2).
    Pre: lease held and live; may acknowledge; the task has an unused continuation; lock free.
    Effect also: task PENDING (a yield does not spend the retry budget) at the tail of the
    queue's FIFO: after every task submitted or yielded before it (Q4)."""
    t = lease.task
    decl = cfg.tasks[t]
    q = decl.queue
    task = s.tasks[t]
    if lease not in s.leases or not may_acknowledge(s.coords[q]) or not live(cfg, s, lease, mut):
        return None
    k = decl.continuation
    if k is None or task.yielded or not lock_free(mut, s):
        return None
    o = cfg.queue_owner(q)
    st = _with_extent(s.storage, k, ExtentStatus.DURABLE)
    if st.packs[cfg.extents[k].pack] == PackStatus.ABSENT:
        st = _with_pack(st, cfg.extents[k].pack, PackStatus.OPEN)
    st = replace(st, returned=st.returned | {k})
    st = _with_roots(st, o, st.roots[o] | {k})
    st = _release_input(cfg, mut, st, q, task.input)
    s = replace(s, storage=st, leases=s.leases - {lease})
    tail = 1 + max([d.fifo for d in cfg.tasks] + [x.fifo for x in s.tasks])
    s = _with_task(s, t, replace(task, input=k, yielded=True, fifo=tail))
    s = _end_lease(cfg, mut, s, t, spend=False)
    return Outcome(f"yielded ({s.tasks[t].status.value})", s)


def abandon(cfg: Config, mut: Mutants, s: State, lease: Lease) -> Outcome | None:
    """The worker drops a lease that can no longer commit, after a StaleAttempt /
    LeaseExpired reply. Its reads and read pin stay until release_reads. (A worker that gives
    up a live lease silently is a worker crash.)"""
    if lease not in s.leases or live(cfg, s, lease) or lease in s.answered:
        return None  # (a lost fail reply is retried: the journal answers it)
    return Outcome("StaleAttempt: dropped", replace(s, leases=s.leases - {lease}))


def cancel(cfg: Config, mut: Mutants, s: State, t: int) -> Outcome | None:
    """cancel_task(t): PENDING or LEASED → CANCELLED; the queue releases the input. A lease on
    it loses its right to commit; the worker's read pin stays (D5)."""
    q = cfg.tasks[t].queue
    task = s.tasks[t]
    if not cfg.cancel or not may_acknowledge(s.coords[q]):
        return None
    if task.status not in (TaskStatus.PENDING, TaskStatus.LEASED):
        return None
    st = _release_input(cfg, mut, s.storage, q, task.input)
    s = replace(s, storage=st)
    return Outcome(
        "cancelled", _with_task(s, t, replace(task, status=TaskStatus.CANCELLED, expired=False))
    )


def release_reads(cfg: Config, mut: Mutants, s: State, w: int, t: int) -> Outcome | None:
    """release_task_reads: the worker finished reading t's inputs — the only release of its read
    pins besides retire_worker (D5)."""
    mine = {r for r in s.reads if r[0] == w and r[1] == t}
    if not mine:
        return None
    reads = s.reads - mine
    wname = cfg.workers[w]
    still = {e for (ww, _, e) in reads if ww == w}
    unpins = {(wname, e) for (_, _, e) in mine if e not in still}
    st = replace(s.storage, pins=s.storage.pins - unpins)
    return Outcome("ok", replace(s, reads=reads, storage=st))


def worker_crash(cfg: Config, mut: Mutants, s: State, w: int) -> Outcome | None:
    """SIGKILL of a worker: its leases and reads are gone; its read pins stay (durable) until
    its retirement is confirmed."""
    if not cfg.worker_crashes or s.crashes >= cfg.max_crashes:
        return None
    leases = {le for le in s.leases if le.worker == w}
    reads = {r for r in s.reads if r[0] == w}
    if not leases and not reads:
        return None
    return Outcome(
        "crashed",
        replace(s, leases=s.leases - leases, reads=s.reads - reads, crashes=s.crashes + 1),
    )


def retire_worker(cfg: Config, mut: Mutants, s: State, w: int, q: int) -> Outcome | None:
    """retire_worker(w) at queue q's coordinator: confirmed that w is stopped (it reads
    nothing any more): drop its read pins, and revoke every lease of q's task table granted
    to w — each spends one unit of its task's retry budget, like an expiry (Q6), and the
    task returns to PENDING (FAILED when the budget is exhausted). Pre: w has no reads; w
    holds pins or leased tasks of q; with leases to revoke, q's coordinator may acknowledge
    (the revocation is journaled)."""
    wname = cfg.workers[w]
    if any(r[0] == w for r in s.reads):
        return None
    mine = {pn for pn in s.storage.pins if pn[0] == wname}
    leased = [t for t, tk in enumerate(s.tasks) if tk.status == TaskStatus.LEASED
              and tk.holder == w and cfg.tasks[t].queue == q]
    if not mine and not leased:
        return None
    if leased and not may_acknowledge(s.coords[q]):
        return None
    s = replace(s, storage=replace(s.storage, pins=s.storage.pins - mine))
    for t in leased:
        s = _end_lease(cfg, mut, s, t, spend=not mut.retire_spends_no_budget)
    return Outcome("retired", s)


# =============================================================================================
# Coordinators: crash, pause, resume, recover (new epoch), a resumed old coordinator
# =============================================================================================


def coord_crash(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """The coordinator process dies; its lock is released. Bounded so that a new epoch remains
    available (durable < max_epoch)."""
    c = s.coords[q]
    if c.serving is None or s.crashes >= cfg.max_crashes or c.durable >= cfg.max_epoch:
        return None
    return Outcome(
        "crashed", replace(_with_coord(s, q, replace(c, serving=None)), crashes=s.crashes + 1)
    )


def coord_pause(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """SIGSTOP / partition of the serving coordinator: it stops without noticing; its lock
    lease lapses."""
    c = s.coords[q]
    if c.serving is None or c.paused is not None or s.pauses >= cfg.max_pauses:
        return None
    if c.durable >= cfg.max_epoch:
        return None
    s = _with_coord(s, q, replace(c, serving=None, paused=c.serving))
    return Outcome("paused", replace(s, pauses=s.pauses + 1))


def coord_resume(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """The paused coordinator resumes before anyone took over: its epoch is still the durable
    one, so it simply serves again."""
    c = s.coords[q]
    if c.paused is None or c.serving is not None or c.paused != c.durable:
        return None
    return Outcome("resumed", _with_coord(s, q, replace(c, serving=c.paused, paused=None)))


def coord_recover(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """A new coordinator takes the queue lock and recovers (D9): new epoch = durable + 1, made
    durable before service; state = snapshot + journal; the new epoch's journal record revokes
    every lease of an older epoch: each leased task keeps its attempt counter (the next lease
    gets a higher attempt number) and, under `recovery_spends_budget`, spends one unit of its
    retry budget like an expiry (Q6: PENDING, or FAILED when the budget is exhausted); without
    it the task returns to PENDING unspent; read pins stay (D5); the queue owner's roots are
    reset to exactly what the journal names (retained-but-unjournaled data is dropped).
    Pre: no coordinator serving; durable < max_epoch."""
    c = s.coords[q]
    if c.serving is not None or c.durable >= cfg.max_epoch:
        return None
    new = c.durable + 1
    if mut.epoch_not_durable_before_service:
        c = replace(c, serving=new)  # durable epoch written later by coord_persist_epoch
    else:
        c = replace(c, serving=new, durable=new)
    s = _with_coord(s, q, c)
    for t, decl in enumerate(cfg.tasks):
        task = s.tasks[t]
        if decl.queue == q and task.status == TaskStatus.LEASED:
            if mut.lease_grant_not_journaled:
                # the grant (and the read protection it recorded) was never durable
                lost = {
                    (cfg.workers[le.worker], task.input)
                    for le in s.leases
                    if le.task == t and le.attempt == task.attempt
                }
                st = replace(s.storage, pins=s.storage.pins - lost)
                s = replace(s, storage=st)
                task = replace(task, attempt=task.attempt - 1)
                s = _with_task(s, t, task)
            spend = cfg.recovery_spends_budget and not mut.recovery_spends_no_budget
            s = _end_lease(cfg, mut, s, t, spend=spend)
    o = cfg.queue_owner(q)
    s = replace(s, storage=_with_roots(s.storage, o, journal_named(cfg, s, q)))
    return Outcome(f"serving e{new}", s)


def coord_persist_epoch(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """Only reachable under epoch_not_durable_before_service: the late epoch write."""
    c = s.coords[q]
    if c.serving is None or c.serving <= c.durable:
        return None
    return Outcome("epoch durable", _with_coord(s, q, replace(c, durable=c.serving)))


def old_coord_complete(cfg: Config, mut: Mutants, s: State, lease: Lease) -> Outcome | None:
    """A paused old coordinator resumes and receives complete_task for a lease it granted.
    D8: it checks the durable epoch under the lock, finds a newer one, and replies Fenced /
    IndeterminateCommit (the worker drops the lease); the old process then exits.
    (fencing_skipped: it commits using its stale view.)"""
    q = cfg.tasks[lease.task].queue
    c = s.coords[q]
    if c.paused is None or c.paused >= c.durable or lease.epoch != c.paused:
        return None
    if lease not in s.leases:
        return None
    if mut.fencing_skipped:
        s = _commit(cfg, mut, s, lease)
        return Outcome("receipt (stale coordinator)", replace(s, leases=s.leases - {lease}))
    s = _with_coord(s, q, replace(c, paused=None))
    return Outcome("Fenced", replace(s, leases=s.leases - {lease}))


# =============================================================================================
# Consumers and checkpoints
# =============================================================================================


def consume(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """read_commits + acknowledge: the consumer adopts the next commit's result under its own
    owner (retain first), advances its cursor, then the queue releases results below the
    release threshold. Pre: an unread commit; lock free."""
    cons = s.consumers[q]
    log = queue_log(cfg, s, q)
    if cons.cursor >= len(log) or not lock_free(mut, s):
        return None
    r = log[cons.cursor].result
    o = cfg.consumer_owner(q)
    st = _with_roots(s.storage, o, s.storage.roots[o] | {r})
    cursor, acked = _slide(cons.cursor + 1, cons.acked)
    consumers = list(s.consumers)
    consumers[q] = replace(cons, cursor=cursor, acked=acked, buffer=cons.buffer | {r})
    s = replace(s, storage=st, consumers=tuple(consumers))
    return Outcome(f"read {cfg.ename(r)}", _trim_results(cfg, mut, s, q))


def _slide(cursor: int, acked: frozenset[int]) -> tuple[int, frozenset[int]]:
    """The processed cursor passes the contiguous acknowledged positions after it."""
    while cursor in acked:
        acked = acked - {cursor}
        cursor += 1
    return cursor, acked


def acknowledge(cfg: Config, mut: Mutants, s: State, q: int, i: int) -> Outcome | None:
    """save_consumer_state with a progress record listing commit i as processed out of order
    (past the cursor): the consumer adopts its result under its own owner (it relies on it
    until trained), then the queue releases it unless a checkpoint keeps it. Pre: commit i
    exists, i > cursor, not acknowledged yet; lock free."""
    cons = s.consumers[q]
    log = queue_log(cfg, s, q)
    if not cons.cursor < i < len(log) or i in cons.acked or not lock_free(mut, s):
        return None
    r = log[i].result
    o = cfg.consumer_owner(q)
    st = _with_roots(s.storage, o, s.storage.roots[o] | {r})
    consumers = list(s.consumers)
    consumers[q] = replace(cons, acked=cons.acked | {i}, buffer=cons.buffer | {r})
    s = replace(s, storage=st, consumers=tuple(consumers))
    return Outcome(f"acknowledged {cfg.ename(r)}", _trim_results(cfg, mut, s, q))


def restore(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """save_consumer_state with an older view (straw-queue's rewind: the consumer state of an
    application checkpoint, here cursor 0 and nothing acknowledged), relying on no checkpoint
    cursor: every result the new view needs that the queue no longer roots must still be
    usable (someone else retained it); the coordinator checks that and re-adopts them under
    the queue owner before journaling. Otherwise the reply is InvalidReference and nothing
    changes (not a transition). Pre: the view moves back; lock free (it adds roots)."""
    cons = s.consumers[q]
    if (cons.cursor == 0 and not cons.acked) or not lock_free(mut, s):
        return None
    consumers = list(s.consumers)
    consumers[q] = replace(cons, cursor=0, acked=frozenset())
    new = _readopt_history(cfg, mut, replace(s, consumers=tuple(consumers)), q)
    return None if new is None else Outcome("restored", new)


def _readopt_history(cfg: Config, mut: Mutants, new: State, q: int) -> State | None:
    """A consumer view that needs released history again (a restore, or a checkpoint whose
    cursor keeps acknowledged results): what the new state's journal names that the queue
    owner no longer roots must be usable, and is re-adopted (before the journal records the
    view, D2); None (InvalidReference, nothing changes) if any of it is not usable."""
    o = cfg.queue_owner(q)
    st = new.storage
    again = journal_named(cfg, new, q) - st.roots[o]
    if not mut.restore_skips_usable_check and not all(usable(cfg, st, e) for e in again):
        return None
    if mut.restore_without_readopt:
        return new
    return replace(new, storage=_with_roots(st, o, st.roots[o] | again))


def consumer_drop(cfg: Config, mut: Mutants, s: State, q: int, e: int) -> Outcome | None:
    """The consumer is done with result e (trained on it): drop it from its state and owner."""
    cons = s.consumers[q]
    if e not in cons.buffer:
        return None
    o = cfg.consumer_owner(q)
    st = _with_roots(s.storage, o, s.storage.roots[o] - {e})
    consumers = list(s.consumers)
    consumers[q] = replace(cons, buffer=cons.buffer - {e})
    return Outcome("ok", replace(s, storage=st, consumers=tuple(consumers)))


def register_checkpoint(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """register_checkpoint: the checkpoint owner's roots are replaced by the consumer's current
    state (a new checkpoint replaces the old one: retain new roots, then release old — one
    replace), and the checkpoint remembers the cursor and the out-of-order acknowledgements;
    results it keeps that the queue had released are re-adopted (they must be usable). Pre:
    registrations left; lock free."""
    cons = s.consumers[q]
    if cons.registrations >= cfg.checkpoints or not lock_free(mut, s):
        return None
    o = cfg.checkpoint_owner(q)
    st = _with_roots(s.storage, o, cons.buffer)
    consumers = list(s.consumers)
    consumers[q] = replace(cons, ck_cursor=cons.cursor, ck_acked=cons.acked,
                           registrations=cons.registrations + 1)
    # the checkpoint keeps every result from its cursor on: acknowledged ones come back
    new = _readopt_history(cfg, mut, replace(s, storage=st, consumers=tuple(consumers)), q)
    if new is None:
        return None  # InvalidReference: an acknowledged result was reclaimed meanwhile
    return Outcome("registered" if cons.ck_cursor is None else "replaced",
                   _trim_results(cfg, mut, new, q))


def release_checkpoint(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """release_checkpoint: drop the checkpoint's roots and cursor."""
    cons = s.consumers[q]
    if cons.ck_cursor is None:
        return None
    o = cfg.checkpoint_owner(q)
    st = _with_roots(s.storage, o, frozenset())
    consumers = list(s.consumers)
    consumers[q] = replace(cons, ck_cursor=None, ck_acked=frozenset())
    s = replace(s, storage=st, consumers=tuple(consumers))
    return Outcome("released", _trim_results(cfg, mut, s, q))


def rewind(cfg: Config, mut: Mutants, s: State, q: int) -> Outcome | None:
    """Restore the consumer from its checkpoint: cursor and state from the checkpoint, and the
    checkpoint's roots re-adopted under the consumer's owner (so releasing or replacing the
    checkpoint later cannot drop what the consumer relies on). Pre: a checkpoint; lock free."""
    cons = s.consumers[q]
    if cons.ck_cursor is None or not lock_free(mut, s):
        return None
    ck_roots = s.storage.roots[cfg.checkpoint_owner(q)]
    st = s.storage
    if not mut.checkpoint_rewind_without_readopt:
        st = _with_roots(st, cfg.consumer_owner(q), ck_roots)
    consumers = list(s.consumers)
    consumers[q] = replace(cons, cursor=cons.ck_cursor, acked=cons.ck_acked, buffer=ck_roots)
    return Outcome("rewound", replace(s, storage=st, consumers=tuple(consumers)))


# =============================================================================================
# Enumeration
# =============================================================================================


# =============================================================================================
# Catalog compaction (CS1): where the durable catalog content lives
# =============================================================================================
# The catalog's content is the durable part of Storage (owner roots, staging, pins,
# tombstones, pack states); these actions move it between files: a snapshot (written,
# then synced), a durable head copy of the new base frame, the truncation of the catalog
# and the new base frame. Each is one step a crash can separate from the next.


def catalog_content(s: State) -> tuple[object, ...]:
    """What the catalog holds (a change of it is a catalog append)."""
    st = s.storage
    return (st.packs, st.tombstones, st.staged, st.roots, st.pins)


def cat_snapshot(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Steps 1-2 (no lock): note the catalog's end, write the state there to a new snapshot
    file of the next generation (not durable yet)."""
    c = s.catalog
    if not cfg.compaction or c.compacting is not None or c.truncated or c.base >= cfg.compaction:
        return None
    g = c.base + 1
    snaps = frozenset(x for x in c.snaps if x[0] != g) | {(g, False)}
    if mut.old_snapshot_deleted_early:  # CS1 broken: the base's own snapshot goes too
        snaps = frozenset(x for x in snaps if x[0] >= g)
    return Outcome("ok", replace(s, catalog=replace(c, snaps=snaps, compacting=g, suffix=False)))


def cat_snapshot_sync(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The snapshot's fsync, rename and directory fsync: durable."""
    c = s.catalog
    g = c.compacting
    if g is None or (g, False) not in c.snaps:
        return None
    snaps = (c.snaps - {(g, False)}) | {(g, True)}
    return Outcome("ok", replace(s, catalog=replace(c, snaps=snaps)))


def cat_head_copy(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Step 3 (takes the pool lock): the new base frame (naming the snapshot, carrying the
    suffix appended since step 1) written durably beside the catalog."""
    c = s.catalog
    g = c.compacting
    if g is None or c.locked:
        return None
    if (g, True) not in c.snaps and not mut.catalog_truncated_before_snapshot_durable:
        return None
    lossy = c.suffix and mut.compaction_drops_suffix  # CS1 broken: the suffix is dropped
    return Outcome("ok", replace(s, catalog=replace(c, head=(g, lossy), locked=True)))


def cat_truncate(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Step 4: the catalog truncated to empty (its inode stays: it is the pool lock)."""
    c = s.catalog
    if not c.locked or c.truncated or c.head is None or c.head[0] != c.compacting:
        return None
    return Outcome("ok", replace(s, catalog=replace(c, truncated=True)))


def _rolled_forward(c: CatalogFiles) -> CatalogFiles:
    """The head copy written back as the catalog's base frame."""
    assert c.head is not None
    g, lossy = c.head
    return replace(c, base=g, lossy=lossy, truncated=False)


def cat_install(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """Steps 5-6: the base frame written (durable), the lock released, older snapshots
    deleted."""
    c = s.catalog
    if not c.locked or not c.truncated:
        return None
    n = _rolled_forward(c)
    snaps = frozenset(x for x in n.snaps if x[0] >= n.base)
    return Outcome("ok", replace(s, catalog=replace(n, snaps=snaps, compacting=None,
                                                    suffix=False, locked=False)))


def cat_roll_forward(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The next client to lock an empty catalog after a compactor died: the head copy
    becomes the base frame."""
    c = s.catalog
    if not c.truncated or c.compacting is not None:
        return None
    return Outcome("ok", replace(s, catalog=_rolled_forward(c)))


def cat_crash(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The compactor dies (power loss): its unsynced snapshot is lost, its lock released."""
    c = s.catalog
    if c.compacting is None or s.crashes >= cfg.max_crashes:
        return None
    snaps = frozenset(x for x in c.snaps if x[1])
    n = replace(c, snaps=snaps, compacting=None, suffix=False, locked=False)
    return Outcome("crashed", replace(s, catalog=n, crashes=s.crashes + 1))


def _with_catalog_files(cfg: Config, s: State, s2: State) -> State | None:
    """The catalog files after a step of another process that may append to the catalog:
    None if it cannot run now (the compactor holds the pool lock); an append to an empty
    catalog rolls it forward first; an append while a snapshot is being written goes to
    the suffix."""
    if not cfg.compaction or catalog_content(s) == catalog_content(s2):
        return s2
    c = s.catalog
    if c.locked:
        return None
    if c.truncated:
        c = _rolled_forward(c)
    if c.compacting is not None:
        c = replace(c, suffix=True)
    return replace(s2, catalog=c)


# =============================================================================================
# Queue history segments (H1): where the journal's completed history lives
# =============================================================================================
# A journal snapshot writes the history recorded since the previous one to a new segment
# (straw.queue.history: folded with older segments into one generation here), makes it durable,
# then writes the journal snapshot naming it, and only then deletes what that snapshot no
# longer names. Each is one step a crash can separate from the next.


def hist_write(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The snapshot begins: the segment of the next generation written (not durable)."""
    h = s.history
    if not cfg.history or h.writing is not None or h.named >= cfg.history:
        return None
    g = h.named + 1
    segs = frozenset(x for x in h.segs if x[0] != g) | {(g, False)}
    return Outcome("ok", replace(s, history=replace(h, segs=segs, writing=g)))


def hist_sync(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The segment's fsync and its directory's fsync: durable."""
    h = s.history
    g = h.writing
    if g is None or (g, False) not in h.segs:
        return None
    return Outcome("ok", replace(s, history=replace(h, segs=(h.segs - {(g, False)}) | {(g, True)})))


def hist_snapshot(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The journal snapshot naming the new generation, durable (then the journal deletes its
    older segments): **only once the history segment is durable**."""
    h = s.history
    g = h.writing
    if g is None or h.snapshotted:
        return None
    if (g, True) not in h.segs and not mut.history_snapshot_before_segment_durable:
        return None
    return Outcome("ok", replace(s, history=replace(h, named=g, snapshotted=True)))


def hist_cleanup(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """After the snapshot (and the fence): segments it does not name are deleted."""
    h = s.history
    g = h.writing
    if g is None or not (h.snapshotted or mut.history_deleted_before_snapshot):
        return None
    segs = frozenset(x for x in h.segs if x[0] == g)
    return Outcome("ok", replace(s, history=replace(h, segs=segs, writing=None,
                                                    snapshotted=False)))


def hist_crash(cfg: Config, mut: Mutants, s: State) -> Outcome | None:
    """The coordinator dies during a snapshot (power loss): unsynced segments are lost."""
    h = s.history
    if h.writing is None or s.crashes >= cfg.max_crashes:
        return None
    n = replace(h, segs=frozenset(x for x in h.segs if x[1]), writing=None, snapshotted=False)
    return Outcome("crashed", replace(s, history=n, crashes=s.crashes + 1))


def successors(cfg: Config, mut: Mutants, s: State) -> Iterator[tuple[Action, State]]:
    """Every enabled action of s with its next state, in a fixed order (deterministic)."""
    for action, s2 in _successors(cfg, mut, s):
        s3 = _with_catalog_files(cfg, s, s2)
        if s3 is not None:
            yield action, s3
    if cfg.compaction:
        for name, fn in (("cat_snapshot", cat_snapshot), ("cat_snapshot_sync", cat_snapshot_sync),
                         ("cat_head_copy", cat_head_copy), ("cat_truncate", cat_truncate),
                         ("cat_install", cat_install), ("cat_roll_forward", cat_roll_forward)):
            out = fn(cfg, mut, s)
            if out is not None:
                yield Action(name, (), COLLECTOR, out.reply), out.state
        out = cat_crash(cfg, mut, s)
        if out is not None:
            yield Action("cat_crash", (), FAULT, out.reply), out.state
    if cfg.history:
        for name, fn in (("hist_write", hist_write), ("hist_sync", hist_sync),
                         ("hist_snapshot", hist_snapshot), ("hist_cleanup", hist_cleanup)):
            out = fn(cfg, mut, s)
            if out is not None:
                yield Action(name, ("q0",), COORDINATOR, out.reply), out.state
        out = hist_crash(cfg, mut, s)
        if out is not None:
            yield Action("hist_crash", ("q0",), FAULT, out.reply), out.state


def _successors(cfg: Config, mut: Mutants, s: State) -> Iterator[tuple[Action, State]]:

    def emit(
        out: Outcome | None,
        name: str,
        args: tuple[str, ...],
        kind: str,
        epoch: int | None = None,
        queue: int | None = None,
    ) -> Iterator[tuple[Action, State]]:
        if out is not None:
            yield Action(name, args, kind, out.reply, epoch, queue), out.state

    X = cfg.ename
    app_packs = sorted({cfg.extents[e].pack for e in cfg.app_extents})
    app_writers = sorted({cfg.pack_writer[p] for p in app_packs})

    # --- application storage ---
    for e in cfg.app_extents:
        yield from emit(write(cfg, mut, s, e), "write", (X(e),), APP)
        yield from emit(sync(cfg, mut, s, e), "sync", (X(e),), APP)
        yield from emit(retain(cfg, mut, s, 0, e), "retain", ("app", X(e)), APP)
        yield from emit(release_publications(cfg, mut, s, e), "release_publications", (X(e),), APP)
        for r in cfg.readers:
            yield from emit(pin(cfg, mut, s, r, e), "pin", (r, X(e)), APP)
            yield from emit(unpin(cfg, mut, s, r, e), "unpin", (r, X(e)), APP)
    if cfg.app_extents:
        yield from emit(release(cfg, mut, s, 0), "release", ("app",), APP)
    for p in app_packs:
        yield from emit(seal(cfg, mut, s, p), "seal", (cfg.packs[p],), APP)
    if cfg.gc:
        # With collection, a workers' result pack is sealed too (and then reclaimable) once
        # every extent declared in it was written: the model's packs are fixed, so nothing
        # may be written to one after it is sealed (the engine writes to a new pack instead).
        result_packs = sorted({cfg.extents[d.result].pack for d in cfg.tasks} - set(app_packs))
        for p in result_packs:
            if all(s.storage.extents[e] != ExtentStatus.NONE
                   for e, x in enumerate(cfg.extents) if x.pack == p):
                yield from emit(seal(cfg, mut, s, p), "seal", (cfg.packs[p],), WORKER)
    for wr in app_writers:
        yield from emit(writer_crash(cfg, mut, s, wr), "writer_crash", (wr,), FAULT)

    # --- collection ---
    if cfg.gc:
        yield from emit(gc_lock(cfg, mut, s), "gc_lock", (), COLLECTOR)
        yield from emit(gc_scan(cfg, mut, s), "gc_scan", (), COLLECTOR)
        for p in range(len(cfg.packs)):
            yield from emit(
                gc_tombstone(cfg, mut, s, p), "gc_tombstone", (cfg.packs[p],), COLLECTOR
            )
            yield from emit(gc_unlink(cfg, mut, s, p), "gc_unlink", (cfg.packs[p],), COLLECTOR)
        yield from emit(gc_unlock(cfg, mut, s), "gc_unlock", (), COLLECTOR)
        yield from emit(collector_crash(cfg, mut, s), "collector_crash", (), FAULT)

    # --- producer ---
    for e in cfg.preloaded:
        yield from emit(
            release_publications(cfg, mut, s, e), "release_publications", (X(e),), PRODUCER
        )
    for t, decl in enumerate(cfg.tasks):
        q = decl.queue
        ep = s.coords[q].serving
        yield from emit(submit(cfg, mut, s, t), "submit", (decl.name,), PRODUCER)
        yield from emit(
            coord_retain_input(cfg, mut, s, t),
            "coord_retain_input",
            (decl.name,),
            COORDINATOR,
            ep,
            q,
        )
        yield from emit(
            coord_journal_submit(cfg, mut, s, t),
            "coord_journal_submit",
            (decl.name,),
            COORDINATOR,
            ep,
            q,
        )
        yield from emit(expire(cfg, mut, s, t), "expire", (decl.name,), CLOCK)
        yield from emit(
            requeue_expired(cfg, mut, s, t), "requeue_expired", (decl.name,), COORDINATOR, ep, q
        )
        yield from emit(cancel(cfg, mut, s, t), "cancel", (decl.name,), PRODUCER, ep, q)

    # --- workers ---
    for w, wname in enumerate(cfg.workers):
        for q, qname in enumerate(cfg.queues):
            yield from emit(
                acquire(cfg, mut, s, w, q),
                "acquire",
                (wname, qname),
                WORKER,
                s.coords[q].serving,
                q,
            )
        for lease in sorted(le for le in s.leases if le.worker == w):
            q = cfg.tasks[lease.task].queue
            ep = s.coords[q].serving
            ls = f"{cfg.tasks[lease.task].name}#{lease.attempt}@e{lease.epoch}"
            # each with its reply delivered, then lost (the same order as before: BFS ties)
            for name, step in (("complete", complete), ("complete_and_acquire",
                                                       complete_and_acquire), ("fail", fail)):
                for delivered in (True, False):
                    yield from emit(step(cfg, mut, s, lease, delivered), name, (wname, ls),
                                    WORKER, ep, q)
            yield from emit(yield_task(cfg, mut, s, lease), "yield", (wname, ls), WORKER, ep, q)
            yield from emit(abandon(cfg, mut, s, lease), "abandon", (wname, ls), WORKER)
            yield from emit(
                old_coord_complete(cfg, mut, s, lease),
                "old_coord_complete",
                (wname, ls),
                COORDINATOR,
                s.coords[q].paused,
                q,
            )
        for t in sorted({r[1] for r in s.reads if r[0] == w}):
            yield from emit(
                release_reads(cfg, mut, s, w, t),
                "release_reads",
                (wname, cfg.tasks[t].name),
                WORKER,
            )
        yield from emit(worker_crash(cfg, mut, s, w), "worker_crash", (wname,), FAULT)
        for q, qname in enumerate(cfg.queues):
            yield from emit(
                retire_worker(cfg, mut, s, w, q),
                "retire_worker",
                (wname, qname),
                COORDINATOR,
                s.coords[q].serving,
                q,
            )

    # --- coordinators, consumers, checkpoints ---
    for q, qname in enumerate(cfg.queues):
        yield from emit(coord_crash(cfg, mut, s, q), "coord_crash", (qname,), FAULT)
        yield from emit(coord_pause(cfg, mut, s, q), "coord_pause", (qname,), FAULT)
        yield from emit(coord_resume(cfg, mut, s, q), "coord_resume", (qname,), COORDINATOR)
        c = s.coords[q]
        yield from emit(
            coord_recover(cfg, mut, s, q), "coord_recover", (qname,), COORDINATOR, c.durable + 1, q
        )
        yield from emit(
            coord_persist_epoch(cfg, mut, s, q), "coord_persist_epoch", (qname,), COORDINATOR
        )
        if q in cfg.consumer_queues:
            yield from emit(consume(cfg, mut, s, q), "consume", (qname,), CONSUMER)
            for i in range(s.consumers[q].cursor + 1, len(queue_log(cfg, s, q))):
                yield from emit(
                    acknowledge(cfg, mut, s, q, i), "acknowledge", (qname, str(i)), CONSUMER
                )
            yield from emit(restore(cfg, mut, s, q), "restore", (qname,), CONSUMER)
            for e in sorted(s.consumers[q].buffer):
                yield from emit(
                    consumer_drop(cfg, mut, s, q, e), "consumer_drop", (qname, X(e)), CONSUMER
                )
            yield from emit(
                register_checkpoint(cfg, mut, s, q), "register_checkpoint", (qname,), CONSUMER
            )
            yield from emit(
                release_checkpoint(cfg, mut, s, q), "release_checkpoint", (qname,), CONSUMER
            )
            yield from emit(rewind(cfg, mut, s, q), "rewind", (qname,), CONSUMER)
