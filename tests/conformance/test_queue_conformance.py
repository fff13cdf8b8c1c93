"""Queue conformance (verification layer 5): the engine's ``Coordinator`` on SimFS and the
queue part of ``spec/`` driven in lockstep by one Hypothesis ``RuleBasedStateMachine``.

Universe (``CFG``): one queue ``q0``, three tasks whose priority order and key order disagree
(``t0`` may yield once with continuation ``k0``), two workers, two failures of budget per
task, unbounded epochs/crashes/pauses.  The engine runs on one ``SimFS``: store
``SharedFilesystemStore("/pool", "run", fs=sim, clock=clock, reserve_bytes=0,
visibility_retries=1)`` and a ``Coordinator`` with the same ``ManualClock``.

Every rule calls the engine, then applies the matching spec action(s) (its precondition must
hold exactly when the engine accepted), checks every spec invariant by id (state: D1–D4, D7,
D9, R1, Q1, Q2, Q5; step: D5, D8, Q3, Q4) on the transition, and compares observations:

* each submitted task's (status, attempt, failures);
* the commit log: (task, attempt, submission id) in order; receipts (a retry returns the same);
* the reader protections: engine ``outstanding_reads`` versus the spec's worker read pins;
* for every lease a worker holds: the engine's lease equals the spec's (task, attempt, epoch),
  and it may commit in the engine (current, unexpired by the clock) iff ``spec.live``;
* D2 on the engine itself: what its journal names is a root of the queue's catalog owner.

Faults: a crash mid-operation (``sim.crash_at`` on a random later filesystem call, then a power
loss ``sim.crash(variant)`` or ``sim.kill_client``), after which ``Coordinator(recover=True)``
opens the queue on a fresh store.  The interrupted operation may have happened or not: each
candidate (the spec's action sequence, or a prefix that the journal can keep) is followed by
``coord_crash`` + ``coord_recover`` and compared with the recovered engine; one must match,
nothing else is allowed.  Lost replies (``complete`` whose receipt the worker never sees, then a
retry with the same submission id), lease expiry through the clock (journaled by the next
acquire), a worker crash and its retirement, and a paused old coordinator: a new one takes over
with ``recover=True, takeover=True`` and the old one's ``complete_task`` must raise
``IndeterminateCommit``/``Fenced`` (spec ``old_coord_complete``).

Scheduling ties are still avoided by the machine's task plans; the FIFO tie rule (the
submission position is kept when a task is requeued — engine and spec agree since the engine
fix this machine prompted) is pinned by ``test_requeued_task_keeps_its_fifo_position``.

Profiles: ``ci`` (default, well under 90 s) and ``deep`` (``STRAW_HYPOTHESIS_PROFILE=deep``).
``pytest -s`` prints the number of steps run.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
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

from fault_injection.rules import SimulatedCrash
from fault_injection.simfs import SimFS
from spec import actions as A
from spec.config import Config, ExtentDecl, TaskDecl
from spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS
from spec.mutants import CORRECT
from spec.state import Lease as SLease
from spec.state import State, TaskStatus, initial_state
from straw import Fenced, IndeterminateCommit, LeaseExpired, Record, StaleAttempt
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.protocol import Lease, TaskSpec
from straw.store import SharedFilesystemStore

LEASE_SECONDS = 10.0
# a journal snapshot every few transactions: history moves to history segments (straw.history,
# spec H1) and recoveries after crashes read it back from them
SNAPSHOT_EVERY = 3
Q = 0
WORKERS = ("w0", "w1")
CFG = Config(
    name="queue-conformance",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=(
        ExtentDecl("i0", 0),
        ExtentDecl("i1", 0),
        ExtentDecl("i2", 0),
        ExtentDecl("k0", 1),
        ExtentDecl("r0", 1),
        ExtentDecl("r1", 1),
        ExtentDecl("r2", 1),
    ),
    preloaded=(0, 1, 2),
    queues=("q0",),
    tasks=(
        TaskDecl("t0", 0, input=0, result=4, priority=1, key=1, fifo=0, continuation=3),
        TaskDecl("t1", 0, input=1, result=5, priority=0, key=0, fifo=1),
        TaskDecl("t2", 0, input=2, result=6, priority=0, key=1, fifo=2),
    ),
    workers=WORKERS,
    max_attempts=2,
    max_epoch=10**9,
    max_crashes=10**9,
    max_pauses=10**9,
)
TASKS = tuple(d.name for d in CFG.tasks)
VARIANTS = ("clear-cache", "torn-seq", "torn-op", "kill")
STEPS: Counter[str] = Counter()  # rule name -> executions, over the whole run


class Disagreement(AssertionError):
    pass


def sid_of(le: SLease) -> str:
    """The completion's submission id is the lease identity (as in the spec)."""
    return f"{TASKS[le.task]}-a{le.attempt}-{WORKERS[le.worker]}-e{le.epoch}"


@dataclass
class Held:
    """A lease a worker holds: the spec's and the engine's; a completion in flight (its
    submission id's result) when the reply was lost or a crash interrupted it."""

    spec: SLease
    engine: Lease
    result: Any = None


Step = tuple[str, tuple[Any, ...]]  # a spec action name and its arguments
Crash = tuple[int, str, str] | None  # (nth filesystem call, variant, before/after) or none


class QueueConformance(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**32 - 1))
    def setup(self, seed: int) -> None:
        """A fresh SimFS (its seed drives torn writes), store, inputs and coordinator."""
        self.sim = SimFS(seed, record_trace=False)
        self.clock = ManualClock()
        self.gen = 0
        self.store = self._open_store()
        self.refs: dict[tuple[str, int], str] = {}  # engine extent -> spec extent name
        self.inputs = []
        for d in CFG.tasks:
            ref = self.store.publish([Record("prompt", d.name.encode())],
                                     submission_id=f"in-{d.name}")
            self.inputs.append(ref)
            self.refs[(ref.path, ref.offset)] = CFG.ename(d.input)
        self.coord = Coordinator(self.store, queue_id="q0", lease_seconds=LEASE_SECONDS,
                                 clock=self.clock, snapshot_every=SNAPSHOT_EVERY)
        self.old: Coordinator | None = None
        self.s: State = initial_state(CFG)
        self.held: dict[int, Held] = {}
        self.receipts: dict[str, Any] = {}
        self.submitted: set[int] = set()

    # --- plumbing -------------------------------------------------------------------------
    def _open_store(self) -> SharedFilesystemStore:
        self.gen += 1
        return SharedFilesystemStore("/pool", "run", fs=self.sim, clock=self.clock,
                                     reserve_bytes=0, visibility_retries=1,
                                     writer_id=f"g{self.gen}")

    def _spec(self, s: State, name: str, *args: Any) -> State | None:
        """Apply spec action `name` to s, checking every invariant on the transition."""
        out = getattr(A, name)(CFG, CORRECT, s, *args)
        if out is None:
            return None
        c = s.coords[Q]
        epoch = {"coord_recover": c.durable + 1, "old_coord_complete": c.paused}.get(
            name, c.serving)
        act = A.Action(name, tuple(str(a) for a in args), "conformance", out.reply, epoch, Q)
        for iid, step_check in STEP_INVARIANTS.items():
            msg = step_check(CFG, s, act, out.state)
            if msg is not None:
                raise Disagreement(f"spec invariant {iid} violated by {act}: {msg}")
        for iid, state_check in STATE_INVARIANTS.items():
            msg = state_check(CFG, out.state)
            if msg is not None:
                raise Disagreement(f"spec invariant {iid} violated after {act}: {msg}")
        return out.state

    def _seq(self, s: State, steps: Sequence[Step]) -> State | None:
        for name, args in steps:
            nxt = self._spec(s, name, *args)
            if nxt is None:
                return None
            s = nxt
        return s

    def apply(self, steps: Sequence[Step], why: str) -> None:
        """The engine did `steps`: each must be enabled in the spec."""
        s = self.s
        for name, args in steps:
            nxt = self._spec(s, name, *args)
            if nxt is None:
                raise Disagreement(f"{why}: the engine did {name}{args}, the spec does not "
                                   f"allow it")
            s = nxt
        self.s = s
        self._sync_held()

    def _sync_held(self) -> None:
        for w in list(self.held):
            if self.held[w].spec not in self.s.leases:
                del self.held[w]

    def _engine_call(self, fn: Callable[[], Any], crash: Crash) -> tuple[
            bool, Any, BaseException | None]:
        """Run an engine call, optionally with a crash at its nth filesystem call.
        Returns (crashed, result, error)."""
        cp = self.sim.crash_at(crash[0], when=crash[2]) if crash is not None else None
        result: Any = None
        err: BaseException | None = None
        try:
            result = fn()
        except SimulatedCrash as e:
            err = e
        except Exception as e:  # noqa: BLE001 - classified by the caller
            err = e
        if cp is not None:
            if cp.fired:
                self._power_loss(crash[1])  # type: ignore[index]
                return True, None, err
            cp.fired = True  # the call finished before reaching the crash point: disarm
        if isinstance(err, SimulatedCrash):
            raise err
        return False, result, err

    def _power_loss(self, variant: str) -> None:
        if variant == "kill":
            self.sim.kill_client("main")
        else:
            self.sim.crash(variant)
        self.old = None  # a paused old coordinator died with the machine/process
        self.store = self._open_store()
        self.coord = Coordinator(self.store, queue_id="q0", recover=True,
                                 lease_seconds=LEASE_SECONDS, clock=self.clock,
                                 snapshot_every=SNAPSHOT_EVERY)

    def resolve(self, candidates: Sequence[Sequence[Step]], what: str) -> int:
        """After a crash and recovery: the candidate whose spec result (followed by
        coord_crash + coord_recover) matches the recovered engine. Returns its index."""
        engine = self.observe_engine()
        tried = []
        for i, steps in enumerate(candidates):
            s = self._seq(self.s, list(steps) + [("coord_crash", (Q,)),
                                                  ("coord_recover", (Q,))])
            if s is None:
                tried.append((steps, "not enabled in the spec"))
                continue
            obs = self.observe_spec(s)
            if obs == engine:
                if what != "idle coordinator crash":
                    STEPS["crash mid-operation: " + ("did not happen" if i == 0 else
                                                     "happened" if i == len(candidates) - 1
                                                     else "partly happened")] += 1
                self.s = s
                self._sync_held()
                return i
            tried.append((steps, obs))
        raise Disagreement(f"crash during {what}: recovered engine {engine} matches no spec "
                           f"candidate: {tried}")

    # --- observations -----------------------------------------------------------------------
    def _ename(self, ref: Any) -> str:
        return self.refs.get((ref.path, ref.offset), f"?{ref.path}@{ref.offset}")

    def observe_engine(self) -> tuple[Any, ...]:
        tasks = []
        for t, name in enumerate(TASKS):
            ts = self.coord.task_status(name)
            if ts is None:
                tasks.append((name, "unsubmitted", 0, 0))
                continue
            self.submitted.add(t)
            tasks.append((name, ts["state"], ts["generation"], ts["failures"]))
        page = self.coord.read_commits(0, 100)
        # a completed task's generation is its committed attempt (it is never leased again)
        commits = tuple((c.task_id, self.coord.task_status(c.task_id)["generation"],
                         c.submission_id) for c in page.commits)
        reads = frozenset((r.worker_id, self._ename(self._read_input(r)))
                          for r in self.coord.outstanding_reads())
        return tuple(tasks), commits, reads

    def _read_input(self, lease: Lease) -> Any:
        """The input an outstanding read protects (the engine's reads table)."""
        t = self.coord.state.reads[(lease.worker_id, lease.task_id, lease.generation)]
        return self.coord._to_ref(t)

    def observe_spec(self, s: State) -> tuple[Any, ...]:
        tasks = tuple((TASKS[t], tk.status.value, tk.attempt, tk.failures)
                      for t, tk in enumerate(s.tasks))
        commits = tuple((TASKS[c.lease.task], c.lease.attempt, sid_of(c.lease))
                        for c in s.commits)
        reads = frozenset((h, CFG.ename(e)) for (h, e) in s.storage.pins if h in WORKERS)
        return tasks, commits, reads

    def engine_may_commit(self, le: Lease) -> bool:
        ts = self.coord.task_status(le.task_id)
        cur = ts["lease"]
        return (ts["state"] == "leased" and cur is not None
                and cur["generation"] == le.generation and cur["worker_id"] == le.worker_id
                and le.coordinator_epoch == self.coord.epoch
                and not self.clock.now() > ts["deadline"])

    @invariant()
    def engine_matches_spec(self) -> None:
        eng, spec = self.observe_engine(), self.observe_spec(self.s)
        if eng != spec:
            raise Disagreement(f"engine {eng}\n     != spec {spec}")
        for w, h in self.held.items():
            le = h.engine
            if (TASKS.index(le.task_id), le.generation, int(le.coordinator_epoch),
                    WORKERS.index(le.worker_id)) != (
                    h.spec.task, h.spec.attempt, h.spec.epoch, w):
                raise Disagreement(f"worker {w}: engine lease {le} != spec lease {h.spec}")
            if self.engine_may_commit(le) != A.live(CFG, self.s, h.spec):
                raise Disagreement(f"lease {h.spec}: engine may commit "
                                   f"{self.engine_may_commit(le)}, spec live "
                                   f"{A.live(CFG, self.s, h.spec)}")
        self.check_engine_d2()
        STEPS["(checks)"] += 1

    def check_engine_d2(self) -> None:
        """D2 on the engine: everything its journal names (inputs of pending/leased tasks,
        inputs being read, results of commits: no consumer retires any here) is a root of
        the queue's owner in the catalog."""
        named = [self._read_input(r) for r in self.coord.outstanding_reads()]
        for spec in self.coord.pending_tasks():
            if spec.input_ref is not None:
                named.append(spec.input_ref)
        for name in TASKS:
            ts = self.coord.task_status(name)
            if ts is not None and ts["state"] == "leased":
                inp = self.coord.state.tasks[name].input
                if inp is not None:
                    named.append(self.coord._to_ref(inp))
        named += [c.result_ref for c in self.coord.read_commits(0, 100).commits]
        with self.store.catalog.locked() as cst:
            roots = cst.owners.get((self.store.run_id, self.coord.owner), frozenset())
        for ref in named:
            if (ref.path, ref.offset) not in roots:
                raise Disagreement(f"D2 (engine): {self._ename(ref)} named by the journal of "
                                   f"{self.coord.owner} is not one of its roots")

    # --- strategies -------------------------------------------------------------------------
    # about one operation in six crashes, before or after one of its first 20 filesystem calls
    crashes = st.tuples(st.integers(0, 5), st.integers(1, 20), st.sampled_from(VARIANTS),
                        st.sampled_from(["before", "after"])).map(
        lambda x: None if x[0] else (x[1], x[2], x[3]))

    def _holders(self, *, lost: bool | None = False) -> list[int]:
        """Workers holding a lease (lost=None: any; False: no completion in flight; True:
        a completion whose reply was lost, to be retried)."""
        return [w for w, h in sorted(self.held.items())
                if lost is None or (h.result is not None) == lost]

    def _pick(self, ws: list[int], w: int) -> int:
        return ws[w % len(ws)]

    def _free(self, w: int) -> bool:
        """A worker may acquire: no lease, no read, no protection left (spec acquire's
        precondition plus: retired after a crash, so reads map one to one onto pins)."""
        return (w not in self.held and not any(r[0] == w for r in self.s.reads)
                and not any(h == WORKERS[w] for (h, _) in self.s.storage.pins))

    # --- producer ---------------------------------------------------------------------------
    @precondition(lambda self: len(self.submitted) < len(TASKS))
    @rule(t=st.integers(0, len(TASKS) - 1), retry=st.integers(0, 4), crash=crashes)
    def submit(self, t: int, retry: int, crash: Crash) -> None:
        new = [t for t in range(len(TASKS)) if t not in self.submitted]
        t = sorted(self.submitted)[t % len(self.submitted)] if retry == 0 and self.submitted \
            else new[t % len(new)]
        STEPS["submit (retry)" if t in self.submitted else "submit"] += 1
        d = CFG.tasks[t]
        spec = TaskSpec(d.name, self.inputs[t], {}, priority=d.priority, scheduling_key=d.key,
                        max_attempts=CFG.max_attempts)
        again = t in self.submitted
        crashed, res, err = self._engine_call(
            lambda: self.coord.submit_tasks(f"req-{d.name}", [spec]), crash)
        steps: list[Step] = [("submit", (t,)), ("coord_retain_input", (t,)),
                             ("coord_journal_submit", (t,))]
        if again:  # an idempotent retry: same answer, nothing changes
            steps = []
        if crashed:
            self.resolve([[], steps] if steps else [[]], f"submit {d.name}")
            return
        if err is not None:
            raise Disagreement(f"submit {d.name} failed: {err!r}")
        assert res == [d.name]
        self.submitted.add(t)
        self.apply(steps, f"submit {d.name}")

    @precondition(lambda self: self.submitted)
    @rule(t=st.integers(0, len(TASKS) - 1), p=st.integers(0, 3), crash=crashes)
    def cancel(self, t: int, p: int, crash: Crash) -> None:
        if p:
            return  # rarer than the other rules (it ends a task for good)
        t = sorted(self.submitted)[t % len(self.submitted)]
        STEPS["cancel"] += 1
        crashed, res, err = self._engine_call(lambda: self.coord.cancel_task(TASKS[t]), crash)
        if crashed:
            self.resolve([[], [("cancel", (t,))]], f"cancel {TASKS[t]}")
            return
        if isinstance(err, ValueError) and "already" in str(err):
            err = None  # a terminal task: refused (the spec must refuse too, below)
        if err is not None:
            raise Disagreement(f"cancel failed: {err!r}")
        if res == "cancelled":
            self.apply([("cancel", (t,))], f"cancel {TASKS[t]}")
        elif A.cancel(CFG, CORRECT, self.s, t) is not None:
            raise Disagreement(f"engine refused to cancel {TASKS[t]}, the spec allows it")

    # --- clock ------------------------------------------------------------------------------
    @precondition(lambda self: self.held)
    @rule(dt=st.sampled_from([3.0, 6.0, LEASE_SECONDS + 1]))
    def advance_clock(self, dt: float) -> None:
        STEPS["advance_clock"] += 1
        self.clock.advance(dt)
        now = self.clock.now()
        steps: list[Step] = []
        for t, tk in enumerate(self.s.tasks):
            if tk.status == TaskStatus.LEASED and not tk.expired:
                deadline = self.coord.task_status(TASKS[t]).get("deadline")
                if deadline is None or now > deadline:
                    steps.append(("expire", (t,)))
        self.apply(steps, "clock")

    # --- workers ----------------------------------------------------------------------------
    @precondition(lambda self: self.submitted and any(self._free(w) for w in (0, 1)))
    @rule(w=st.integers(0, 1), crash=crashes)
    def acquire(self, w: int, crash: Crash) -> None:
        w = self._pick([w for w in (0, 1) if self._free(w)], w)
        STEPS["acquire"] += 1
        expired = [t for t, tk in enumerate(self.s.tasks)
                   if tk.status == TaskStatus.LEASED and tk.expired]
        crashed, res, err = self._engine_call(lambda: self.coord.acquire(WORKERS[w]), crash)
        requeues: list[Step] = [("requeue_expired", (t,)) for t in expired]
        if crashed:
            cands: list[list[Step]] = []
            for k in range(len(requeues) + 1):
                for sub in itertools.combinations(requeues, k):
                    cands.append(list(sub))
            grant = requeues + [("acquire", (w, Q))]
            i = self.resolve(cands + [grant], f"acquire by {WORKERS[w]}")
            if i == len(cands):  # granted, but the reply never arrived: the worker drops it
                (le,) = [le for le in self.s.leases if le.worker == w]
                self.apply([("abandon", (le,))], "lost acquire reply")
            return
        if err is not None:
            raise Disagreement(f"acquire failed: {err!r}")
        self.apply(requeues, "acquire journals expiries")
        if res.status == "acquired":
            (a,) = res.assignments
            self.apply([("acquire", (w, Q))], f"acquire by {WORKERS[w]}")
            (le,) = [le for le in self.s.leases if le.worker == w]
            if TASKS[le.task] != a.lease.task_id:
                raise Disagreement(f"engine leased {a.lease.task_id}, spec {TASKS[le.task]}")
            self.held[w] = Held(le, a.lease)
        elif res.status == "empty":
            if A.acquire(CFG, CORRECT, self.s, w, Q) is not None:
                raise Disagreement("engine answered empty, the spec has a pending task")
        else:
            raise Disagreement(f"unexpected acquire status {res.status}")

    @precondition(lambda self: self.held)
    @rule(w=st.integers(0, 1))
    def heartbeat(self, w: int) -> None:
        w = self._pick(self._holders(lost=None), w)
        h = self.held[w]
        STEPS["heartbeat"] += 1
        spec_ok = A.heartbeat(CFG, CORRECT, self.s, h.spec)
        assert spec_ok is not None
        (outcome,) = self.coord.heartbeat([h.engine])
        ok = outcome == "extended"
        if ok != (spec_ok.reply == "ok"):
            raise Disagreement(f"heartbeat {h.spec}: engine ok={ok}, spec {spec_ok.reply}")

    def _lease_ended(self, w: int, ok: bool, steps: list[Step], what: str) -> None:
        """The engine accepted (ok) the end of w's lease: the spec must too; or it refused
        with StaleAttempt/LeaseExpired: the spec must refuse and the worker abandons."""
        h = self.held[w]
        if ok:
            self.apply(steps, what)
            return
        if self._seq(self.s, steps[:1]) is not None:
            raise Disagreement(f"{what}: the engine refused a lease the spec accepts")
        self.apply([("abandon", (h.spec,))], f"{what} refused")

    def _publish_result(self, h: Held) -> Any:
        le = h.engine
        ref = self.store.publish(
            [Record("out", b"result", metadata={"task_id": le.task_id,
                                                "attempt_id": le.attempt_id})],
            submission_id=f"out-{sid_of(h.spec)}")
        self.refs[(ref.path, ref.offset)] = CFG.ename(CFG.tasks[h.spec.task].result)
        return ref

    @precondition(lambda self: self.held)
    @rule(w=st.integers(0, 1), lost=st.booleans(), crash=crashes)
    def complete(self, w: int, lost: bool, crash: Crash) -> None:
        w = self._pick(self._holders(lost=None), w)
        h = self.held[w]
        STEPS["complete (retry)" if h.result is not None else "complete"] += 1
        sid = sid_of(h.spec)
        retry = h.result is not None
        if not retry:
            h.result = self._publish_result(h)
        t = h.spec.task
        crashed, res, err = self._engine_call(
            lambda: self.coord.complete_task(h.engine, submission_id=sid, result_ref=h.result),
            crash)
        if retry:
            # D7: a retry answers the original receipt (or StaleAttempt if never accepted)
            if crashed:
                self.resolve([[]], "a retried complete")
                return
            ok = err is None
            if ok and self.receipts.get(sid, res) != res:
                raise Disagreement(f"retry of {sid}: receipt {res} != {self.receipts[sid]}")
            self._lease_ended(w, ok, [("complete", (h.spec, True))], f"retry of {sid}")
            return
        done: list[Step] = [("complete", (h.spec, False)), ("release_reads", (w, t))]
        if crashed:
            if self.resolve([[], done], f"complete {sid}") == 1:
                self.receipts[sid] = self.coord.lookup_submission(sid)
            return
        if err is not None and not isinstance(err, (LeaseExpired, StaleAttempt)):
            raise Disagreement(f"complete {sid} failed: {err!r}")
        if err is None:
            self.receipts[sid] = res
            if res.position != len(self.s.commits) or res.submission_id != sid:
                raise Disagreement(f"receipt {res} for {sid}")
            if not lost:
                done = [("complete", (h.spec, True)), ("release_reads", (w, t))]
        self._lease_ended(w, err is None, done, f"complete {sid}")

    @precondition(lambda self: self._holders())
    @rule(crash=crashes)
    def complete_tasks(self, crash: Crash) -> None:
        """straw's batch completion: every holder's completion in one call (one journal
        frame): the spec's ``complete`` of each item the engine accepts, in the items'
        order, and ``abandon`` of each it refuses (StaleAttempt, LeaseExpired); a crash
        keeps all of the accepted ones or none."""
        ws = self._holders()
        STEPS["complete_tasks"] += 1
        items, done = [], []
        for w in ws:
            h = self.held[w]
            h.result = self._publish_result(h)
            items.append({"lease": h.engine, "submission_id": sid_of(h.spec),
                          "result_ref": h.result})
        crashed, res, err = self._engine_call(lambda: self.coord.complete_tasks(items), crash)
        if crashed:
            for w in ws:  # the items the spec accepts: the frame holds all of them or none
                h = self.held[w]
                step: list[Step] = [("complete", (h.spec, False)),
                                    ("release_reads", (w, h.spec.task))]
                if self._seq(self._seq(self.s, done) or self.s, step) is not None:
                    done += step
            if self.resolve([[], done], "complete_tasks") == 1:
                for item in items:
                    sid = item["submission_id"]
                    if self.coord.lookup_submission(sid) is not None:
                        self.receipts[sid] = self.coord.lookup_submission(sid)
            return
        if err is not None:
            raise Disagreement(f"complete_tasks failed: {err!r}")
        for w, item, out in zip(ws, items, res, strict=True):
            h, sid = self.held[w], item["submission_id"]
            if isinstance(out, (LeaseExpired, StaleAttempt)):
                self._lease_ended(w, False, [("complete", (h.spec, True))],
                                  f"complete_tasks {sid}")
                continue
            if isinstance(out, BaseException):
                raise Disagreement(f"complete_tasks {sid} refused: {out!r}")
            self.receipts[sid] = out
            if out.position != len(self.s.commits) or out.submission_id != sid:
                raise Disagreement(f"receipt {out} for {sid}")
            self._lease_ended(w, True, [("complete", (h.spec, True)),
                                        ("release_reads", (w, h.spec.task))],
                              f"complete_tasks {sid}")

    @precondition(lambda self: self._holders())
    @rule(w=st.integers(0, 1), lost=st.booleans(), crash=crashes)
    def complete_and_acquire(self, w: int, lost: bool, crash: Crash) -> None:
        """straw's combined call: the commit and the next grant in one journal frame (spec
        ``complete_and_acquire``; ``complete`` when nothing is pending).  The engine's
        completion releases the worker's read in the same transaction, which the spec
        states as ``release_reads`` first.  A lost reply is retried by ``complete``."""
        w = self._pick(self._holders(), w)
        h = self.held[w]
        STEPS["complete_and_acquire"] += 1
        sid = sid_of(h.spec)
        h.result = self._publish_result(h)
        t = h.spec.task
        crashed, res, err = self._engine_call(
            lambda: self.coord.complete_and_acquire(h.engine, submission_id=sid,
                                                    result_ref=h.result), crash)
        both: list[Step] = [("release_reads", (w, t)), ("complete_and_acquire", (h.spec, False))]
        alone: list[Step] = [("complete", (h.spec, False)), ("release_reads", (w, t))]
        if crashed:
            i = self.resolve([[], both, alone], f"complete_and_acquire {sid}")
            if i:
                self.receipts[sid] = self.coord.lookup_submission(sid)
            return
        if err is not None and not isinstance(err, (LeaseExpired, StaleAttempt)):
            raise Disagreement(f"complete_and_acquire {sid} failed: {err!r}")
        if err is not None:
            self._lease_ended(w, False, alone, f"complete_and_acquire {sid}")
            return
        receipt, got = res
        self.receipts[sid] = receipt
        if receipt.position != len(self.s.commits) or receipt.submission_id != sid:
            raise Disagreement(f"receipt {receipt} for {sid}")
        if got.status != "acquired":
            if got.assignments or got.status != "empty":
                raise Disagreement(f"complete_and_acquire {sid}: acquire part {got}")
            if lost:
                self.apply(alone, f"complete_and_acquire {sid} (nothing pending)")
            else:
                self.apply([("complete", (h.spec, True)), ("release_reads", (w, t))],
                           f"complete_and_acquire {sid} (nothing pending)")
            return
        if lost:  # the worker never sees the receipt nor the new lease: it retries
            self.apply(both, f"complete_and_acquire {sid} (reply lost)")
            return
        self.apply([("release_reads", (w, t)), ("complete_and_acquire", (h.spec, True))],
                   f"complete_and_acquire {sid}")
        (a,) = got.assignments
        (le,) = [le for le in self.s.leases if le.worker == w]
        if TASKS[le.task] != a.lease.task_id:
            raise Disagreement(f"engine leased {a.lease.task_id}, spec {TASKS[le.task]}")
        self.held[w] = Held(le, a.lease)

    @precondition(lambda self: self._holders())
    @rule(w=st.integers(0, 1), crash=crashes)
    def fail(self, w: int, crash: Crash) -> None:
        w = self._pick(self._holders(), w)
        h = self.held[w]
        STEPS["fail"] += 1
        crashed, res, err = self._engine_call(
            lambda: self.coord.fail_task(h.engine, request_id=f"f-{sid_of(h.spec)}"), crash)
        steps: list[Step] = [("fail", (h.spec, True)), ("release_reads", (w, h.spec.task))]
        if crashed:
            self.resolve([[], steps], f"fail {h.spec}")
            return
        if err is not None and not isinstance(err, (LeaseExpired, StaleAttempt)):
            raise Disagreement(f"fail failed: {err!r}")
        self._lease_ended(w, err is None, steps, f"fail {h.spec}")

    @precondition(lambda self: self._holders())
    @rule(w=st.integers(0, 1), crash=crashes)
    def release(self, w: int, crash: Crash) -> None:
        w = self._pick(self._holders(), w)
        h = self.held[w]
        STEPS["release"] += 1
        crashed, res, err = self._engine_call(
            lambda: self.coord.release_tasks([h.engine]), crash)
        steps: list[Step] = [("release_lease", (h.spec,)), ("release_reads", (w, h.spec.task))]
        if crashed:
            self.resolve([[], steps], f"release {h.spec}")
            return
        if err is not None:
            raise Disagreement(f"release failed: {err!r}")
        if res not in (["released"], ["StaleAttempt"]):
            raise Disagreement(f"release answered {res}")
        self._lease_ended(w, res == ["released"], steps, f"release {h.spec}")

    @precondition(lambda self: self._holders())
    @rule(w=st.integers(0, 1), crash=crashes)
    def yield_task(self, w: int, crash: Crash) -> None:
        w = self._pick(self._holders(), w)
        h = self.held[w]
        t = h.spec.task
        if CFG.tasks[t].continuation is None or self.s.tasks[t].yielded:
            return
        STEPS["yield"] += 1
        k = self.store.publish([Record("partial", b"continuation")],
                               submission_id=f"k-{sid_of(h.spec)}")
        self.refs[(k.path, k.offset)] = CFG.ename(CFG.tasks[t].continuation)  # type: ignore[arg-type]
        crashed, res, err = self._engine_call(
            lambda: self.coord.yield_tasks([{"lease": h.engine, "input_ref": k}],
                                           request_id=f"y-{sid_of(h.spec)}"), crash)
        steps: list[Step] = [("yield_task", (h.spec,)), ("release_reads", (w, t))]
        if crashed:
            self.resolve([[], steps], f"yield {h.spec}")
            return
        if err is not None and not isinstance(err, (LeaseExpired, StaleAttempt)):
            raise Disagreement(f"yield failed: {err!r}")
        self._lease_ended(w, err is None, steps, f"yield {h.spec}")

    def _readers(self) -> list[int]:
        return [w for w in (0, 1) if w not in self.held and any(r[0] == w for r in self.s.reads)]

    @precondition(lambda self: self._readers())
    @rule(w=st.integers(0, 1))
    def release_reads(self, w: int) -> None:
        w = self._pick(self._readers(), w)
        mine = sorted({r[1] for r in self.s.reads if r[0] == w})
        STEPS["release_reads"] += 1
        t = mine[0]
        mine = [r for r in self.coord.outstanding_reads()
                if r.worker_id == WORKERS[w] and r.task_id == TASKS[t]]
        assert len(mine) == 1
        self.coord.release_task_reads(mine)
        assert mine[0] not in self.coord.outstanding_reads()
        self.apply([("release_reads", (w, t))], "release_task_reads")

    @rule(w=st.integers(0, 1))
    def worker_crash_and_retire(self, w: int) -> None:
        if w in self.held and self.held[w].result is not None:
            return  # keep lost replies for their retry
        if A.worker_crash(CFG, CORRECT, self.s, w) is None:
            return
        STEPS["worker_crash"] += 1
        self.apply([("worker_crash", (w,))], "worker crash")
        had = [r for r in self.coord.outstanding_reads() if r.worker_id == WORKERS[w]]
        self.coord.retire_worker(WORKERS[w])
        assert not [r for r in self.coord.outstanding_reads() if r.worker_id == WORKERS[w]]
        if A.retire_worker(CFG, CORRECT, self.s, w, Q) is None:
            assert not had
            return
        self.apply([("retire_worker", (w, Q))], "retire_worker")

    # --- coordinators -----------------------------------------------------------------------
    @rule(variant=st.sampled_from(VARIANTS), p=st.integers(0, 7))
    def coordinator_crash(self, variant: str, p: int) -> None:
        if p != 0:
            return  # rarer than the other rules
        STEPS["coordinator_crash"] += 1
        self._power_loss(variant)
        self.resolve([[]], "idle coordinator crash")

    @precondition(lambda self: self.old is None and self.s.coords[Q].paused is None
                  and self._holders())
    @rule(at_once=st.booleans(), w=st.integers(0, 1))
    def pause_and_takeover(self, at_once: bool, w: int) -> None:
        STEPS["pause_and_takeover"] += 1
        self.old = self.coord
        self.store = self._open_store()
        self.coord = Coordinator(self.store, queue_id="q0", recover=True, takeover=True,
                                 lease_seconds=LEASE_SECONDS, clock=self.clock,
                                 snapshot_every=SNAPSHOT_EVERY)
        self.apply([("coord_pause", (Q,)), ("coord_recover", (Q,))], "takeover")
        self.engine_matches_spec()
        if at_once:  # the old coordinator resumes at once and gets a completion
            self.old_coordinator_complete(w)

    def _old_holders(self) -> list[int]:
        old = self.old
        return [w for w in self._holders() if old is not None
                and self.held[w].spec.epoch == old.epoch]

    @precondition(lambda self: self.old is not None)
    @rule(w=st.integers(0, 1))
    def old_coordinator_complete(self, w: int) -> None:
        old = self.old
        assert old is not None
        if not self._old_holders():
            STEPS["old_coordinator_exits"] += 1
            _close_quietly(old)
            self.old = None
            return
        w = self._pick(self._old_holders(), w)
        h = self.held[w]
        ref = self._publish_result(h)
        # in the old coordinator's own (stale) view, may this lease commit?
        ts = old.task_status(h.engine.task_id)
        cur = ts["lease"]
        current = (ts["state"] == "leased" and cur is not None
                   and cur["generation"] == h.engine.generation
                   and not self.clock.now() > ts["deadline"])
        try:
            old.complete_task(h.engine, submission_id=sid_of(h.spec), result_ref=ref)
        except (IndeterminateCommit, Fenced):
            pass
        except (StaleAttempt, LeaseExpired) as e:
            if current:
                raise Disagreement("the old coordinator refused a lease it sees as current "
                                   f"with {e!r} instead of being fenced") from e
            # it refused from its own view (cancelled, expired, superseded): also no ack
        else:
            raise Disagreement("a paused old coordinator acknowledged a completion (D8)")
        STEPS["old_coordinator_complete (fenced)" if current else
              "old_coordinator_complete (stale)"] += 1
        _close_quietly(old)
        self.old = None
        self.apply([("old_coord_complete", (h.spec,))], "old coordinator fenced")

    def teardown(self) -> None:
        if not hasattr(self, "coord"):
            return
        for c in (self.old, self.coord):
            if c is not None:
                _close_quietly(c)


def _close_quietly(c: Coordinator) -> None:
    try:
        c.close()
    except Exception:  # noqa: BLE001 - a fenced coordinator may fail to close cleanly
        pass


PROFILES = {
    "ci": settings(max_examples=400, stateful_step_count=50, deadline=None,
                   suppress_health_check=list(HealthCheck)),
    "deep": settings(max_examples=2000, stateful_step_count=120, deadline=None,
                     suppress_health_check=list(HealthCheck)),
}


def test_queue_conformance() -> None:
    STEPS.clear()
    profile = os.environ.get("STRAW_HYPOTHESIS_PROFILE", "ci")
    QueueConformance.TestCase.settings = PROFILES[profile]
    QueueConformance.TestCase().runTest()
    total = sum(v for k, v in STEPS.items() if k != "(checks)" and not k.startswith("crash "))
    print(f"\nqueue conformance ({profile}): {total} steps, {STEPS['(checks)']} lockstep "
          f"comparisons; " + ", ".join(f"{k} {v}" for k, v in sorted(STEPS.items())
                                        if k != "(checks)"))
    assert total > 0


def test_fencing_skipped_mutant_is_caught() -> None:
    """The D8 mutant (a resumed old coordinator acknowledges) is caught by the explorer; the
    shortest counterexample is also asserted in tests/model/test_model_explorer.py
    (test_fenced_old_coordinator_trace)."""
    from model.explore import CONFIG_SETS, hunt_mutant

    _, res = hunt_mutant("fencing_skipped", CONFIG_SETS["small"])
    assert res is not None and res.violation is not None
    assert res.violation.iid == "D8"
    assert res.violation.trace[-1].name == "old_coord_complete"


def test_requeued_task_keeps_its_fifo_position() -> None:
    """Formerly a disagreement (fixed in the engine): two tasks of equal priority and key;
    t0 is leased and released.  The spec (Q4: the submission FIFO, which only a yield
    renews) hands out t0 again; the engine then gave a task a new FIFO position whenever it
    became pending again (release, fail, expiry, recovery) and handed out t1."""
    sim, clock = SimFS(0), ManualClock()
    store = SharedFilesystemStore("/pool", "run", fs=sim, clock=clock, reserve_bytes=0,
                                  visibility_retries=1)
    q = Coordinator(store, queue_id="q", clock=clock)
    q.submit_tasks("r", [TaskSpec("t0"), TaskSpec("t1")])
    (a,) = q.acquire("w").assignments
    q.release_tasks([a.lease])
    (b,) = q.acquire("w").assignments
    q.close()
    assert b.lease.task_id == "t0"


def _under_the_rollout_policy(monkeypatch: pytest.MonkeyPatch, *, engine: bool,
                              spec: bool) -> None:
    """Run the machine with recovery_spends_budget=False in the engine and/or the spec
    (the rollout layer's policy, spec configuration queue-preempt)."""
    import tests.conformance.test_queue_conformance as me

    if spec:
        monkeypatch.setattr(me, "CFG", replace(CFG, recovery_spends_budget=False))
    if engine:
        monkeypatch.setattr(me, "Coordinator", partial(Coordinator, recovery_spends_budget=False))


def test_queue_conformance_under_the_rollout_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Q6 under the policy that spends no budget at recovery: the engine's revocations
    agree with the spec's."""
    _under_the_rollout_policy(monkeypatch, engine=True, spec=True)
    QueueConformance.TestCase.settings = settings(PROFILES["ci"], max_examples=150)
    QueueConformance.TestCase().runTest()


def test_machine_tells_the_recovery_policies_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: an engine that spends no budget at recovery, checked against the
    spending spec, is caught (a task leased across recoveries fails in one, not the
    other)."""
    _under_the_rollout_policy(monkeypatch, engine=True, spec=False)
    QueueConformance.TestCase.settings = settings(
        PROFILES["ci"], max_examples=400, database=None, phases=(Phase.generate,),
        report_multiple_bugs=False)
    with pytest.raises(Disagreement):
        QueueConformance.TestCase().runTest()


def test_machine_catches_a_broken_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: an engine whose recovery forgets to revoke older leases (its epoch
    record leaves tasks leased) is caught by the machine."""
    from straw.queue_state import QueueState

    def no_revoke(self: QueueState, txn: dict[str, Any]) -> None:
        self.epoch = txn["epoch"]

    monkeypatch.setattr(QueueState, "_t_epoch", no_revoke)
    QueueConformance.TestCase.settings = settings(
        PROFILES["ci"], max_examples=200, database=None, phases=(Phase.generate,),
        report_multiple_bugs=False)
    with pytest.raises(Disagreement):
        QueueConformance.TestCase().runTest()

