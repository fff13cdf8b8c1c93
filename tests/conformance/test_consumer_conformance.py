"""Consumer conformance: the engine's consumer surface (straw-queue's ``save_consumer_state``
with progress records, ``register_checkpoint``, ``collect_garbage``) and the consumer part of
``spec/`` (``consume``, ``acknowledge``, ``restore``, ``consumer_drop``, checkpoints, and
collection) driven in lockstep by one Hypothesis ``RuleBasedStateMachine``.

Universe (``CFG``): one queue ``q0``, three tasks, each result in its own pack (so one
collection can reclaim one result), one worker, one checkpoint registration.  The engine runs
on a real directory.  The spec's consumer owner ``cons0`` is an application owner of the
engine (``store.retain("cons0", buffer)``: what the consumer keeps until it trained on it);
the spec's cursor is the engine's processed cursor, its ``acked`` the processed positions of
the engine's progress record; ``ckpt0`` is the application's retention of the checkpoint's
buffer, and the engine's checkpoint is registered with the spec's cursor.

After every rule: the results the spec's journal names (``journal_named``) are the results
the engine's queue names (its ``live_refs``), and the engine's D2 holds (each is a root of the
queue's catalog owner); after a collection, the result packs the spec reclaimed are the ones
the engine deleted.  A ``restore`` is refused by the engine (``InvalidReference`` or
``CorruptData``, journal unchanged) exactly when the spec's precondition fails (history it
needs is no longer usable).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from spec import actions as A
from spec.config import Config, ExtentDecl, TaskDecl
from spec.invariants import check_state
from spec.mutants import CORRECT
from spec.state import State, initial_state
from straw import CorruptData, InvalidReference, Record, SharedFilesystemStore
from straw.coordinator import Coordinator
from straw.protocol import TaskSpec

N = 3
CFG = Config(
    name="consumer-conformance",
    packs=("p0", "p1", "p2", "p3"),
    pack_writer=("prod", "work", "work", "work"),
    extents=(
        *(ExtentDecl(f"i{t}", 0) for t in range(N)),
        *(ExtentDecl(f"r{t}", 1 + t) for t in range(N)),
    ),
    preloaded=tuple(range(N)),
    queues=("q0",),
    tasks=tuple(TaskDecl(f"t{t}", 0, input=t, result=N + t, priority=N - t, key=0, fifo=t)
                for t in range(N)),
    workers=("w0",),
    max_attempts=1,
    checkpoints=1,
    gc=True,
    consumer_queues=(0,),
    worker_crashes=False,
    cancel=False,
)


def open_queue(store: SharedFilesystemStore) -> Coordinator:
    kw: dict[str, Any] = {"queue_id": "q0"}
    if "exclusive_owner" in Coordinator.__init__.__code__.co_varnames:
        kw["exclusive_owner"] = "the conformance machine"
    return Coordinator(store, **kw)


_RUNS = itertools.count()


class ConsumerConformance(RuleBasedStateMachine):
    root: Path

    @initialize()
    def setup(self) -> None:
        self.n_run = getattr(self, "n_run", 0) + 1
        # a fresh directory per example: ``id(self)`` was reused by a later machine once the
        # earlier one was collected (its queue then existed: UnsafeRecovery, and Hypothesis
        # saw the same choices behave differently, FlakyStrategyDefinition)
        root = ConsumerConformance.root / f"run-{next(_RUNS)}"
        self.store = SharedFilesystemStore(str(root), "run", reserve_bytes=0,
                                           visibility_retries=1)
        self.root = root
        self.q = open_queue(self.store)
        self.token = self.q.open_consumer("training", exclusive_owner="the machine")
        self.s: State = initial_state(CFG)
        self.results: list[Any] = []  # engine result refs, by commit position
        self.n = 0  # unique request and publication names
        self.ck_id: str | None = None

    # --- plumbing ---------------------------------------------------------------------------
    def spec(self, prefix: str) -> bool:
        """Take the spec's enabled action whose text starts with ``prefix`` (False if none)."""
        for action, nxt in A.successors(CFG, CORRECT, self.s):
            if str(action).startswith(prefix):
                self.s = nxt
                bad = check_state(CFG, nxt)
                assert bad is None, f"{bad}: spec after {action}"
                return True
        return False

    def uid(self, what: str) -> str:
        self.n += 1
        return f"{what}-{self.n}"

    @property
    def cons(self) -> Any:
        return self.s.consumers[0]

    def save(self, cursor: int, acked: frozenset[int]) -> None:
        """The engine's consumer view = the spec's (cursor, acked)."""
        state = self.store.publish([Record("state", b"s")], submission_id=self.uid("state"))
        progress = None
        if acked:
            body = {"version": 1, "processed_positions": sorted(acked), "finished_batches": []}
            progress = self.store.publish([Record("p", json.dumps(body).encode(), "json.v1")],
                                          submission_id=self.uid("progress"))
        self.q.save_consumer_state("training", token=self.token, request_id=self.uid("save"),
                                   state_ref=state, fetch_cursor=len(self.results),
                                   processed_cursor=cursor, progress_ref=progress)
        self.store.release_publications([state] + ([progress] if progress else []))

    def retain_buffer(self, owner: str, buffer: frozenset[int]) -> None:
        refs = [self.results[e - N] for e in sorted(buffer)]
        if refs:
            self.store.retain(owner, refs)
        else:
            self.store.release(owner)

    def check(self) -> None:
        """Spec journal_named results == engine queue-named results; engine D2."""
        spec_named = {CFG.ename(e) for e in A.journal_named(CFG, self.s, 0) if e >= N}
        by_extent = {(r.path, r.offset): f"r{self.task_of(i)}"
                     for i, r in enumerate(self.results)}
        with self.q._mutex:
            live = self.q.state.live_refs(self.q.consumer_id)
        engine_named = {by_extent[(t[0], t[1])] for t in live if (t[0], t[1]) in by_extent}
        assert engine_named == spec_named, (engine_named, spec_named)
        with self.store.catalog.locked() as cst:
            roots = cst.owners.get((self.store.run_id, self.q.owner), frozenset())
        missing = {(t[0], t[1]) for t in live} - set(roots)
        assert not missing, f"D2 (engine): {missing} named but not roots of {self.q.owner}"

    def task_of(self, position: int) -> int:
        return [c.lease.task for c in A.queue_log(CFG, self.s, 0)][position]

    # --- rules --------------------------------------------------------------------------------
    @precondition(lambda self: len(self.results) < N)
    @rule()
    def produce(self) -> None:
        """A task is submitted, leased and accepted; its result gets its own pack."""
        t = len(self.results)
        for step in (f"submit(t{t})", f"coord_retain_input(t{t})",
                     f"coord_journal_submit(t{t})", "acquire(w0, q0)", "complete(w0",
                     f"release_reads(w0, t{t})", f"seal(p{t + 1})"):
            assert self.spec(step), step
        self.q.submit_tasks(self.uid("submit"), [TaskSpec(f"t{t}")])
        (a,) = self.q.acquire("w0").assignments
        meta = ({"task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id}
                if hasattr(a.lease, "attempt_id") else
                {"task_id": a.lease.task_id, "attempt": a.lease.attempt})
        ref = self.store.publish([Record("r", f"result {t}".encode(), metadata=meta)],
                                 submission_id=f"result-{t}")
        self.store.seal()
        self.q.complete_task(a.lease, submission_id=f"done-{t}", result_ref=ref)
        self.store.release_publications([ref])
        self.results.append(ref)
        self.check()

    @rule()
    def consume(self) -> None:
        if not self.spec("consume(q0)"):
            return
        self.retain_buffer("cons0", self.cons.buffer)
        self.save(self.cons.cursor, self.cons.acked)
        self.check()

    @rule(i=st.integers(1, N - 1))
    def acknowledge(self, i: int) -> None:
        if not self.spec(f"acknowledge(q0, {i})"):
            return
        self.retain_buffer("cons0", self.cons.buffer)
        self.save(self.cons.cursor, self.cons.acked)
        self.check()

    @rule(i=st.integers(0, N - 1))
    def consumer_drop(self, i: int) -> None:
        if not self.spec(f"consumer_drop(q0, r{i})"):
            return
        self.retain_buffer("cons0", self.cons.buffer)
        self.check()

    @rule()
    def register_checkpoint(self) -> None:
        before = self.s
        if not self.spec("register_checkpoint(q0)"):
            return
        self.retain_buffer("ckpt0", self.cons.buffer)
        state = self.store.publish([Record("s", b"s")], submission_id=self.uid("ck-state"))
        self.ck_id = self.uid("ck")
        body = {"version": 1, "checkpoint_id": self.ck_id, "batch_ids": [],
                "consumer_state": dataclasses.asdict(state), "training_dependencies": []}
        ck = self.store.publish([Record("ck", json.dumps(body).encode(), "json.v1")],
                                submission_id=self.uid("ck-record"), dependencies=[state])
        assert before.consumers[0].ck_cursor is None  # one registration (CFG.checkpoints)
        self.q.register_checkpoint(self.ck_id, ck, cursor=self.cons.ck_cursor)
        self.store.release_publications([state, ck])
        self.check()

    @rule()
    def release_checkpoint(self) -> None:
        if not self.spec("release_checkpoint(q0)"):
            return
        assert self.ck_id is not None
        self.q.release_checkpoint(self.ck_id)
        self.store.release("ckpt0")
        self.check()

    @rule()
    def collect(self) -> None:
        """One whole collection in the spec; collect_garbage in the engine."""
        assert self.spec("gc_lock()") and self.spec("gc_scan()")
        plan = self.s.collector.plan or frozenset()
        for p in sorted(plan):
            assert self.spec(f"gc_tombstone({CFG.packs[p]})")
        for p in sorted(plan):
            assert self.spec(f"gc_unlink({CFG.packs[p]})")
        assert self.spec("gc_unlock()")
        self.q.collect_garbage()
        spec_gone = {t for t in range(len(self.results)) if 1 + t in self.s.storage.tombstones}
        engine_gone = {t for t, r in enumerate(self.results) if not (self.root / r.path).exists()}
        assert engine_gone == spec_gone, (engine_gone, spec_gone)
        self.check()

    @rule()
    def restore(self) -> None:
        """Back to cursor 0 (an older consumer view): refused exactly when the spec refuses."""
        c = self.cons
        if c.cursor == 0 and not c.acked:
            return
        accepted = self.spec("restore(q0)")
        try:
            self.save(0, frozenset())
        except (InvalidReference, CorruptData):
            assert not accepted, "the engine refused a restore the spec accepts"
        else:
            assert accepted, "the engine restored history the spec says is not usable"
        self.check()

    def teardown(self) -> None:
        self.q.close()
        self.store.close()


@pytest.mark.parametrize("profile", ["ci"])
def test_consumer_conformance(tmp_path: Path, profile: str) -> None:
    ConsumerConformance.root = tmp_path
    ConsumerConformance.TestCase.settings = settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    ConsumerConformance.TestCase().runTest()
