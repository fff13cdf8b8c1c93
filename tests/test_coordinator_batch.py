"""``Coordinator.complete_tasks`` (straw's addition): many completions in one journal frame
and one catalog adoption, one outcome per item exactly as ``complete_task`` would answer it
alone.  The rollout controller returns a call of 64 groups with it (it made 64
``complete_task`` calls on 16 threads: the largest part of its CPU per group)."""

from __future__ import annotations

from typing import Any

import pytest

from fault_injection.rules import MUTATING_OPS, SimulatedCrash
from fault_injection.simfs import SimFS
from straw import (
    IdempotencyConflict,
    IndeterminateCommit,
    InvalidReference,
    LeaseExpired,
    Record,
    SharedFilesystemStore,
    StaleAttempt,
    StrawError,
    TaskSpec,
)
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.protocol import CommitReceipt

from .test_coordinator import _coord, _result


@pytest.fixture
def clock():  # type: ignore[no-untyped-def]
    return ManualClock()


@pytest.fixture
def store(tmp_path, clock):  # type: ignore[no-untyped-def]
    with SharedFilesystemStore(str(tmp_path), "run", clock=clock, reserve_bytes=0,
                               visibility_retries=1) as s:
        yield s


def _items(store_, assignments, tag="answer"):  # type: ignore[no-untyped-def]
    return [{"lease": a.lease, "submission_id": f"done-{a.lease.task_id}",
             "result_ref": _result(store_, a.lease, tag)} for a in assignments]


def test_many_completions_are_one_frame_and_one_sync(store):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(6)])
    got = q.acquire("w", max_tasks=6).assignments
    items = _items(store, got)
    m0 = dict(q.journal._m)
    out = q.complete_tasks(items)
    m1 = dict(q.journal._m)
    assert all(isinstance(o, CommitReceipt) for o in out)
    assert [o.task_id for o in out] == [f"t{i}" for i in range(6)]
    assert [o.position for o in out] == list(range(6))  # in the items' order
    assert m1["frames"] - m0["frames"] == 1 and m1["fsyncs"] - m0["fsyncs"] == 1
    assert m1["commits"] - m0["commits"] == 6
    for o in out:
        assert q.lookup_submission(o.submission_id) == o
        assert q.task_status(o.task_id)["state"] == "completed"
    # a retry of the whole call (a lost reply): the same receipts, nothing written
    assert q.complete_tasks(items) == out
    assert dict(q.journal._m)["frames"] == m1["frames"]
    assert q.complete_tasks([]) == []
    q.close()


def test_the_results_are_adopted_in_one_catalog_transaction(store):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(5)])
    items = _items(store, q.acquire("w", max_tasks=5).assignments)
    appends = []
    orig = store.catalog.append
    store.catalog.append = lambda ops: (appends.append(ops), orig(ops))[1]  # type: ignore
    try:
        q.complete_tasks(items)
    finally:
        store.catalog.append = orig  # type: ignore[method-assign]
    assert len(appends) == 1
    q.close()


def test_each_item_is_answered_as_complete_task_would_answer_it(store, clock):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(5)])
    a, b, c, d, e = q.acquire("w", max_tasks=5).assignments
    earlier = q.complete_task(a.lease, submission_id="done-t0",
                              result_ref=_result(store, a.lease))
    good = _items(store, [d, e])
    items = [
        {"lease": a.lease, "submission_id": "done-t0",
         "result_ref": _result(store, a.lease)},  # a retry: the original receipt
        {"lease": a.lease, "submission_id": "done-t0",
         "result_ref": _result(store, a.lease, "other")},  # other content: a conflict
        {"lease": b.lease, "submission_id": "done-t1", "result_ref": _result(store, b.lease),
         "result_digest": "0" * 32},  # a claimed digest that is not the reference's
        {"lease": b.lease, "submission_id": "done-t1b",
         "result_ref": _result(store, c.lease)},  # another attempt's result
        *good,
    ]
    out = q.complete_tasks(items)
    assert out[0] == earlier
    assert isinstance(out[1], IdempotencyConflict)
    assert isinstance(out[2], InvalidReference) and "digest" in str(out[2])
    assert isinstance(out[3], InvalidReference)
    assert [type(o) for o in out[4:]] == [CommitReceipt, CommitReceipt]
    assert q.task_status("t1")["state"] == "leased"  # refused items changed nothing
    # an expired and a stale lease, beside a good one
    clock.advance(11)
    (f,) = q.acquire("w2", task_ids=["t1"]).assignments  # b expired: t1 leased anew
    out = q.complete_tasks([
        {"lease": c.lease, "submission_id": "late", "result_ref": _result(store, c.lease)},
        {"lease": b.lease, "submission_id": "stale", "result_ref": _result(store, b.lease)},
        {"lease": f.lease, "submission_id": "fresh", "result_ref": _result(store, f.lease)},
    ])
    assert isinstance(out[0], (LeaseExpired, StaleAttempt))
    assert isinstance(out[1], StaleAttempt)
    assert isinstance(out[2], CommitReceipt) and out[2].task_id == "t1"
    q.close()


def test_malformed_items_refuse_the_whole_call_before_anything(store):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t0")])
    (a,) = q.acquire("w").assignments
    good = _items(store, [a])[0]
    for bad, err in [({"lease": a.lease}, TypeError), ("x", TypeError),
                     ({**good, "color": 1}, TypeError),
                     ({**good, "submission_id": ""}, ValueError)]:
        with pytest.raises(err):
            q.complete_tasks([good, bad])
    with pytest.raises(TypeError):
        q.complete_tasks(good)  # type: ignore[arg-type]
    assert q.task_status("t0")["state"] == "leased"
    q.close()


def _one_by_one(self: Coordinator, items: Any) -> list[Any]:
    """The negative control: each item its own transaction (a crash keeps a part)."""
    out: list[Any] = []
    for item in items:
        try:
            out.append(self.complete_task(item["lease"], submission_id=item["submission_id"],
                                          result_ref=item["result_ref"]))
        except StrawError as e:
            out.append(e)
    return out


def test_a_crash_keeps_all_the_accepted_completions_or_none():
    assert _crash_sweep() == {"all", "none"}


def test_the_sweep_catches_a_batch_that_is_not_one_frame(monkeypatch):
    monkeypatch.setattr(Coordinator, "complete_tasks", _one_by_one)
    assert "part" in _crash_sweep()


def _crash_sweep() -> set[str]:
    """A crash at every mutating operation of the call, then a power loss: what the
    recovered queue holds of the call's completions ("all", "none" or "part": one frame
    never gives a part)."""
    seen = set()
    for k in range(1, 80):
        sim, clock = SimFS(k), ManualClock()
        store = SharedFilesystemStore("/pool", "run", fs=sim, clock=clock, reserve_bytes=0,
                                      visibility_retries=1)
        q = Coordinator(store, queue_id="q", clock=clock)
        q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(4)])
        got = q.acquire("w", max_tasks=4).assignments
        items = [{"lease": a.lease, "submission_id": f"done-{a.lease.task_id}",
                  "result_ref": store.publish([Record("out", b"r", metadata={
                      "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})],
                      submission_id=f"o{a.lease.task_id}")} for a in got]
        point = sim.crash_at(k, ops=MUTATING_OPS, when="after")
        try:
            q.complete_tasks(items)
        except (SimulatedCrash, IndeterminateCommit):  # the crash met in the journal's thread
            pass
        crashed = point.fired  # (the control answers a crash per item, raising nothing)
        point.fired = True  # disarmed if the call finished first
        sim.crash("clear-cache")
        store2 = SharedFilesystemStore("/pool", "run", fs=sim, clock=clock, reserve_bytes=0,
                                       visibility_retries=1)
        q2 = Coordinator(store2, queue_id="q", clock=clock, recover=True)
        states = {q2.task_status(f"t{i}")["state"] for i in range(4)}
        q2.close()
        seen.add("all" if states == {"completed"} else "none" if states == {"pending"}
                 else "part")
        if not crashed:
            assert states == {"completed"}
            break
    return seen
