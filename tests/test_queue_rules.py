"""The queue's rules (``straw.queue.rules``) against the spec's actions (``spec/actions.py``).

Every state of a small queue reachable in the spec (three tasks whose priority and key
orders disagree, ``t0`` with one continuation, two workers, two failures of budget, one
coordinator recovery) is enumerated breadth-first; the engine's ``QueueState`` follows
along, each spec step mirrored by the transaction the rule decides (replayed from its
msgpack form, as recovery reads it).  In every state, for every call the spec models —
submit, acquire, heartbeat, complete, fail, release_lease, yield, cancel, requeue_expired,
release_reads, retire_worker — the rule accepts, answers a retry, or refuses exactly where the spec's action does;
the engine's tasks (status, attempt, failures) equal the spec's.

What the rules do not decide is held fixed here: the coordinator serving is the latest
(fencing is the pipeline's, D8), no collector holds the lock, and a spec lease's expiry
is a deadline in the past (the clock is passed in).
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from spec import actions as A
from spec.config import Config, ExtentDecl, TaskDecl
from spec.mutants import CORRECT
from spec.state import Lease as SLease
from spec.state import State, TaskStatus, initial_state
from straw.errors import IdempotencyConflict, LeaseExpired, StaleAttempt
from straw.protocol import Lease, Limits, unenforced
from straw.queue import rules
from straw.queue.names import QueueNames
from straw.queue.state import QueueState
from straw.refs import RecordSetRef, ref_from_tuple

RUN, QUEUE = "run", "q0"
NAMES = QueueNames(RUN, "default", QUEUE)
BOUNDS = unenforced(Limits())
NOW, LIVE, PASSED = 1.0, 2.0, 0.5  # the clock; a deadline ahead of it; one behind it
BFS_DEPTH = 6  # every state this close to the start (about 5,000)
WALKS, WALK_STEPS = 40, 40  # and random paths deeper than that
CFG = Config(
    name="queue-rules",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=(ExtentDecl("i0", 0), ExtentDecl("i1", 0), ExtentDecl("i2", 0),
             ExtentDecl("k0", 1), ExtentDecl("r0", 1), ExtentDecl("r1", 1),
             ExtentDecl("r2", 1)),
    preloaded=(0, 1, 2),
    queues=("q0",),
    tasks=(
        TaskDecl("t0", 0, input=0, result=4, priority=1, key=1, fifo=0, continuation=3),
        TaskDecl("t1", 0, input=1, result=5, priority=0, key=0, fifo=1),
        TaskDecl("t2", 0, input=2, result=6, priority=0, key=1, fifo=2),
    ),
    workers=("w0", "w1"),
    max_attempts=2,
    max_epoch=2,
    max_crashes=1,
    max_pauses=0,
)
TASKS = tuple(d.name for d in CFG.tasks)
WORKERS = CFG.workers


def stored(e: int) -> tuple[Any, ...]:
    """The engine's stored reference (``straw.refs`` tuple) of spec extent ``e``."""
    return (f"runs/{RUN}/packs/w/i1/pack-{e}.pack", 0, 64, "0" * 32, f"{e:032x}", 1, 0, 8, 0)


def ref(e: int) -> RecordSetRef:
    return ref_from_tuple(RUN, stored(e))


def engine_lease(le: SLease) -> Lease:
    task, worker = TASKS[le.task], WORKERS[le.worker]
    attempt_id = NAMES.attempt_id(task, le.attempt)
    return Lease(RUN, QUEUE, task, attempt_id, le.attempt, str(le.epoch),
                 NAMES.token(attempt_id, worker, le.epoch), worker)


def sid(le: SLease) -> str:
    return f"{TASKS[le.task]}-a{le.attempt}-{WORKERS[le.worker]}-e{le.epoch}"


def submit_rule(st: QueueState, t: int, request_id: str | None = None) -> rules.Decision:
    d = CFG.tasks[t]
    row = [d.name, list(stored(d.input)), {}, d.priority, d.key, CFG.max_attempts, False,
           False, 1, 0, 0]
    return rules.submit(st, NAMES.owner, request_id or f"req-{d.name}", f"digest-{d.name}",
                        [row], None, draining=False, bounds=BOUNDS, limits=Limits())


class Engine:
    """The engine's side of a spec state: the journal so far, the leases' deadlines."""

    def __init__(self, txns: tuple[bytes, ...] = (), deadlines: dict[str, float] | None = None,
                 epoch: int = 1) -> None:
        self.txns, self.deadlines, self.epoch = txns, dict(deadlines or {}), epoch
        self.state = QueueState()
        for t in txns:
            self.state.apply(msgpack.unpackb(t, raw=False))

    def then(self, txn: dict[str, Any] | None, **deadlines: float | None) -> Engine:
        out = Engine(self.txns + ((msgpack.packb(txn),) if txn else ()), self.deadlines,
                     self.epoch)
        for tid, d in deadlines.items():
            if d is None:
                out.deadlines.pop(tid, None)
            else:
                out.deadlines[tid] = d
        return out

    def observe(self) -> tuple[Any, ...]:
        return tuple((t.status, t.attempt, t.failures) if (t := self.state.tasks.get(n))
                     else ("unsubmitted", 0, 0) for n in TASKS)


def observe_spec(s: State) -> tuple[Any, ...]:
    return tuple((tk.status.value, tk.attempt, tk.failures) for tk in s.tasks)


def spec_steps(s: State, *steps: tuple[str, tuple[Any, ...]]) -> State | None:
    """Apply spec actions in order; a ``release_reads`` that is not enabled is skipped
    (the engine ends a reader with the lease's own completion, failure or yield)."""
    for name, args in steps:
        out = getattr(A, name)(CFG, CORRECT, s, *args)
        if out is None:
            if name == "release_reads":
                continue
            return None
        s = out.state
    return s


def lease_calls(st: QueueState, eng: Engine, le: SLease) -> dict[str, Any]:
    """The decisions of every lease call on ``le`` (each from the same state)."""
    lease = engine_lease(le)
    result = ref(CFG.tasks[le.task].result)
    key = [lease.task_id, lease.generation, result.digest]
    k = CFG.tasks[le.task].continuation
    return {
        "complete": lambda: rules.complete(st, NAMES, lease, sid(le), key, result, eng.epoch,
                                           NOW, eng.deadlines),
        "fail": lambda: rules.fail(st, NAMES, lease, f"f-{sid(le)}", f"fd-{sid(le)}", None,
                                   True, eng.epoch, NOW, eng.deadlines),
        "release": lambda: rules.release_leases(st, NAMES, [lease], None, "rd", eng.epoch),
        "yield": lambda: rules.yield_tasks(st, NAMES, [(lease, ref(k) if k is not None else
                                                         None, None, None, None)],
                                           f"y-{sid(le)}", f"yd-{sid(le)}", eng.epoch, NOW,
                                           eng.deadlines),
    }


def successors(s: State, eng: Engine) -> list[tuple[State, Engine]]:
    out = []
    st = eng.state
    for t, name in enumerate(TASKS):
        if not s.requests[t].sent:
            s2 = spec_steps(s, ("submit", (t,)), ("coord_retain_input", (t,)),
                            ("coord_journal_submit", (t,)))
            assert s2 is not None
            out.append((s2, eng.then(submit_rule(st, t).txn)))
        if (o := A.expire(CFG, CORRECT, s, t)) is not None:
            out.append((o.state, eng.then(None, **{name: PASSED})))
        if (o := A.requeue_expired(CFG, CORRECT, s, t)) is not None:
            txn = dict(rules.expiries(st, eng.deadlines, NOW))[name]
            out.append((o.state, eng.then(txn, **{name: None})))
        if (o := A.cancel(CFG, CORRECT, s, t)) is not None:
            out.append((o.state, eng.then(rules.cancel(st, NAMES.owner, name, None, "c").txn,
                                          **{name: None})))
    for w, worker in enumerate(WORKERS):
        if (o := A.acquire(CFG, CORRECT, s, w, 0)) is not None:
            _, chosen, txn = rules.acquire(st, worker, 1, None, None, False,
                                           leased=eng.deadlines, draining=False,
                                           bounds=BOUNDS, consumer_id="training",
                                           epoch=eng.epoch)
            out.append((o.state, eng.then(txn, **{chosen[0].task_id: LIVE})))
        for t in sorted({r[1] for r in s.reads if r[0] == w}):
            if not any(le.worker == w and le.task == t for le in s.leases):
                s2 = spec_steps(s, ("release_reads", (w, t)))
                nxt = eng
                for txn in rules.release_reads(st, NAMES, [reader_lease(eng, worker,
                                                                        TASKS[t])]):
                    nxt = nxt.then(txn)
                out.append((s2, nxt))
    for le in sorted(s.leases):
        out += lease_successors(s, eng, le)
    s2 = spec_steps(s, ("coord_crash", (0,)), ("coord_recover", (0,)))
    if s2 is not None:
        nxt = eng.then(rules.recover(eng.epoch + 1, True))
        nxt.deadlines, nxt.epoch = {}, eng.epoch + 1
        out.append((s2, nxt))
    return out


def lease_successors(s: State, eng: Engine, le: SLease) -> list[tuple[State, Engine]]:
    """The lease calls the spec enables on ``le`` (replies delivered or lost), mirrored."""
    out = []
    calls = lease_calls(eng.state, eng, le)
    name, reads = TASKS[le.task], ("release_reads", (le.worker, le.task))
    for action, call in (("complete", "complete"), ("fail", "fail")):
        for delivered in (True, False):
            s2 = spec_steps(s, (action, (le, delivered)), reads)
            if s2 is None or (action == "complete" and any(c.lease == le for c in s.commits)):
                continue
            if action == "fail" and le in s.answered:
                continue
            got = calls[call]()
            txn = got[1] if action == "complete" else got.txn
            out.append((s2, eng.then(txn, **{name: None})))
    for action, call in (("release_lease", "release"), ("yield_task", "yield")):
        s2 = spec_steps(s, (action, (le,)), reads)
        if s2 is not None:
            out.append((s2, eng.then(calls[call]().txn, **{name: None})))
    if (o := A.abandon(CFG, CORRECT, s, le)) is not None:
        out.append((o.state, eng))
    return out


def outcome(call: Any) -> str:
    """``accept`` (a transaction), ``retry`` (answered from the state) or ``refuse``."""
    try:
        got = call()
    except (StaleAttempt, LeaseExpired):
        return "refuse"
    if isinstance(got, tuple) and not isinstance(got, rules.Decision):
        return "retry" if got[1] is None else "accept"  # complete: (position, transaction)
    if got.replayed:
        return "retry"
    return "accept" if got.txn is not None else "refuse"


def spec_outcome(s: State, le: SLease, call: str) -> str:
    """What the spec does with the same lease call (fresh, or a retry's original reply)."""
    if call == "complete":
        if any(c.lease == le for c in s.commits):
            return "retry"
        return "accept" if A.complete(CFG, CORRECT, s, le, True) is not None else "refuse"
    if call == "fail":
        if le in s.answered:
            return "retry"
        return "accept" if A.fail(CFG, CORRECT, s, le, True) is not None else "refuse"
    if call == "release":
        return "accept" if A.release_lease(CFG, CORRECT, s, le) is not None else "refuse"
    return "accept" if A.yield_task(CFG, CORRECT, s, le) is not None else "refuse"


def check_tasks(s: State, eng: Engine) -> None:
    st = eng.state
    for t, name in enumerate(TASKS):
        fresh = s.tasks[t].status == TaskStatus.UNSUBMITTED
        d = submit_rule(st, t)
        assert (d.txn is not None, d.replayed) == (fresh, not fresh)
        if not fresh:  # the task id under another request: a conflict
            with pytest.raises(IdempotencyConflict):
                submit_rule(st, t, request_id="another")
        try:
            rules.cancel(st, NAMES.owner, name, None, "c")
            cancelled = True
        except ValueError:
            cancelled = False
        assert cancelled == (A.cancel(CFG, CORRECT, s, t) is not None), (name, s.tasks[t])
        due = {tid for tid, txn in rules.expiries(st, eng.deadlines, NOW) if txn is not None}
        assert (name in due) == (A.requeue_expired(CFG, CORRECT, s, t) is not None)


def check_workers(s: State, eng: Engine) -> None:
    for w, worker in enumerate(WORKERS):
        if any(le.worker == w for le in s.leases) or any(r[0] == w for r in s.reads):
            continue  # the spec's worker works on one task at a time
        status, chosen, _ = rules.acquire(eng.state, worker, 1, None, None, False,
                                          leased=eng.deadlines, draining=False, bounds=BOUNDS,
                                          consumer_id="training", epoch=eng.epoch)
        expected = A.next_task(CFG, CORRECT, s, 0)
        assert (status == "acquired") == (A.acquire(CFG, CORRECT, s, w, 0) is not None)
        assert [t.task_id for t in chosen] == ([] if expected is None else [TASKS[expected]])


def check_leases(s: State, eng: Engine) -> None:
    for le in sorted(s.leases):
        live = A.live(CFG, s, le)
        beat = rules.heartbeat(eng.state, NAMES, [engine_lease(le)], eng.epoch, NOW,
                               eng.deadlines)
        assert (beat == ["extended"]) == live, (le, beat)
        unused = CFG.tasks[le.task].continuation is not None and not s.tasks[le.task].yielded
        for call, fn in lease_calls(eng.state, eng, le).items():
            if call == "yield" and not unused:
                continue  # the spec's yield needs an unused continuation; the engine's not
            assert outcome(fn) == spec_outcome(s, le, call), (call, le, s.tasks[le.task])


def reader_lease(eng: Engine, worker: str, task_id: str) -> Lease:
    """The lease of ``worker``'s outstanding reader of ``task_id`` (as outstanding_reads
    gives it), or of an attempt it never read (the task's next one)."""
    st = eng.state
    for w, t, a in st.reads:
        if w == worker and t == task_id:
            return NAMES.lease(t, a, w, st.read_epochs.get((w, t, a), eng.epoch))
    task = st.tasks.get(task_id)
    return NAMES.lease(task_id, (task.attempt if task is not None else 0) + 1, worker,
                       eng.epoch)


def check_readers(s: State, eng: Engine) -> None:
    """release_reads and retire_worker: the rule ends a worker's reads, or retires it,
    exactly where the spec's action is enabled, and a retirement leaves the spec's tasks."""
    st = eng.state
    for w, worker in enumerate(WORKERS):
        for t, name in enumerate(TASKS):
            ended = rules.release_reads(st, NAMES, [reader_lease(eng, worker, name)])
            assert bool(ended) == (A.release_reads(CFG, CORRECT, s, w, t) is not None), \
                (worker, name)
        if any(r[0] == w for r in s.reads):
            continue  # the spec retires a stopped worker: one that reads nothing
        decision = rules.retire_worker(st, worker, eng.deadlines)
        o = A.retire_worker(CFG, CORRECT, s, w, 0)
        assert (decision.txn is not None) == (o is not None), worker
        if o is not None:
            assert eng.then(decision.txn).observe() == observe_spec(o.state)


def check(s: State, eng: Engine) -> None:
    assert eng.observe() == observe_spec(s), (eng.observe(), observe_spec(s))
    check_tasks(s, eng)
    check_workers(s, eng)
    check_leases(s, eng)
    check_readers(s, eng)


def start() -> tuple[State, Engine]:
    return initial_state(CFG), Engine().then(rules.recover(1, True))


def explore(depth: int = BFS_DEPTH) -> int:
    """Every spec state within ``depth`` steps, breadth-first, each checked; the count."""
    s0, e0 = start()
    seen = {s0}
    level = [(s0, e0)]
    for _ in range(depth + 1):
        nxt = []
        for s, eng in level:
            check(s, eng)
            for s2, eng2 in successors(s, eng):
                if s2 not in seen:
                    seen.add(s2)
                    nxt.append((s2, eng2))
        level = nxt
    return len(seen) - len(level)


def walk(seed: int, steps: int = WALK_STEPS) -> None:
    """A random path through the spec's states (deeper than the enumeration), checked."""
    rng = random.Random(seed)
    s, eng = start()
    for _ in range(steps):
        check(s, eng)
        nxt = successors(s, eng)
        if not nxt:
            return
        s, eng = rng.choice(nxt)


def test_rules_refuse_exactly_where_the_spec_does() -> None:
    assert explore() > 4000


@pytest.mark.parametrize("seed", range(WALKS))
def test_rules_agree_with_the_spec_along_random_paths(seed: int) -> None:
    walk(seed)


def test_a_broken_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a lease check that forgets the deadline (an expired lease may
    still commit, the spec's expired_lease_commits mutant) disagrees with the spec."""
    real = rules.current_task

    def ignores_deadline(*args: Any, **kwargs: Any) -> Any:
        args = args[:4] + (None,) + args[5:]
        return real(*args, **kwargs)

    monkeypatch.setattr(rules, "current_task", ignores_deadline)
    with pytest.raises(AssertionError):
        explore(5)


def test_the_universe_is_the_spec_one() -> None:
    """The machine's tasks keep the spec's scheduling order distinct (no FIFO ties)."""
    orders = {(d.priority, d.key) for d in CFG.tasks}
    assert len(orders) == len(CFG.tasks)


def test_a_retirement_that_keeps_leases_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a retirement that only drops reads (the worker's leases stay)
    disagrees with the spec's retire_worker."""
    real = rules.retire_worker

    def keeps_leases(state: QueueState, worker_id: str, leased: Any) -> rules.Decision:
        return real(state, worker_id, ())

    monkeypatch.setattr(rules, "retire_worker", keeps_leases)
    with pytest.raises(AssertionError):
        explore(5)
