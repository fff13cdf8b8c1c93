"""Numbered invariants of the straw protocol: the DESIGN obligations D1–D9 refined into
checkable predicates, the queue's own Q1–Q7, the retention rule R1, and liveness L1–L2.

Role: what must hold. State invariants are predicates on one state; step invariants are
predicates on one transition (state, action, next state) — the TLA+ [][A]_v form, for
obligations about *who* may do *what* (D5, D8, Q3, Q4). Each check returns None when it holds
and a message otherwise. The ids are stable and used identically in SPEC.md, the explorer's
output and the tests.

Liveness properties are stated here as (goal predicate, fair action set); the explorer checks
them on the bounded reachability graph (see `model/explore.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spec.actions import (
    CLOCK,
    COLLECTOR,
    CONSUMER,
    COORDINATOR,
    WORKER,
    Action,
    journal_named,
    live,
    next_task,
    pack_dead,
    queue_log,
    reachable,
)
from spec.config import Config
from spec.helpers import dependency_closure
from spec.mutants import CORRECT
from spec.state import TERMINAL, ExtentStatus, PackStatus, State, TaskStatus

StateCheck = Callable[[Config, State], "str | None"]
StepCheck = Callable[[Config, State, Action, State], "str | None"]


# ------------------------------------------------------------------------------------------
# State invariants
# ------------------------------------------------------------------------------------------


def d1_returned_refs_durable(cfg: Config, s: State) -> str | None:
    """D1: every returned reference, and every dependency it names, is durable."""
    st = s.storage
    for e in sorted(st.returned):
        for x in sorted(dependency_closure(frozenset({e}), cfg.edges())):
            if st.extents[x] != ExtentStatus.DURABLE:
                return (
                    f"returned ref {cfg.ename(e)} names {cfg.ename(x)} which is "
                    f"{st.extents[x].value}"
                )
    return None


def d2_journal_retained(cfg: Config, s: State) -> str | None:
    """D2: everything a queue's durable journal names (inputs of pending/leased tasks, results
    the consumer or a rewind may still read) is retained under that queue's owner."""
    for q in range(len(cfg.queues)):
        roots = s.storage.roots[cfg.queue_owner(q)]
        missing = journal_named(cfg, s, q) - roots
        if missing:
            names = ",".join(cfg.ename(e) for e in sorted(missing))
            return f"queue {cfg.queues[q]} journal names {names} not retained by its owner"
    return None


def d3_tombstones_final(cfg: Config, s: State) -> str | None:
    """D3: a pack is unlinked only after its durable tombstone; a tombstoned path is never
    reopened or appended to (never OPEN again)."""
    st = s.storage
    for p, status in enumerate(st.packs):
        if status == PackStatus.UNLINKED and p not in st.tombstones:
            return f"pack {cfg.packs[p]} unlinked without a durable tombstone"
        if status == PackStatus.OPEN and p in st.tombstones:
            return f"tombstoned pack path {cfg.packs[p]} reopened for writing"
    return None


def d4_reachable_not_reclaimed(cfg: Config, s: State) -> str | None:
    """D4: no extent reachable from an owner, pin or staging (transitively through
    dependencies) lies in a tombstoned or unlinked pack."""
    st = s.storage
    for e in sorted(reachable(cfg, st)):
        p = cfg.extents[e].pack
        if pack_dead(st, p):
            return f"reachable extent {cfg.ename(e)} in reclaimed pack {cfg.packs[p]}"
    return None


def r1_relied_on_protected(cfg: Config, s: State) -> str | None:
    """R1: every reference a client still relies on is protected (reachable): inputs of the
    producer's unacknowledged submissions, extents being read by workers, the consumer's state,
    and results of commits at or after the consumer's cursor that it did not acknowledge out
    of order (those it holds in its state, the buffer, until it drops them)."""
    prot = reachable(cfg, s.storage)
    needs: list[tuple[int, str]] = []
    for t, decl in enumerate(cfg.tasks):
        if not s.requests[t].acked:
            needs.append((decl.input, f"producer's unacknowledged submit of {decl.name}"))
    for w, t, e in sorted(s.reads):
        needs.append((e, f"{cfg.workers[w]} reading {cfg.tasks[t].name}"))
    for q in range(len(cfg.queues)):
        cons = s.consumers[q]
        for e in sorted(cons.buffer):
            needs.append((e, f"consumer of {cfg.queues[q]} state"))
        for i, c in enumerate(queue_log(cfg, s, q)):
            if i >= cons.cursor and i not in cons.acked:
                needs.append((c.result, f"consumer of {cfg.queues[q]} unread commit"))
    for e, why in needs:
        if e not in prot:
            return f"{cfg.ename(e)} unprotected although relied on by {why}"
    return None


def q5_reads_pinned(cfg: Config, s: State) -> str | None:
    """Q5 (D5 refined): a worker's outstanding read is protected by that worker's own read pin
    — whatever happened to its lease."""
    for w, t, e in sorted(s.reads):
        if (cfg.workers[w], e) not in s.storage.pins:
            return (
                f"{cfg.workers[w]} still reads {cfg.ename(e)} for {cfg.tasks[t].name} "
                f"without a read pin"
            )
    return None


def d7_one_commit_per_submission(cfg: Config, s: State) -> str | None:
    """D7: a submission id (the lease) is committed at most once; retries return the
    original receipt."""
    seen = set()
    for c in s.commits:
        if c.lease in seen:
            return f"submission {c.lease} committed twice"
        seen.add(c.lease)
    return None


def q1_results_once_never_lost(cfg: Config, s: State) -> str | None:
    """Q1: a task's result is accepted at most once, and a task is COMPLETED (its receipt may
    have been sent) only with its result in the durable commit log."""
    seen = set()
    for c in s.commits:
        if c.lease.task in seen:
            return f"task {cfg.tasks[c.lease.task].name} accepted twice"
        seen.add(c.lease.task)
    for t, task in enumerate(s.tasks):
        if task.status == TaskStatus.COMPLETED and t not in seen:
            return f"task {cfg.tasks[t].name} completed without a commit"
    return None


def q2_one_live_lease(cfg: Config, s: State) -> str | None:
    """Q2: at most one held lease per task is live (could commit)."""
    for t in range(len(cfg.tasks)):
        holders = [le for le in s.leases if le.task == t and live(cfg, s, le)]
        if len(holders) > 1:
            return f"task {cfg.tasks[t].name} has {len(holders)} live leases"
    return None


def d9_epoch_durable_before_service(cfg: Config, s: State) -> str | None:
    """D9: a serving coordinator's epoch is the durable epoch (made durable before service)."""
    for q, c in enumerate(s.coords):
        if c.serving is not None and c.serving != c.durable:
            return (
                f"coordinator of {cfg.queues[q]} serves epoch {c.serving} but durable "
                f"epoch is {c.durable}"
            )
    return None


def cs1_catalog_recoverable(cfg: Config, s: State) -> str | None:
    """CS1: at every moment the catalog's files recover its content: a catalog whose base
    frame names a snapshot has that snapshot durable, an emptied (truncated) catalog has a
    durable head copy whose snapshot is durable, and no base lost the suffix appended while
    its snapshot was written. (So a crash at any step of a compaction leaves the old or the
    new catalog state, never a mix.)"""
    c = s.catalog
    if c.truncated:
        if c.head is None:
            return "the catalog was truncated without a durable head copy of its new base"
        g, lossy = c.head
        if (g, True) not in c.snaps:
            return (f"the catalog was truncated but the snapshot of generation {g} its head "
                    "copy names is not durable")
        if lossy:
            return "the head copy of the new base lacks the operations appended meanwhile"
        return None
    if c.base and (c.base, True) not in c.snaps:
        return f"the catalog's base names generation {c.base}, whose snapshot is not durable"
    if c.lossy:
        return (f"the catalog's base (generation {c.base}) lost the operations appended while "
                "its snapshot was written")
    return None


def h1_history_recoverable(cfg: Config, s: State) -> str | None:
    """H1: the history segments the durable journal snapshot names are durable, at every
    moment: a segment is durable before a snapshot names it, and deleted only once a durable
    snapshot names its replacement. (So a crash at any point of writing history leaves the
    old or the new queue state, never a snapshot whose history is gone.)"""
    h = s.history
    if h.named and (h.named, True) not in h.segs:
        return (f"the durable journal snapshot names history generation {h.named}, whose "
                "segment is not durable")
    return None


STATE_INVARIANTS: dict[str, StateCheck] = {
    "CS1": cs1_catalog_recoverable,
    "H1": h1_history_recoverable,
    "D1": d1_returned_refs_durable,
    "D2": d2_journal_retained,
    "D3": d3_tombstones_final,
    "D4": d4_reachable_not_reclaimed,
    "D7": d7_one_commit_per_submission,
    "D9": d9_epoch_durable_before_service,
    "R1": r1_relied_on_protected,
    "Q1": q1_results_once_never_lost,
    "Q2": q2_one_live_lease,
    "Q5": q5_reads_pinned,
}


# ------------------------------------------------------------------------------------------
# Step invariants
# ------------------------------------------------------------------------------------------

PIN_RELEASING_ACTIONS = frozenset({"unpin", "release_reads", "retire_worker"})


def d5_only_explicit_release_of_pins(cfg: Config, s: State, a: Action, s2: State) -> str | None:
    """D5: lease expiry, cancellation and coordinator change never release a read pin; only
    unpin / release_task_reads / retire_worker do."""
    gone = s.storage.pins - s2.storage.pins
    if gone and a.name not in PIN_RELEASING_ACTIONS:
        return f"{a.name} released pins {sorted(gone)}"
    return None


def _journal_view(cfg: Config, s: State, q: int) -> tuple[object, ...]:
    tasks = tuple(
        (tk.status, tk.attempt, tk.failures, tk.lease_epoch, tk.holder, tk.input)
        for t, tk in enumerate(s.tasks)
        if cfg.tasks[t].queue == q
    )
    return (tasks, queue_log(cfg, s, q))


def d8_only_current_epoch_writes(cfg: Config, s: State, a: Action, s2: State) -> str | None:
    """D8: a queue's journal (task table, commit log) changes only by a coordinator whose epoch
    is the durable epoch after the step — an old coordinator can acknowledge nothing."""
    for q in range(len(cfg.queues)):
        if _journal_view(cfg, s, q) != _journal_view(cfg, s2, q):
            if a.epoch is None or a.queue != q or a.epoch != s2.coords[q].durable:
                return (
                    f"{a} changed {cfg.queues[q]}'s journal with epoch {a.epoch}, "
                    f"durable epoch {s2.coords[q].durable}"
                )
    return None


def q3_only_live_leases_commit(cfg: Config, s: State, a: Action, s2: State) -> str | None:
    """Q3: every new commit's lease was live before the step (current attempt and epoch, not
    expired, task leased): a stale or expired lease never commits."""
    for c in s2.commits[len(s.commits) :]:
        if not live(cfg, s, c.lease):
            return f"commit by lease {c.lease} which was not live"
    return None


def q4_scheduling_order(cfg: Config, s: State, a: Action, s2: State) -> str | None:
    """Q4: acquire (and complete_and_acquire's grant) hands out the pending task first in
    order priority desc, key asc, FIFO."""
    if a.name not in ("acquire", "complete_and_acquire") or a.queue is None:
        return None
    for t in range(len(cfg.tasks)):
        if s.tasks[t].status == TaskStatus.PENDING and s2.tasks[t].status == TaskStatus.LEASED:
            best = next_task(cfg, CORRECT, s, a.queue)
            if best != t:
                assert best is not None
                return f"acquired {cfg.tasks[t].name} before {cfg.tasks[best].name}"
    return None


# lease ends that spend the retry budget: a failure, an expiry, a retired worker's lease
BUDGET_SPENDING_ACTIONS = frozenset({"fail", "requeue_expired", "retire_worker"})


def q6_revocations_spend_budget(cfg: Config, s: State, a: Action, s2: State) -> str | None:
    """Q6: a lease that ends by failure, expiry or its worker's retirement spends one unit of
    its task's retry budget (so a task whose workers keep failing or dying ends FAILED
    instead of being retried forever), and so does its revocation by a recovery under the
    spending policy (`recovery_spends_budget`); no other action spends it."""
    spends = a.name in BUDGET_SPENDING_ACTIONS or (
        a.name == "coord_recover" and cfg.recovery_spends_budget)
    for t, (tk, tk2) in enumerate(zip(s.tasks, s2.tasks, strict=True)):
        ended = tk.status == TaskStatus.LEASED and tk2.status in (
            TaskStatus.PENDING, TaskStatus.FAILED)
        want = tk.failures + 1 if spends and ended else tk.failures
        if tk2.failures != want:
            return (f"{a.name} took {cfg.tasks[t].name}'s spent budget from {tk.failures} to "
                    f"{tk2.failures} (expected {want})")
    return None


def q7_retries_answered_from_the_journal(cfg: Config, s: State, a: Action,
                                         s2: State) -> str | None:
    """Q7 (D7 for control calls): the retry of a request that is journaled under its request
    id (a fail whose reply was lost) is answered with the original outcome, not refused."""
    if a.name != "fail":
        return None
    retried = (s.leases - s2.leases) & s.answered
    if retried and not a.reply.endswith("(original)"):
        return f"the retry of a journaled fail of {sorted(retried)} was answered {a.reply!r}"
    return None


STEP_INVARIANTS: dict[str, StepCheck] = {
    "D5": d5_only_explicit_release_of_pins,
    "D8": d8_only_current_epoch_writes,
    "Q3": q3_only_live_leases_commit,
    "Q4": q4_scheduling_order,
    "Q6": q6_revocations_spend_budget,
    "Q7": q7_retries_answered_from_the_journal,
}


def check_state(cfg: Config, s: State) -> tuple[str, str] | None:
    """First violated state invariant as (id, message), or None."""
    for iid, check in STATE_INVARIANTS.items():
        msg = check(cfg, s)
        if msg is not None:
            return iid, msg
    return None


def check_step(cfg: Config, s: State, a: Action, s2: State) -> tuple[str, str] | None:
    """First violated step invariant as (id, message), or None."""
    for iid, check in STEP_INVARIANTS.items():
        msg = check(cfg, s, a, s2)
        if msg is not None:
            return iid, msg
    return None


# ------------------------------------------------------------------------------------------
# Liveness
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Liveness:
    """From every reachable state, some path of fair actions reaches a goal state.

    `fair(action)` selects the transitions the fairness assumption guarantees will keep being
    taken; faults, the producer and cancellation are excluded (they may stop at any time)."""

    iid: str
    description: str
    applies: Callable[[Config], bool]
    goal: Callable[[Config, State], bool]
    fair: Callable[[Action], bool]


def _garbage_reclaimed(cfg: Config, s: State) -> bool:
    st = s.storage
    reach = reachable(cfg, st)
    live_packs = {cfg.extents[e].pack for e in reach}
    for p, status in enumerate(st.packs):
        if status == PackStatus.SEALED and (p in st.tombstones or p not in live_packs):
            return False
    return True


def _tasks_terminal(cfg: Config, s: State) -> bool:
    return all(s.tasks[t].status in TERMINAL for t in range(len(cfg.tasks)) if s.requests[t].sent)


LIVENESS: tuple[Liveness, ...] = (
    Liveness(
        "L1",
        "every sealed pack that nothing reaches is eventually unlinked (tombstoned ones too), "
        "assuming the collector keeps running (its lock is released when it dies)",
        lambda cfg: cfg.gc,
        _garbage_reclaimed,
        lambda a: a.kind == COLLECTOR,
    ),
    Liveness(
        "L2",
        "every submitted task eventually becomes completed, failed or cancelled, assuming "
        "workers keep acquiring and finishing, the clock advances, a coordinator is "
        "eventually (re)started, and a collector holding the lock eventually releases it "
        "(not on an operator cancelling tasks or retiring workers)",
        lambda cfg: bool(cfg.tasks),
        _tasks_terminal,
        lambda a: a.kind in (COORDINATOR, WORKER, CLOCK, CONSUMER, COLLECTOR)
        and a.name not in ("cancel", "retire_worker"),
    ),
)

ALL_IDS: tuple[str, ...] = (
    tuple(STATE_INVARIANTS) + tuple(STEP_INVARIANTS) + tuple(li.iid for li in LIVENESS)
)
