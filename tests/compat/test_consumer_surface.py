"""straw-queue 0.1.6's consumer, batch and checkpoint calls, driven the way vime's batch
builder drives them (plan before the conversion hooks, ready after every rank's data is
published, the training consumer's progress record releasing finished batches), served
by our one coordinator: shapes, retention, rewinds and recovery."""

from __future__ import annotations

import dataclasses
import inspect
import json
import multiprocessing
import os
from pathlib import Path

import pytest

from straw import (
    CorruptData,
    IdempotencyConflict,
    InvalidReference,
    Record,
    SharedFilesystemStore,
    StaleAttempt,
    UnsafeRecovery,
)
from straw.coordinator import Coordinator
from straw.protocol import TaskSpec
from straw.refs import RecordSetRef

RUN = "vime"
TRAINER = "job owns one BatchBuilder"


def open_store(root: Path) -> SharedFilesystemStore:
    return SharedFilesystemStore(str(root), RUN, reserve_bytes=0, visibility_retries=1)


def open_queue(store: SharedFilesystemStore, *, recover: bool = False) -> Coordinator:
    # straw-queue's constructor takes exclusive_owner= (the task half of issue 12 adds it)
    kw = {"recover": recover}
    if "exclusive_owner" in inspect.signature(Coordinator).parameters:
        kw["exclusive_owner"] = "the test owns its only coordinator"
    return Coordinator(store, **kw)  # type: ignore[arg-type]


def payload(store: SharedFilesystemStore, ref: RecordSetRef) -> bytes:
    return bytes(next(iter(store.read(ref))).payload)


def blob(store: SharedFilesystemStore, name: str, data: bytes | None = None, *,
         deps: tuple[RecordSetRef, ...] = ()) -> RecordSetRef:
    ref = store.publish([Record(name, data if data is not None else name.encode())],
                        submission_id=name, dependencies=deps)
    store.seal()  # one pack per publication: retention is then visible file by file
    return ref


def json_record(store: SharedFilesystemStore, name: str, value: object, *,
                deps: tuple[RecordSetRef, ...] = ()) -> RecordSetRef:
    ref = store.publish([Record(name, json.dumps(value).encode(), codec="json.v1")],
                        submission_id=name, dependencies=deps)
    store.seal()
    return ref


def progress(store: SharedFilesystemStore, name: str, positions=(), finished=()):  # type: ignore[no-untyped-def]
    return json_record(store, name, {"version": 1, "processed_positions": list(positions),
                                     "finished_batches": list(finished)})


def checkpoint(store, name, checkpoint_id, state, model, batch_ids=()):  # type: ignore[no-untyped-def]
    return json_record(store, name, {
        "version": 1, "checkpoint_id": checkpoint_id,
        "consumer_state": dataclasses.asdict(state), "batch_ids": list(batch_ids),
        "training_dependencies": [dataclasses.asdict(model)]}, deps=(state, model))


def result_metadata(lease) -> dict:  # type: ignore[no-untyped-def]
    # straw-queue's results name the attempt by attempt_id; ours by attempt number
    if hasattr(lease, "attempt_id"):
        return {"task_id": lease.task_id, "attempt_id": lease.attempt_id}
    return {"task_id": lease.task_id, "attempt": lease.attempt}


def accept(store: SharedFilesystemStore, q: Coordinator, n: int) -> list:  # type: ignore[type-arg]
    """``n`` groups generated and accepted (one pack each, owned by the queue only)."""
    q.submit_tasks("prompts", [TaskSpec(f"prompt:{i}") for i in range(n)])
    receipts = []
    for _ in range(n):
        (a,) = q.acquire("rollout-0").assignments
        ref = store.publish([Record("group", f"group {a.lease.task_id}".encode(),
                                    metadata=result_metadata(a.lease))],
                            submission_id=f"group:{a.lease.task_id}")
        store.seal()
        receipts.append(q.complete_task(a.lease, submission_id=f"result:{a.lease.task_id}",
                                        result_ref=ref, result_digest=ref.digest))
    store.release_publications([r.result_ref for r in receipts])
    return receipts


def exists(root: Path, ref: RecordSetRef) -> bool:
    return (root / ref.path).exists()


def save(q, token, request_id, state, fetch, processed, progress_ref=None):  # type: ignore[no-untyped-def]
    return q.save_consumer_state("training", token=token, request_id=request_id,
                                 state_ref=state, fetch_cursor=fetch,
                                 processed_cursor=processed, progress_ref=progress_ref)


def test_batch_builder_plans_before_hooks_and_finished_batches_release_ready_data(tmp_path):
    store = open_store(tmp_path)
    q = open_queue(store)
    receipts = accept(store, q, 4)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    assert isinstance(token, str) and len(token) == 64

    # begin(): the plan is durable before any conversion hook runs
    plan = json_record(store, "plan", {"version": 1, "input_positions": [0, 1]})
    planned = q.plan_batch("training", token=token, batch_id="batch:c0", input_positions=[0, 1],
                           plan_ref=plan)
    assert planned == {"batch_id": "batch:c0", "consumer_id": "training",
                       "input_positions": [0, 1], "plan_ref": dataclasses.asdict(plan),
                       "ready": False, "finished": False}
    assert q.plan_batch("training", token=token, batch_id="batch:c0", input_positions=[0, 1],
                        plan_ref=plan) == planned  # a retry after a lost reply
    with pytest.raises(IdempotencyConflict):
        q.plan_batch("training", token=token, batch_id="batch:c0", input_positions=[0],
                     plan_ref=plan)
    with pytest.raises(InvalidReference, match="not an accepted commit"):
        q.plan_batch("training", token=token, batch_id="batch:c9", input_positions=[9],
                     plan_ref=plan)
    assert q.get_batch("batch:c9") is None

    # every rank's dict is published, then the ready payload and the consumer state
    rank = blob(store, "rank-0")
    ready = json_record(store, "ready", {"version": 1, "batch_id": "batch:c0", "ranks": 1},
                        deps=(rank,))
    store.release_publications([rank])
    state = json_record(store, "state-1", {"version": 1, "processed_cursor": 2})
    reply = q.batch_ready("training", token=token, batch_id="batch:c0", ready_ref=ready,
                          state_ref=state, fetch_cursor=2, processed_cursor=2)
    assert reply == {"batch_id": "batch:c0", "ready_ref": dataclasses.asdict(ready),
                     "state": {"version": 1, "fetch_cursor": 2, "processed_cursor": 2,
                               "state_ref": dataclasses.asdict(state)}}
    assert q.batch_ready("training", token=token, batch_id="batch:c0", ready_ref=ready,
                         state_ref=state, fetch_cursor=2, processed_cursor=2) == reply
    with pytest.raises(IdempotencyConflict, match="another ready reference"):
        q.batch_ready("training", token=token, batch_id="batch:c0", ready_ref=plan,
                      state_ref=state, fetch_cursor=2, processed_cursor=2)
    assert q.get_batch("batch:c0")["ready_ref"] == dataclasses.asdict(ready)
    assert q.metrics()["usage_with_reservations"]["ready_bytes"] > 0
    store.release_publications([plan, ready, state])

    # processed results go; the unfinished batch keeps its plan and ready data
    q.collect_garbage()
    assert not exists(tmp_path, receipts[0].result_ref)
    assert not exists(tmp_path, receipts[1].result_ref)
    for ref in (plan, ready, rank, receipts[2].result_ref):
        assert exists(tmp_path, ref)
    with pytest.raises(InvalidReference, match="released"):
        q.read_commits(0, 1)

    # training_completed -> finish_batch: all ranks read it; position 3 also processed
    done = progress(store, "progress-1", positions=[3], finished=["batch:c0"])
    saved = save(q, token, "finish:batch:c0", state, 4, 2, done)
    assert saved["progress_ref"] == dataclasses.asdict(done)
    assert q.get_batch("batch:c0")["finished"] is True
    assert q.metrics()["usage_with_reservations"]["ready_bytes"] == 0
    store.release_publications([done])
    gc = q.collect_garbage()
    for key in ("reclaimed_files", "reclaimed_bytes", "tombstones", "owners",
                "retained_packs", "open_packs"):
        assert isinstance(gc[key], int)
    assert gc["reclaimed_files"] == 4  # plan, ready, the rank it depends on, result 3
    for ref in (plan, ready, rank, receipts[3].result_ref):
        assert not exists(tmp_path, ref)
    assert payload(store, receipts[2].result_ref) == b"group prompt:2"
    assert [c.task_id for c in q.read_commits(2, 1).commits] == ["prompt:2"]
    with pytest.raises(InvalidReference, match="commit 3 was released"):
        q.read_commits(2, 2)
    # the consumer's own state and progress stay
    assert payload(store, state) and payload(store, done)
    q.close()
    store.close()


def test_checkpoint_keeps_its_consumer_state_dependencies_and_named_batches(tmp_path):
    store = open_store(tmp_path)
    q = open_queue(store)
    accept(store, q, 2)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    plan, ready = blob(store, "plan"), blob(store, "ready")
    state, model = blob(store, "state"), blob(store, "model-step-1")
    q.plan_batch("training", token=token, batch_id="b", input_positions=[0, 1], plan_ref=plan)
    q.batch_ready("training", token=token, batch_id="b", ready_ref=ready, state_ref=state,
                  fetch_cursor=2, processed_cursor=2)
    ck = checkpoint(store, "ck-1", "step-1", state, model, batch_ids=["b"])
    registered = q.register_checkpoint("step-1", ck)
    assert registered["checkpoint_id"] == "step-1" and registered["batch_ids"] == ["b"]
    assert registered["checkpoint_ref"] == dataclasses.asdict(ck)
    assert q.register_checkpoint("step-1", ck) == registered
    assert q.checkpoints == {"step-1": registered}
    rejected = [checkpoint(store, "ck-1b", "step-1", state, model),
                checkpoint(store, "ck-2", "other-id", state, model),
                checkpoint(store, "ck-4", "step-4", state, model, batch_ids=["nope"])]
    with pytest.raises(IdempotencyConflict):
        q.register_checkpoint("step-1", rejected[0])
    with pytest.raises(InvalidReference, match="checkpoint_id"):
        q.register_checkpoint("step-2", rejected[1])
    undeclared = json_record(store, "ck-3", {
        "version": 1, "checkpoint_id": "step-3", "consumer_state": dataclasses.asdict(state),
        "batch_ids": [], "training_dependencies": []})
    with pytest.raises(InvalidReference, match="dependency"):
        q.register_checkpoint("step-3", undeclared)
    with pytest.raises(InvalidReference, match="not a ready batch"):
        q.register_checkpoint("step-4", rejected[2])
    # the queue keeps them now; the batch finishes, the model moves on
    store.release_publications([plan, ready, state, model, ck, undeclared, *rejected])
    save(q, token, "finished", blob(store, "state-2"), 2, 2,
         progress(store, "p", finished=["b"]))
    q.collect_garbage()
    for ref in (plan, ready, state, model, ck):
        assert exists(tmp_path, ref)
    assert q.release_checkpoint("step-1") is None
    assert q.release_checkpoint("step-1") is None  # unknown: nothing to do
    assert q.checkpoints == {}
    q.collect_garbage()
    for ref in (plan, ready, state, model, ck):
        assert not exists(tmp_path, ref)
    q.close()
    store.close()


def test_consumer_ownership_request_ids_and_progress_checks(tmp_path):
    store = open_store(tmp_path)
    q = open_queue(store)
    accept(store, q, 3)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    with pytest.raises(UnsafeRecovery, match="one owner at a time"):
        q.open_consumer("training", exclusive_owner="a second builder")
    assert q.load_consumer_state("training") is None
    state = blob(store, "state")
    first = save(q, token, "s1", state, 2, 1)
    assert first == {"version": 1, "fetch_cursor": 2, "processed_cursor": 1,
                     "state_ref": dataclasses.asdict(state)}
    assert save(q, token, "s1", state, 2, 1) == first  # lost reply: same answer
    with pytest.raises(IdempotencyConflict):
        save(q, token, "s1", state, 3, 1)
    with pytest.raises(ValueError, match="cannot pass fetch_cursor"):
        save(q, token, "s2", state, 1, 2)
    with pytest.raises(ValueError, match="past the commit log"):
        save(q, token, "s3", state, 9, 1)
    with pytest.raises(InvalidReference, match="state_ref is required"):
        save(q, token, "s4", None, 2, 1)
    with pytest.raises(StaleAttempt):
        save(q, "0" * 64, "s5", state, 2, 1)
    for bad, match in [
        (progress(store, "p-low", positions=[0]), "outside the fetched"),
        (progress(store, "p-high", positions=[3]), "outside the fetched"),
        (progress(store, "p-batch", finished=["unknown"]), "not a ready batch"),
        (json_record(store, "p-schema", {"processed_positions": []}), "version 1"),
        (json_record(store, "p-dup", {"version": 1, "processed_positions": [2, 2]}), "twice"),
        (blob(store, "p-bytes", b"[]"), "json.v1"),
    ]:
        with pytest.raises(InvalidReference, match=match):
            save(q, token, f"bad-{bad.digest}", state, 3, 1, bad)
    assert q.load_consumer_state("training") == first  # nothing changed
    assert q.consumers == {"training": first}
    # another consumer's cursors release nothing; closing keeps saved state
    other = q.open_consumer("fully_async", exclusive_owner="one scheduler")
    q.save_consumer_state("fully_async", token=other, request_id="o", state_ref=state,
                          fetch_cursor=3, processed_cursor=3)
    q.close_consumer("fully_async", other)
    with pytest.raises(StaleAttempt):
        q.close_consumer("fully_async", other)
    assert q.load_consumer_state("fully_async")["processed_cursor"] == 3
    q.collect_garbage()
    assert [c.position for c in q.read_commits(1, 5).commits] == [1, 2]
    q.close()
    store.close()


def test_rewind_retains_released_history_again_or_changes_nothing(tmp_path):
    store = open_store(tmp_path)
    q = open_queue(store)
    receipts = accept(store, q, 3)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    state = blob(store, "state")
    # an application replay owner keeps results 1, 2 (a checkpoint would, via dependencies)
    store.retain("training-replay:step-1", [r.result_ref for r in receipts[1:]])
    save(q, token, "advanced", state, 3, 3)
    q.collect_garbage()
    assert not exists(tmp_path, receipts[0].result_ref)
    journal_before = q.journal.path.read_bytes()
    # result 0 is gone: restoring cursor 0 fails and changes nothing
    with pytest.raises((InvalidReference, CorruptData)):
        save(q, token, "restore-0", state, 3, 0)
    assert q.journal.path.read_bytes() == journal_before
    assert q.load_consumer_state("training")["processed_cursor"] == 3
    # results 1, 2 are still retained by the application: the queue retains them again
    save(q, token, "restore-1", state, 3, 1)
    assert [c.position for c in q.read_commits(1, 2).commits] == [1, 2]
    store.release("training-replay:step-1")
    q.collect_garbage()
    assert payload(store, receipts[1].result_ref) == b"group prompt:1"
    q.close()
    store.close()


def test_rewind_checks_every_byte_before_retaining_again(tmp_path):
    store = open_store(tmp_path)
    q = open_queue(store)
    receipts = accept(store, q, 1)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    state = blob(store, "state")
    store.retain("replay", [receipts[0].result_ref])
    save(q, token, "advanced", state, 1, 1)
    q.collect_garbage()
    ref = receipts[0].result_ref
    path = tmp_path / ref.path
    data = bytearray(path.read_bytes())
    at = ref.offset + ref.size - 40  # inside the payload, past the frame header
    data[at] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptData):
        save(q, token, "restore", state, 1, 0)
    assert q.load_consumer_state("training")["processed_cursor"] == 1
    data[at] ^= 1
    path.write_bytes(bytes(data))
    save(q, token, "restore-again", state, 1, 0)
    assert q.read_commits(0, 1).commits[0].position == 0
    q.close()
    store.close()


def _train_then_die(root: str, report: str) -> None:
    store = open_store(Path(root))
    q = open_queue(store)
    receipts = accept(store, q, 3)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    state = json_record(store, "state-step-1", {"cursor": 1})
    model = blob(store, "model-step-1")
    ck = checkpoint(store, "ck-step-1", "step-1", state, model)
    q.register_checkpoint("step-1", ck)
    # results after the checkpoint: kept by a replay owner until a newer checkpoint
    store.retain("training-replay:step-1", [r.result_ref for r in receipts[1:]])
    later = json_record(store, "state-step-3", {"cursor": 3})
    save(q, token, "step-3", later, 3, 3, progress(store, "progress-3"))
    q.collect_garbage()
    Path(report).write_text(json.dumps({"state": dataclasses.asdict(state),
                                        "token": token,
                                        "receipts": [r.submission_id for r in receipts]}))
    os._exit(9)  # killed: no close, no flush of anything not yet durable


def test_recovery_after_a_kill_restores_consumer_state_and_rewinds_to_a_checkpoint(tmp_path):
    report = tmp_path / "report.json"
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_train_then_die, args=(str(tmp_path / "pool"), str(report)))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    saved = json.loads(report.read_text())
    store = open_store(tmp_path / "pool")
    q = open_queue(store, recover=True)
    assert isinstance(q.recovery_seconds, float)
    latest = q.load_consumer_state("training")
    assert latest["processed_cursor"] == 3 and latest["fetch_cursor"] == 3
    assert "progress_ref" in latest
    assert list(q.checkpoints) == ["step-1"]
    # the dead builder's token died with its coordinator; a new builder opens it
    with pytest.raises(StaleAttempt):
        save(q, saved["token"], "late", RecordSetRef.from_dict(saved["state"]), 3, 3)
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    # restore the checkpoint's consumer view (cursor 1): results 1, 2 retained again
    ck_state = RecordSetRef.from_dict(q.checkpoints["step-1"]["consumer_state"])
    assert json.loads(payload(store, ck_state)) == {"cursor": 1}
    save(q, token, "restore-step-1", ck_state, 1, 1)
    store.release("training-replay:step-1")
    q.collect_garbage()
    replay = q.read_commits(1, 10).commits
    assert [c.submission_id for c in replay] == saved["receipts"][1:]
    assert [payload(store, c.result_ref) for c in replay] == [b"group prompt:1",
                                                              b"group prompt:2"]
    q.close()
    again = open_queue(store, recover=True)
    assert again.load_consumer_state("training")["processed_cursor"] == 1
    assert len(again.read_commits(1, 10).commits) == 2
    again.close()
    store.close()


def test_state_views_drain_snapshot_and_metrics(tmp_path):
    store = open_store(tmp_path)
    q = open_queue(store)
    accept(store, q, 2)
    q.submit_tasks("more", [TaskSpec("prompt:late")])
    (a,) = q.acquire("rollout-1").assignments
    token = q.open_consumer("training", exclusive_owner=TRAINER)
    save(q, token, "s", blob(store, "state"), 2, 1)
    assert q.journal.path.is_file()
    assert q.sealed is False and q.storage_failed is False and q.draining is False
    assert set(q.tasks) == {"prompt:0", "prompt:1", "prompt:late"}
    assert [c["submission_id"] for c in q.commits] == ["result:prompt:0", "result:prompt:1"]
    assert set(q.submissions) == {"result:prompt:0", "result:prompt:1"}
    assert json.loads(next(iter(q.requests))) == ["submit", "prompts"]
    assert q.producers == {} and q.batches == {} and q.counters == {}
    m = q.metrics()
    assert m["tasks"] == {"completed": 2, "leased": 1}
    assert len(m["complete_seconds"]) == 2 and m["journal_bytes"] > 0
    usage = m["usage_with_reservations"]
    assert usage["accepted_unprocessed"]["records"] == 1  # position 1 only
    assert usage["inflight"] == 1 and usage["ready_bytes"] == 0
    assert m["process_cpu_seconds"] > 0 and m["process_rss_high_water_kib"] > 0
    snap = q.snapshot()
    assert isinstance(snap, RecordSetRef)
    (rec,) = list(store.read(snap))
    body = json.loads(bytes(rec.payload))
    assert body["commits"] == 2 and body["consumers"] == q.consumers
    assert q.drain() == 1
    assert q.draining is True
    assert q.acquire("rollout-2").status == "draining"
    with pytest.raises(ValueError, match="draining"):
        q.submit_tasks("after-drain", [TaskSpec("x")])
    q.complete_task(a.lease, submission_id="result:late",
                    result_ref=store.publish([Record("g", b"late",
                                                     metadata=result_metadata(a.lease))],
                                             submission_id="late"))
    q.close()
    recovered = open_queue(store, recover=True)
    assert recovered.draining is False  # drain belongs to one coordinator
    recovered.close()
    store.close()
