"""The durable queue: tasks, leases, exactly-once acceptance, fencing (D8), recovery (D9),
readers (D5), consumers, checkpoints and retention of queue data (D2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from straw import (
    CorruptData,
    Fenced,
    IdempotencyConflict,
    IndeterminateCommit,
    InvalidReference,
    LeaseExpired,
    Record,
    SharedFilesystemStore,
    StaleAttempt,
    UnsafeRecovery,
    framing,
    journal,
)
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.protocol import Limits, TaskSpec


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def store(tmp_path, clock):
    with SharedFilesystemStore(str(tmp_path), "run", clock=clock, reserve_bytes=0,
                               visibility_retries=1) as s:
        yield s


def _coord(store, **kw) -> Coordinator:
    kw.setdefault("queue_id", "work")
    kw.setdefault("lease_seconds", 10)
    return Coordinator(store, **kw)


def _input(store, name: str):  # type: ignore[no-untyped-def]
    return store.publish([Record("prompt", name.encode())], submission_id=f"in-{name}")


def _result(store, lease, text: str = "answer"):  # type: ignore[no-untyped-def]
    return store.publish(
        [Record("out", text.encode(), metadata={"task_id": lease.task_id,
                                                "attempt_id": lease.attempt_id})],
        submission_id=f"out-{lease.task_id}-{lease.generation}-{text}")


def _run_one(store, q, worker="w0"):  # type: ignore[no-untyped-def]
    (a,) = q.acquire(worker).assignments
    return q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}",
                           result_ref=_result(store, a.lease))


def test_submit_acquire_complete_read(store):
    q = _coord(store)
    inp = _input(store, "t1")
    res = q.submit_tasks("req-1", [TaskSpec("t1", input_ref=inp, metadata={"k": 1})])
    assert res == ["t1"]
    got = q.acquire("w0")
    assert got.status == "acquired"
    (a,) = got.assignments
    assert a.task.input_ref == inp and a.task.metadata == {"k": 1}
    assert a.lease.generation == 1 and a.lease.coordinator_epoch == q.epoch
    assert a.lease.worker_id == "w0"
    out = _result(store, a.lease)
    receipt = q.complete_task(a.lease, submission_id="done-t1", result_ref=out,
                              result_digest=out.digest)
    assert receipt.position == 0 and receipt.result_ref == out
    page = q.read_commits(0, 10)
    assert [c.task_id for c in page.commits] == ["t1"] and page.cursor == 1
    assert q.lookup_submission("done-t1") == receipt
    assert q.task_status("t1")["state"] == "completed"
    assert q.acquire("w0").status == "empty"
    m = q.metrics()
    assert m["completed"] == 1 and m["commits"] == 1
    q.close()


def test_scheduling_order_and_its_survival_across_recovery(store):
    q = _coord(store)
    specs = [TaskSpec("low-a", priority=0, scheduling_key=5),
             TaskSpec("high-b", priority=5, scheduling_key=2),
             TaskSpec("high-a", priority=5, scheduling_key=1),
             TaskSpec("low-b", priority=0, scheduling_key=5),
             TaskSpec("mid", priority=1, scheduling_key=-3)]
    q.submit_tasks("r1", specs)
    order = ["high-a", "high-b", "mid", "low-a", "low-b"]
    assert [s.task_id for s in q.pending_tasks()] == order
    q.close()
    q = _coord(store, recover=True)
    assert [s.task_id for s in q.pending_tasks()] == order
    got = [q.acquire("w").assignments[0].task.task_id for _ in range(5)]
    assert got == order
    q.close()


def test_idempotent_submit_and_complete(store):
    q = _coord(store)
    q.submit_tasks("r1", [TaskSpec("t1")])
    assert q.submit_tasks("r1", [TaskSpec("t1")]) == ["t1"]
    with pytest.raises(IdempotencyConflict, match="r1"):
        q.submit_tasks("r1", [TaskSpec("t1", priority=3)])
    with pytest.raises(IdempotencyConflict, match="already exists"):
        q.submit_tasks("r2", [TaskSpec("t1")])
    (a,) = q.acquire("w").assignments
    out = _result(store, a.lease)
    r1 = q.complete_task(a.lease, submission_id="s", result_ref=out)
    # the reply was lost: the retry returns the same receipt, though the lease is over
    assert q.complete_task(a.lease, submission_id="s", result_ref=out) == r1
    other = _result(store, a.lease, "different")
    with pytest.raises(IdempotencyConflict):
        q.complete_task(a.lease, submission_id="s", result_ref=other)
    with pytest.raises(StaleAttempt):
        q.complete_task(a.lease, submission_id="s2", result_ref=other)
    assert len(q.read_commits().commits) == 1
    q.close()
    q = _coord(store, recover=True)
    assert q.lookup_submission("s") == r1
    assert q.submit_tasks("r1", [TaskSpec("t1")]) == ["t1"]
    q.close()


def test_lease_expiry_budget_and_stale_attempts(store, clock):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t", max_attempts=2)])
    (a1,) = q.acquire("w1").assignments
    clock.advance(11)
    with pytest.raises(LeaseExpired):
        q.complete_task(a1.lease, submission_id="s1", result_ref=_result(store, a1.lease))
    assert q.heartbeat([a1.lease]) == ["LeaseExpired"]
    (a2,) = q.acquire("w2").assignments  # the expiry is journaled; attempt 2
    assert a2.lease.generation == 2
    with pytest.raises(StaleAttempt):
        q.complete_task(a1.lease, submission_id="s1", result_ref=_result(store, a1.lease))
    clock.advance(5)
    assert q.heartbeat([a2.lease]) == ["extended"]
    clock.advance(8)  # past the original deadline, within the renewed one
    q.complete_task(a2.lease, submission_id="s2", result_ref=_result(store, a2.lease))
    q.submit_tasks("r2", [TaskSpec("u", max_attempts=2)])
    for _ in range(2):
        q.acquire("w")
        clock.advance(11)
    assert q.acquire("w").status == "empty"
    st = q.task_status("u")
    assert st["state"] == "failed" and st["failures"] == 2
    q.close()


def test_acquire_by_ids_leases_a_repeated_id_once_and_many_in_order(store):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"t{i}", priority=i % 2) for i in range(6)])
    got = q.acquire("w", max_tasks=5, task_ids=["t1", "t1", "t2"]).assignments
    assert [a.lease.task_id for a in got] == ["t1", "t2"]
    assert q.task_status("t1")["generation"] == 1
    rest = q.acquire("w", max_tasks=10).assignments  # Q4 in bulk: priority, then FIFO
    assert [a.lease.task_id for a in rest] == ["t3", "t5", "t0", "t4"]
    q.close()


def test_fail_release_yield_cancel(store):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("a", max_attempts=2), TaskSpec("b"), TaskSpec("c")])
    (la,) = q.acquire("w", task_ids=["a"]).assignments
    assert q.fail_task(la.lease, failure="boom") == "pending"
    (la,) = q.acquire("w", task_ids=["a"]).assignments
    assert q.fail_task(la.lease, failure="boom again") == "failed"
    assert q.task_status("a")["failure"] == "boom again"
    (lb,) = q.acquire("w", task_ids=["b"]).assignments
    q.release_tasks([lb.lease])
    assert q.task_status("b")["failures"] == 0 and q.task_status("b")["state"] == "pending"
    (lb,) = q.acquire("w", task_ids=["b"]).assignments
    (lc,) = q.acquire("w", task_ids=["c"]).assignments
    cont = _input(store, "b-continued")
    # atomic: one stale lease in the batch and nothing changes
    with pytest.raises(StaleAttempt):
        q.yield_tasks([{"lease": lb.lease, "input_ref": cont, "priority": 9},
                       {"lease": la.lease, "input_ref": cont}], request_id="y0")
    assert q.task_status("b")["state"] == "leased"
    q.yield_tasks([{"lease": lb.lease, "input_ref": cont, "priority": 9,
                    "metadata": {"step": 2}}], request_id="y1")
    st = q.task_status("b")
    assert st["state"] == "pending" and st["failures"] == 0
    assert q.pending_tasks()[0].input_ref == cont and q.pending_tasks()[0].task_id == "b"
    assert q.cancel_task("c") == "cancelled"
    with pytest.raises(ValueError, match="already cancelled"):
        q.cancel_task("c")
    with pytest.raises(StaleAttempt):
        q.complete_task(lc.lease, submission_id="x", result_ref=_result(store, lc.lease))
    q.close()


def test_statuses_backpressure_and_sealed_input(store):
    q = _coord(store, limits=Limits(max_leases_per_worker=1), enforce_limits=True)
    q.submit_tasks("r", [TaskSpec("a"), TaskSpec("b")])
    (a,) = q.acquire("w", max_tasks=5).assignments
    assert q.acquire("w").status == "backpressured"
    q.seal_input()
    with pytest.raises(ValueError, match="sealed"):
        q.submit_tasks("r2", [TaskSpec("c")])
    q.complete_task(a.lease, submission_id="s", result_ref=_result(store, a.lease))
    (b,) = q.acquire("w").assignments
    # sealed, b still leased (it may come back): "empty", as straw-queue answers
    assert q.acquire("other").status == "empty"
    q.complete_task(b.lease, submission_id="s2", result_ref=_result(store, b.lease))
    assert q.acquire("other").status == "end_of_input"
    q.close()


def test_second_coordinator_is_told_who_holds_the_queue(store):
    q = _coord(store)
    with pytest.raises(UnsafeRecovery, match=r"served by host .* pid \d+ since"):
        _coord(store)
    with pytest.raises(UnsafeRecovery, match="served by"):
        _coord(store, recover=True)
    q.close()
    with pytest.raises(UnsafeRecovery, match="recover=True"):
        _coord(store)
    _coord(store, recover=True).close()


def test_recovery_revokes_leases_but_keeps_readers(store):
    q = _coord(store)
    inp = _input(store, "t")
    q.submit_tasks("r", [TaskSpec("t", input_ref=inp)])
    (a,) = q.acquire("w").assignments
    q.close()  # the coordinator dies with a lease out
    q2 = _coord(store, recover=True)
    assert q2.epoch_number == int(a.lease.coordinator_epoch) + 1
    with pytest.raises(StaleAttempt, match="epoch"):
        q2.complete_task(a.lease, submission_id="s", result_ref=_result(store, a.lease))
    assert q2.task_status("t")["state"] == "pending"
    assert q2.outstanding_reads() == (a.lease,)
    (b,) = q2.acquire("w2").assignments
    q2.complete_task(b.lease, submission_id="s", result_ref=_result(store, b.lease))
    assert len(q2.outstanding_reads()) == 1  # the old reader still protected (D5)
    assert q2.retire_worker("w") == [] and q2.outstanding_reads() == ()
    q2.close()


def test_paused_old_coordinator_can_never_acknowledge(store):
    old = _coord(store)
    old.submit_tasks("r", [TaskSpec("t1"), TaskSpec("t2")])
    (a,) = old.acquire("w").assignments
    out = _result(store, a.lease)
    # a new coordinator takes over while the old one still holds the lock (paused)
    new = _coord(store, recover=True, takeover=True)
    with pytest.raises(Fenced):
        old.heartbeat([a.lease])  # no lease renewals from a fenced coordinator either
    with pytest.raises((IndeterminateCommit, Fenced)):
        old.complete_task(a.lease, submission_id="s", result_ref=out)
    with pytest.raises(Fenced):
        old.acquire("w")
    with pytest.raises(Fenced):
        old.submit_tasks("r9", [TaskSpec("t9")])
    assert new.read_commits().commits == ()
    assert new.task_status("t1")["state"] == "pending"
    (b,) = new.acquire("w", task_ids=["t1"]).assignments
    new.complete_task(b.lease, submission_id="s", result_ref=_result(store, b.lease))
    old.close()
    new.close()
    again = _coord(store, recover=True)
    assert [c.task_id for c in again.read_commits().commits] == ["t1"]
    again.close()


def test_bad_input_leaves_the_journal_unchanged(store, tmp_path):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t")])
    (a,) = q.acquire("w").assignments
    before = q.metrics()["journal"]
    with pytest.raises(ValueError, match="unknown task id 'nope'"):
        q.cancel_task("nope")
    with pytest.raises(StaleAttempt, match="lease of queue 'other'"):  # as straw-queue
        q.complete_task(a.lease.__class__(**{**a.lease.to_dict(), "queue_id": "other"}),
                        submission_id="s", result_ref=_result(store, a.lease))
    wrong = store.publish([Record("out", b"x", metadata={"task_id": "t", "attempt_id": "7"})],
                          submission_id="wrong")
    with pytest.raises(InvalidReference, match="names task 't' attempt '7'"):
        q.complete_task(a.lease, submission_id="s", result_ref=wrong)
    unnamed = store.publish([Record("out", b"x")], submission_id="unnamed")
    with pytest.raises(InvalidReference, match="must name the lease"):
        q.complete_task(a.lease, submission_id="s", result_ref=unnamed)
    with pytest.raises(TypeError):
        q.submit_tasks("r3", ["not a spec"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="64-bit"):
        q.submit_tasks("r3", [TaskSpec("big", priority=2**70)])
    assert q.metrics()["journal"] == before
    assert q.task_status("t")["state"] == "leased"
    q.close()


def test_open_consumer_with_takeover_fences_the_previous_owner(store):
    # a trainer in another process died holding the consumer: no recovery revoked its
    # token, so its successor takes the consumer over and the old token is fenced
    q = _coord(store)
    mine = store.publish([Record("state", b"s")], submission_id="state")
    old = q.open_consumer("training", exclusive_owner="the job's one trainer")
    with pytest.raises(UnsafeRecovery, match="takeover=True"):
        q.open_consumer("training", exclusive_owner="the job's one trainer")
    new = q.open_consumer("training", exclusive_owner="the job's one trainer",
                          takeover=True)
    assert new != old
    with pytest.raises(StaleAttempt, match="taken over"):
        q.save_consumer_state("training", token=old, request_id="old", state_ref=mine,
                              fetch_cursor=0, processed_cursor=0)
    with pytest.raises(StaleAttempt):
        q.close_consumer("training", old)
    q.save_consumer_state("training", token=new, request_id="new", state_ref=mine,
                          fetch_cursor=0, processed_cursor=0)
    with pytest.raises(TypeError, match="takeover must be a bool"):
        q.open_consumer("training", exclusive_owner="x", takeover="yes")  # type: ignore[arg-type]
    q.close_consumer("training", new)
    # a takeover of a consumer nobody holds is a plain open
    q.close_consumer("training", q.open_consumer("training", exclusive_owner="y",
                                                 takeover=True))
    q.close()


def test_consumer_tokens_cursors_and_retirement(store):
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(3)])
    receipts = []
    for _ in range(3):
        receipts.append(_run_one(store, q))
        store.seal()  # one pack per result
    store.release_publications([r.result_ref for r in receipts])  # the queue owns them
    tok = q.open_consumer("training", exclusive_owner="the test")
    page = q.read_commits(0, 2)
    mine = store.publish([Record("state", b"s")], submission_id="state")
    ck = store.publish([Record("ck", json.dumps({
        "version": 1, "checkpoint_id": "ck", "consumer_state": dataclasses.asdict(mine),
        "batch_ids": [], "training_dependencies": []}).encode(), codec="json.v1")],
        submission_id="ck", dependencies=[mine])

    def save(token, request_id):  # type: ignore[no-untyped-def]
        return q.save_consumer_state("training", token=token, request_id=request_id,
                                     state_ref=mine, fetch_cursor=2, processed_cursor=2)

    save(tok, "s1")
    with pytest.raises(UnsafeRecovery, match="one owner at a time"):
        q.open_consumer("training", exclusive_owner="another")
    q.close_consumer("training", tok)
    tok2 = q.open_consumer("training", exclusive_owner="the next owner")
    with pytest.raises(StaleAttempt, match="not current"):
        save(tok, "s2")
    state = q.load_consumer_state("training")
    assert state is not None and state["processed_cursor"] == 2
    assert save(tok2, "s2") == state
    q.register_checkpoint("ck", ck, cursor=1)
    q.collect_garbage()
    # commit 0 retired (processed, below the checkpoint cursor 1); 1 kept by checkpoint
    # (fresh read sessions: a session's cached open file could still read a reclaimed pack)
    with store.read_session() as s, pytest.raises(InvalidReference):
        s.read(page.commits[0].result_ref)
    with store.read_session() as s:
        assert bytes(next(s.read(page.commits[1].result_ref)).payload) == b"answer"
    assert q.release_checkpoint("ck") is None
    q.collect_garbage()
    with store.read_session() as s:
        with pytest.raises(InvalidReference):
            s.read(page.commits[1].result_ref)
        assert bytes(next(s.read(receipts[2].result_ref)).payload) == b"answer"  # unprocessed
    q.close()


def test_queue_retains_inputs_before_journaling(store):
    q = _coord(store)
    inp = _input(store, "t")
    store.seal()
    q.submit_tasks("r", [TaskSpec("t", input_ref=inp)])
    store.release_publications([inp])  # the producer lets go: the queue owns it (D2)
    q.collect_garbage()
    assert bytes(next(store.read(inp)).payload) == b"t"
    q.close()
    q = _coord(store, recover=True)
    q.collect_garbage()
    assert bytes(next(store.read(inp)).payload) == b"t"
    (a,) = q.acquire("w").assignments
    q.complete_task(a.lease, submission_id="s", result_ref=_result(store, a.lease))
    q.collect_garbage()
    # The reader's own completion ended its protection (ReadLease), so this collection
    # reclaimed the input; it used to read back only through a descriptor the store's
    # session still held on the unlinked pack (issue 11, finding 7).
    with pytest.raises(InvalidReference):
        store.read(inp)
    q.release_task_reads(list(q.outstanding_reads()))
    store.seal()
    q.collect_garbage()
    with store.read_session() as s, pytest.raises(InvalidReference):
        s.read(inp)
    q.close()


def test_snapshot_then_recovery_matches(store):
    q = _coord(store, snapshot_every=50)
    q.submit_tasks("r", [TaskSpec(f"t{i:03d}", priority=i % 3) for i in range(120)])
    for _ in range(70):
        _run_one(store, q)
    before = (q.pending_tasks(), [c.task_id for c in q.read_commits(0, 1000).commits])
    q.close()
    q = _coord(store, recover=True)
    after = (q.pending_tasks(), [c.task_id for c in q.read_commits(0, 1000).commits])
    assert before == after
    assert q.metrics()["recovery"]  # recovery reports what it read
    q.close()


# --- damaged and missing journal data fails closed (issue 11, finding 3) --------------------

def _journal_files(q: Coordinator) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(q.journal_dir).iterdir())}


def _last_transaction_frame(path: Path) -> int:
    """Offset of the body middle of the last frame holding transactions."""
    data = path.read_bytes()
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    f = [f for f in scan.frames if f.body[0] in (journal.REC_TXN, journal.REC_BATCH)][-1]
    return f.offset + framing.HEADER_SIZE + f.header.body_length // 2


def test_flipped_byte_in_last_acknowledged_completion_fails_closed(store):
    """Before: the flipped completion was cut off as a torn tail and the receipt was lost
    (only the recovery's ``torn_tail`` statistic showed it)."""
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t0"), TaskSpec("t1")])
    _run_one(store, q)
    receipt = _run_one(store, q)
    q.close()
    seg = sorted(Path(q.journal_dir).glob("j-*.log"))[-1]
    data = bytearray(seg.read_bytes())
    at = _last_transaction_frame(seg)
    data[at] ^= 0x20
    seg.write_bytes(bytes(data))
    before = _journal_files(q)
    for _ in range(2):
        with pytest.raises(CorruptData, match=rf"{seg.name}: damaged frame at offset \d+ .*"
                           "later write group.*changed nothing.*restore"):
            _coord(store, recover=True)
        assert _journal_files(q) == before  # nothing cut, nothing deleted
    data[at] ^= 0x20  # the operator restores the byte: everything is back
    seg.write_bytes(bytes(data))
    q = _coord(store, recover=True)
    assert q.lookup_submission(receipt.submission_id) == receipt
    q.close()


def test_lost_segments_of_the_newest_epoch_fail_closed(store):
    """Before: with every segment of epoch 2 deleted, recovery silently served epoch 1's
    state (the completion made in epoch 2 was gone)."""
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t0")])
    q.close()
    q = _coord(store, recover=True)
    assert q.epoch == "2" and q.epoch_number == 2
    _run_one(store, q)
    q.close()
    for seg in Path(q.journal_dir).glob("j-000002-*.log"):
        seg.unlink()
    with pytest.raises(CorruptData, match="epoch 2 started.*lost"):
        _coord(store, recover=True)


def test_newer_epoch_that_never_started_is_not_a_lost_epoch(store):
    """An epoch file whose coordinator died before its start record was durable (never
    marked started) is ignored, as before."""
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t0")])
    receipt = _run_one(store, q)
    q.close()
    (Path(q.epochs_dir) / "e-000002").write_bytes(b"")
    q = _coord(store, recover=True)
    assert q.epoch == "3" and q.lookup_submission(receipt.submission_id) == receipt
    q.close()
    assert (Path(q.epochs_dir) / "e-000003").read_bytes() == b"started\n"


# --- complete_and_acquire (straw's addition: the commit and the next grant in one step) ---
def test_complete_and_acquire_is_one_durable_step(store):
    """The commit and the next task's grant are one journal frame with one sync: the pair
    costs what complete_task alone costs, where complete_task + acquire cost two."""
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"t{i}", priority=-i) for i in range(4)])
    (a,) = q.acquire("w0").assignments
    m0 = dict(q.journal._m)
    receipt, got = q.complete_and_acquire(a.lease, submission_id="done-t0",
                                          result_ref=_result(store, a.lease))
    m1 = dict(q.journal._m)
    assert receipt.task_id == "t0" and receipt.position == 0
    assert got.status == "acquired"
    (b,) = got.assignments
    assert b.lease.task_id == "t1" and b.lease.worker_id == "w0"  # scheduling order
    assert m1["fsyncs"] - m0["fsyncs"] == 1 and m1["frames"] - m0["frames"] == 1
    assert m1["commits"] - m0["commits"] == 2  # two transactions in that one frame
    # the plain pair, for comparison: two syncs
    q.complete_task(b.lease, submission_id="done-t1", result_ref=_result(store, b.lease))
    q.acquire("w0")
    m2 = dict(q.journal._m)
    assert m2["fsyncs"] - m1["fsyncs"] == 2
    assert q.task_status("t0")["state"] == "completed"
    assert q.task_status("t1")["state"] == "completed"
    assert q.task_status("t2")["state"] == "leased"


def test_complete_and_acquire_refused_completion_leases_nothing(store, clock):
    """A completion complete_task would refuse (stale, expired) is refused the same way and
    grants nothing; with nothing pending the acquire part says so."""
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t0"), TaskSpec("t1")])
    (a,) = q.acquire("w0").assignments
    out = _result(store, a.lease)
    clock.advance(11)
    with pytest.raises(LeaseExpired):
        q.complete_and_acquire(a.lease, submission_id="done-t0", result_ref=out)
    assert q.task_status("t1")["state"] == "pending"
    with pytest.raises(InvalidReference):
        q.complete_and_acquire(a.lease, submission_id="done-t0", result_ref=out,
                               result_digest="0" * 32)
    (b,) = q.acquire("w1").assignments  # the expiry is journaled; t1 first in FIFO
    (c,) = q.acquire("w1").assignments
    assert {b.lease.task_id, c.lease.task_id} == {"t0", "t1"}
    receipt, got = q.complete_and_acquire(b.lease, submission_id="done-b",
                                          result_ref=_result(store, b.lease, "b"))
    assert got.status == "empty" and got.assignments == ()
    # a retry of the accepted submission: the original receipt, then a plain acquire
    again, got2 = q.complete_and_acquire(b.lease, submission_id="done-b",
                                         result_ref=_result(store, b.lease, "b"))
    assert again == receipt and got2.status == "empty"


def test_complete_and_acquire_survives_recovery_as_one(store):
    """After a restart the frame replays whole: the task completed, the next one's grant
    remembered (its attempt counted) and revoked by the new epoch."""
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec("t0", priority=1), TaskSpec("t1")])
    (a,) = q.acquire("w0").assignments
    receipt, got = q.complete_and_acquire(a.lease, submission_id="done-t0",
                                          result_ref=_result(store, a.lease))
    (b,) = got.assignments
    q.close()
    q2 = _coord(store, recover=True)
    assert q2.lookup_submission("done-t0") == receipt
    st = q2.task_status("t1")
    assert st["state"] == "pending" and st["generation"] == 1
    with pytest.raises(StaleAttempt):
        q2.complete_task(b.lease, submission_id="done-t1",
                         result_ref=_result(store, b.lease))
    (c,) = q2.acquire("w0").assignments
    assert c.lease.task_id == "t1" and c.lease.generation == 2


def test_pending_tasks_drops_the_stale_entries_of_tasks_leased_by_id(store):
    # tasks leased by id (the builder's collections: one per batch) leave their entries
    # deep in the pending heap; pending_tasks (each checkpoint save calls it) checks every
    # entry, so it drops those: its next call costs the pending tasks, not the history
    q = _coord(store)
    q.submit_tasks("r", [TaskSpec(f"c{i}", control=True, estimated_records=0)
                         for i in range(20)] +
                   [TaskSpec("p0"), TaskSpec("p1")])
    for i in range(20):
        (a,) = q.acquire("w", task_ids=[f"c{i}"], control=True).assignments
        q.complete_task(a.lease, submission_id=f"s{i}", result_ref=_result(store, a.lease))
    assert [t.task_id for t in q.pending_tasks()] == ["p0", "p1"]
    assert sum(len(h) for h in q.state.lanes.values()) == 2  # only the pending ones left
    q.submit_tasks("r2", [TaskSpec("c20", control=True, estimated_records=0)])
    assert sorted(t.task_id for t in q.pending_tasks()) == ["c20", "p0", "p1"]
    (a,) = q.acquire("w", control=True).assignments  # the lane still works as a heap
    assert a.lease.task_id == "c20"
    q.close()
