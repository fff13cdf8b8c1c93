"""The task half of the queue as a straw-queue 0.1.6 user drives it.

Written the way vime's rollout controller uses straw-queue (see
``../shared/reference/vime-integration.md`` section 1): a producer cursor committed with
its tasks, workers taking ``prompt:`` tasks, a heartbeat thread reading per-lease outcomes,
continuations yielded with priorities and scheduling keys, control tasks only for
``acquire(control=True)``, lost replies retried under their request ids, and a coordinator
killed and recovered with ``recover=True``.  Only straw-queue's names and shapes are used
here (``straw``, ``straw.protocol``, ``straw.errors``).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading
from dataclasses import asdict

import pytest

from straw import Coordinator, Limits, Record, RecordSetRef, SharedFilesystemStore, TaskSpec
from straw.errors import (
    IdempotencyConflict,
    InvalidReference,
    LeaseExpired,
    ResourceLimitExceeded,
    StaleAttempt,
    UnsafeRecovery,
)
from straw.protocol import (
    AcquireResult,
    Assignment,
    CommitPage,
    CommitReceipt,
    Lease,
    decode,
    digest,
    encode,
)

OWNER = "this test process owns the only coordinator"


class Clock:
    """straw-queue's clock: a callable returning seconds."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run") as s:
        yield s


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def queue(store, clock):
    with Coordinator(store, queue_id="rollout", namespace=True, exclusive_owner=OWNER,
                     lease_seconds=30, clock=clock) as q:
        yield q


def payload(store, ref) -> bytes:
    return bytes(list(store.read(ref))[0].payload)


def publish_result(store, lease, data=b"out", sid=None):
    return store.publish(
        [Record("group", data, metadata={"task_id": lease.task_id, "attempt_id": lease.attempt_id})],
        submission_id=sid or f"group:{lease.attempt_id}")


def complete(queue, store, lease, data=b"out"):
    ref = publish_result(store, lease, data)
    return queue.complete_task(lease, submission_id=f"result:{lease.attempt_id}", result_ref=ref,
                               result_digest=ref.digest)


def test_protocol_values_have_straw_queue_shapes():
    assert [f.name for f in dataclasses.fields(TaskSpec)] == [
        "task_id", "input_ref", "metadata", "allow_empty", "max_attempts", "estimated_records",
        "estimated_bytes", "estimated_tokens", "control", "priority", "scheduling_key"]
    spec = TaskSpec("t")
    assert (spec.metadata, spec.allow_empty, spec.max_attempts, spec.estimated_records,
            spec.control, spec.priority, spec.scheduling_key) == ({}, False, 3, 1, False, 0, 0)
    assert [f.name for f in dataclasses.fields(Lease)] == [
        "run_id", "queue_id", "task_id", "attempt_id", "generation", "coordinator_epoch",
        "token", "worker_id"]
    assert [f.name for f in dataclasses.fields(CommitReceipt)] == [
        "commit_id", "task_id", "submission_id", "digest", "position", "result_ref"]
    assert [f.name for f in dataclasses.fields(CommitPage)] == ["commits", "cursor", "end_of_input"]
    assert [f.name for f in dataclasses.fields(Limits)][:10] == [
        "pending_tasks", "inflight_tasks", "control_tasks", "accepted_records", "accepted_bytes",
        "accepted_tokens", "ready_bytes", "max_result_bytes", "max_result_tokens", "metadata_bytes"]
    with pytest.raises(ValueError):
        Limits(pending_tasks=0)
    # canonical JSON: key order and spacing do not change a digest; NaN is not JSON
    assert encode({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'.encode()
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})
    assert len(digest([])) == 64
    assert decode(encode({"x": [1, 2]})) == {"x": [1, 2]}
    with pytest.raises(ValueError):
        encode(float("nan"))
    with pytest.raises(RuntimeError):  # CorruptData, a RuntimeError as in straw-queue
        decode(b"NaN")


def test_producer_cursor_commits_with_its_tasks(store, queue):
    """vime's take(): acquire prompt: tasks; when empty, refill from the committed cursor
    and submit tasks plus the advanced cursor in one transaction."""
    assert queue.producer_state("dataset") is None
    assert queue.acquire("reader-0", 4, task_prefix="prompt:").status == "empty"
    cursor = {"version": 1, "cursor": {"sample_index": 0}}
    for _ in range(2):
        start = (queue.producer_state("dataset") or cursor)["cursor"]["sample_index"]
        groups = [store.publish([Record(f"s{start + i}", f"prompt {start + i}".encode(),
                                        metadata={"task_id": f"prompt:{start + i}"})],
                                submission_id=f"input:prompt:{start + i}") for i in range(3)]
        tasks = [TaskSpec(f"prompt:{start + i}", input_ref=ref,
                          metadata={"group_index": start + i}, estimated_tokens=ref.records)
                 for i, ref in enumerate(groups)]
        state = {"version": 1, "cursor": {"sample_index": start + 3}}
        ids = queue.submit_tasks(f"dataset:{start}", tasks, producer_id="dataset",
                                 producer_state=state)
        assert ids == [t.task_id for t in tasks]
        # a lost reply: the identical retry answers the same, nothing is submitted twice
        assert queue.submit_tasks(f"dataset:{start}", tasks, producer_id="dataset",
                                  producer_state=state) == ids
        assert queue.producer_state("dataset") == state
        got = queue.acquire("reader-0", 3, task_prefix="prompt:")
        assert isinstance(got, AcquireResult) and got.status == "acquired"
        assert all(isinstance(a, Assignment) for a in got.assignments)
        assert [a.task.task_id for a in got.assignments] == ids
        assert [payload(store, a.task.input_ref) for a in got.assignments] == [
            f"prompt {start + i}".encode() for i in range(3)]
        for a in got.assignments:
            complete(queue, store, a.lease)
    assert queue.producer_state("dataset")["cursor"]["sample_index"] == 6
    # the same request id with other content is refused; so is a task id used before
    with pytest.raises(IdempotencyConflict):
        queue.submit_tasks("dataset:0", [TaskSpec("prompt:99")])
    with pytest.raises(IdempotencyConflict):
        queue.submit_tasks("dataset:again", [TaskSpec("prompt:0")])
    assert queue.submit_tasks("nothing", []) == []


def test_leases_receipts_and_commit_pages(store, queue):
    queue.submit_tasks("r", [TaskSpec("prompt:0"), TaskSpec("prompt:1")])
    (a,) = queue.acquire("w", 1).assignments
    lease = a.lease
    assert lease.generation == 1 and lease.worker_id == "w" and lease.queue_id == "rollout"
    assert lease.run_id == "run" and isinstance(lease.coordinator_epoch, str)
    assert isinstance(lease.attempt_id, str) and isinstance(lease.token, str)
    # vime keeps asdict(lease) in its samples and rebuilds the Lease from it
    assert Lease(**asdict(lease)) == lease
    ref = publish_result(store, lease)
    receipt = queue.complete_task(lease, submission_id=f"result:{lease.attempt_id}",
                                  result_ref=ref, result_digest=ref.digest)
    assert (receipt.task_id, receipt.position, receipt.digest, receipt.result_ref) == (
        "prompt:0", 0, ref.digest, ref)
    assert CommitReceipt.from_dict(asdict(receipt)) == receipt
    # the same group again: the identical receipt, one commit
    assert queue.complete_task(lease, submission_id=f"result:{lease.attempt_id}", result_ref=ref,
                               result_digest=ref.digest) == receipt
    other = publish_result(store, lease, b"changed", sid="group:changed")
    with pytest.raises(IdempotencyConflict):
        queue.complete_task(lease, submission_id=f"result:{lease.attempt_id}", result_ref=other,
                            result_digest=other.digest)
    assert queue.lookup_submission(f"result:{lease.attempt_id}") == receipt
    assert queue.lookup_submission("result:unknown") is None
    page = queue.read_commits()
    assert page == CommitPage((receipt,), 1, False)
    assert queue.read_commits(1).commits == ()
    with pytest.raises(ValueError):
        queue.read_commits(2)
    status = queue.task_status("prompt:0")
    assert status["state"] == "completed" and status["generation"] == 1
    assert status["lease"] == asdict(lease) and status["spec"]["task_id"] == "prompt:0"
    assert queue.task_status("nope") is None
    (b,) = queue.acquire("w").assignments
    complete(queue, store, b.lease)
    assert queue.seal_input("producer-finished") == "sealed"
    assert queue.seal_input("producer-finished") == "sealed"
    assert queue.read_commits().end_of_input is True
    assert queue.acquire("w").status == "end_of_input"


def test_results_must_belong_to_their_attempt(store, queue):
    queue.submit_tasks("r", [TaskSpec("a"), TaskSpec("b", allow_empty=True)])
    la, lb = (x.lease for x in queue.acquire("w", 2).assignments)
    empty = store.publish([], submission_id="empty")
    with pytest.raises(InvalidReference):
        queue.complete_task(la, submission_id="x", result_ref=empty, result_digest=empty.digest)
    # allow_empty: the task may finish with an empty result
    assert queue.complete_task(lb, submission_id="y", result_ref=empty,
                               result_digest=empty.digest).result_ref.records == 0
    foreign = store.publish([Record("r", b"1", metadata={"task_id": "a", "attempt_id": "nope"})],
                            submission_id="foreign")
    with pytest.raises(InvalidReference):
        queue.complete_task(la, submission_id="x", result_ref=foreign, result_digest=foreign.digest)
    good = publish_result(store, la)
    with pytest.raises(InvalidReference):
        queue.complete_task(la, submission_id="x", result_ref=good, result_digest="0" * 32)
    assert queue.complete_task(la, submission_id="x", result_ref=good,
                               result_digest=good.digest).position == 1


def test_heartbeat_thread_outcomes(store, queue, clock):
    """vime's heartbeat thread: ``extended`` keeps a lease, ``StaleAttempt`` drops it, any
    other outcome is a lost lease."""
    queue.submit_tasks("r", [TaskSpec(f"prompt:{i}") for i in range(3)])
    leases = [a.lease for a in queue.acquire("reader", 3).assignments]
    complete(queue, store, leases[0])
    outcomes: list[list[str]] = []
    beat = threading.Thread(target=lambda: outcomes.append(queue.heartbeat(leases)))
    beat.start()
    beat.join()
    assert outcomes == [["StaleAttempt", "extended", "extended"]]
    clock.t += 31  # past the deadline of every lease
    assert queue.heartbeat(leases[1:]) == ["LeaseExpired", "LeaseExpired"]
    with pytest.raises(LeaseExpired):
        complete(queue, store, leases[1])
    again = {a.task.task_id: a.lease for a in queue.acquire("other", 3).assignments}
    assert set(again) == {"prompt:1", "prompt:2"}
    newer = again["prompt:1"]
    assert newer.generation == leases[1].generation + 1 and newer.attempt_id != leases[1].attempt_id
    assert queue.heartbeat([leases[1], newer]) == ["StaleAttempt", "extended"]
    with pytest.raises(StaleAttempt):
        complete(queue, store, leases[1])
    # LeaseExpired is a StaleAttempt in straw (in straw-queue both are QueueErrors)
    assert issubclass(LeaseExpired, StaleAttempt) and issubclass(StaleAttempt, RuntimeError)


def test_yielded_continuations_order_by_priority_key_then_fifo(store, queue):
    """vime's add_samples: partial groups return with stage priorities (2 ready, 1 partial,
    0 fresh) and the oldest weight version as scheduling key, in one request whose id is
    ``"return:" + digest(updates)``; a lost reply is retried."""
    queue.submit_tasks("r", [TaskSpec(f"prompt:{i}") for i in range(6)]
                       + [TaskSpec("prompt:fresh")])
    leases = [a.lease for a in queue.acquire("w", 6, task_prefix="prompt:").assignments]
    versions = [8, 2, 2, None, 9, 1]
    stage = [1, 1, 1, 1, 2, 1]
    updates = []
    for lease, version, prio in zip(leases, versions, stage, strict=True):
        cont = store.publish([Record("partial", f"{lease.task_id} prefix".encode())],
                             submission_id=f"continuation:{lease.attempt_id}")
        updates.append({"lease": lease, "input_ref": cont, "priority": prio,
                        "scheduling_key": 2**63 - 1 if version is None else version,
                        "metadata": {"stage": "partial", "returned": True}})
    request_id = "return:" + digest([{**u, "lease": asdict(u["lease"]),
                                      "input_ref": asdict(u["input_ref"])} for u in updates])
    assert queue.yield_tasks(updates, request_id=request_id) == "pending"
    assert queue.yield_tasks(updates, request_id=request_id) == "pending"  # lost reply
    pending = queue.pending_tasks(task_prefix="prompt:")
    assert [s.task_id for s in pending] == ["prompt:4", "prompt:5", "prompt:1", "prompt:2",
                                            "prompt:0", "prompt:3", "prompt:fresh"]
    assert [s.task_id for s in queue.pending_tasks(min_priority=2)] == ["prompt:4"]
    assert all(s.metadata == {"stage": "partial", "returned": True} for s in pending[:6])
    status = queue.task_status("prompt:1")
    assert status["failures"] == 0 and status["state"] == "pending"
    got = queue.acquire("w2", 7).assignments
    assert [a.task.task_id for a in got] == [s.task_id for s in pending]
    assert payload(store, got[0].task.input_ref) == b"prompt:4 prefix"
    # a stale lease refuses the whole batch; the same id with other content is a conflict
    with pytest.raises(StaleAttempt):
        queue.yield_tasks([{"lease": leases[0], "input_ref": None}], request_id="stale")
    with pytest.raises(IdempotencyConflict):
        queue.yield_tasks([{"lease": got[0].lease, "input_ref": None}], request_id=request_id)
    # yield_task and save_task_progress: one lease; progress keeps the lease
    lease = got[1].lease
    prefix = store.publish([Record("partial", b"longer prefix")], submission_id="longer")
    assert queue.save_task_progress(lease, request_id="p1", input_ref=prefix) == "saved"
    assert queue.save_task_progress(lease, request_id="p1", input_ref=prefix) == "saved"
    assert queue.task_status(lease.task_id)["state"] == "leased"
    assert queue.heartbeat([lease]) == ["extended"]
    assert queue.yield_task(lease, request_id="y1", input_ref=prefix) == "pending"
    assert queue.yield_task(lease, request_id="y1", input_ref=prefix) == "pending"
    (back,) = queue.acquire("w3", task_ids=[lease.task_id, lease.task_id]).assignments
    assert back.task.input_ref == prefix and back.lease.generation == lease.generation + 1


def test_control_tasks_only_for_control_acquire(store, queue):
    queue.submit_tasks("prompts", [TaskSpec("prompt:0")])
    queue.submit_tasks("collect", [TaskSpec("collection:b:0", allow_empty=True, control=True,
                                            estimated_records=0)])
    with pytest.raises(ValueError):  # control tasks estimate no production
        queue.submit_tasks("bad", [TaskSpec("collection:b:1", control=True)])
    got = queue.acquire("reader", 5)
    assert [a.task.task_id for a in got.assignments] == ["prompt:0"]
    assert queue.acquire("reader", 5, task_ids=["collection:b:0"]).status == "empty"
    (ctl,) = queue.acquire("manager", control=True).assignments
    assert ctl.task.task_id == "collection:b:0" and ctl.task.control is True
    empty = store.publish([], submission_id=f"collection:{ctl.lease.attempt_id}")
    receipt = queue.complete_task(ctl.lease, submission_id=f"collection:{ctl.lease.attempt_id}",
                                  result_ref=empty, result_digest=empty.digest)
    assert queue.read_commits().commits == (receipt,)
    # the control lane has its own bound (Limits.control_tasks): straw enforces it
    assert queue.limits.control_tasks >= 1


def test_lost_replies_are_answered_by_request_id(store, queue):
    queue.submit_tasks("r", [TaskSpec(f"t{i}", max_attempts=2) for i in range(5)])
    leases = {a.task.task_id: a.lease for a in queue.acquire("w", 5).assignments}
    assert queue.fail_task(leases["t0"], request_id="reject:0",
                           failure={"category": "Filtered", "reason": "low"},
                           retryable=False) == "failed"
    assert queue.fail_task(leases["t0"], request_id="reject:0",
                           failure={"category": "Filtered", "reason": "low"},
                           retryable=False) == "failed"
    with pytest.raises(IdempotencyConflict):
        queue.fail_task(leases["t1"], request_id="reject:0", failure="other")
    assert queue.task_status("t0")["failure"] == {"category": "Filtered", "reason": "low"}
    assert queue.fail_task(leases["t1"], request_id="f1", failure="boom") == "pending"
    assert queue.fail_task(leases["t1"], request_id="f1", failure="boom") == "pending"
    assert queue.task_status("t1")["failures"] == 1  # the retry spent nothing more
    assert queue.release_tasks([leases["t2"], leases["t1"]], request_id="close") == [
        "released", "StaleAttempt"]
    assert queue.release_tasks([leases["t2"], leases["t1"]], request_id="close") == [
        "released", "StaleAttempt"]
    assert queue.task_status("t2")["failures"] == 0
    assert queue.cancel_task("t3", request_id="abandon:t3") == "cancelled"
    assert queue.cancel_task("t3", request_id="abandon:t3") == "cancelled"
    with pytest.raises(ValueError):
        queue.cancel_task("t3", request_id="abandon:again")  # terminal
    with pytest.raises(IdempotencyConflict):
        queue.cancel_task("t4", request_id="abandon:t3")


def test_readers_outlive_leases_until_released(store, queue, clock):
    src = store.publish([Record("in", b"x")], submission_id="in")
    queue.submit_tasks("r", [TaskSpec("a", input_ref=src), TaskSpec("b", input_ref=src),
                             TaskSpec("c", input_ref=src, max_attempts=1)])
    la, lb, lc = (x.lease for x in queue.acquire("w", 3).assignments)
    assert set(queue.outstanding_reads()) == {la, lb, lc}
    complete(queue, store, la)  # its own completion ends its read
    assert queue.cancel_task("b", request_id="cancel:b") == "cancelled"
    assert set(queue.outstanding_reads()) == {lb, lc}  # cancellation proves nothing
    assert queue.release_task_reads([lb]) is None
    assert queue.outstanding_reads() == (lc,)
    ref = publish_result(store, lc)
    # the reader is confirmed gone: its lease is revoked, its results are handed back
    receipts = queue.retire_worker("w")
    assert [r["task_id"] for r in receipts] == ["a"]
    assert CommitReceipt.from_dict(receipts[0]) == queue.lookup_submission(
        f"result:{la.attempt_id}")
    assert queue.outstanding_reads() == ()
    status = queue.task_status("c")
    assert status["state"] == "failed" and status["failure"] == {"category": "WorkerLost"}
    with pytest.raises(StaleAttempt):
        queue.complete_task(lc, submission_id="late", result_ref=ref, result_digest=ref.digest)
    assert queue.retire_worker("nobody") == []


def test_real_limits_where_a_field_maps(store, clock):
    limits = Limits(pending_tasks=2, inflight_tasks=1, metadata_bytes=64, max_result_bytes=4)
    with Coordinator(store, queue_id="bounded", exclusive_owner=OWNER, limits=limits,
                     clock=clock, enforce_limits=True) as q:
        with pytest.raises(ResourceLimitExceeded):
            q.submit_tasks("big", [TaskSpec(f"t{i}") for i in range(3)])
        with pytest.raises(ResourceLimitExceeded):
            q.submit_tasks("meta", [TaskSpec("m", metadata={"x": "y" * 100})])
        q.submit_tasks("ok", [TaskSpec("t0"), TaskSpec("t1")])
        (a,) = q.acquire("w", 2).assignments  # one in flight
        assert q.acquire("w").status == "backpressured"
        large = publish_result(store, a.lease, b"12345", sid="large")
        with pytest.raises(ResourceLimitExceeded):
            q.complete_task(a.lease, submission_id="big", result_ref=large)
        complete(q, store, a.lease, b"1234")
        assert q.acquire("w").status == "acquired"


def test_namespaces_and_exclusive_owner(store):
    a = Coordinator(store, queue_id="stage", namespace=True, exclusive_owner="owner-a")
    b = Coordinator(store, queue_id="stage", exclusive_owner="owner-b")  # namespace=False
    try:
        a.submit_tasks("a-1", [TaskSpec("task-a")])
        assert b.pending_tasks() == [] and [s.task_id for s in a.pending_tasks()] == ["task-a"]
        with pytest.raises(UnsafeRecovery, match="owner-a"):
            Coordinator(store, queue_id="stage", namespace=True, exclusive_owner="x",
                        recover=True)
    finally:
        a.close()
        b.close()


def _serve_and_die(root: str, ready) -> None:  # type: ignore[no-untyped-def]
    store = SharedFilesystemStore(root, "run", writer_id="killed")
    q = Coordinator(store, queue_id="rollout", exclusive_owner="the child, until killed")
    src = store.publish([Record("in", b"prompt")], submission_id="in")
    q.submit_tasks("dataset:0", [TaskSpec("prompt:0", input_ref=src), TaskSpec("prompt:1")],
                   producer_id="dataset", producer_state={"cursor": 2})
    first, second = (a.lease for a in q.acquire("w", 2).assignments)
    ref = store.publish([Record("g", b"done", metadata={"task_id": first.task_id,
                                                      "attempt_id": first.attempt_id})],
                        submission_id=f"group:{first.attempt_id}")
    q.complete_task(first, submission_id=f"result:{first.attempt_id}", result_ref=ref,
                    result_digest=ref.digest)
    ready.send((asdict(first), asdict(second), asdict(ref), asdict(src)))
    os.kill(os.getpid(), signal.SIGKILL)


def test_recover_after_a_kill(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_and_die, args=(str(tmp_path), child))
    proc.start()
    first, second, ref, src = parent.recv()
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    first, second = Lease(**first), Lease(**second)
    with SharedFilesystemStore(str(tmp_path), "run") as store:
        with Coordinator(store, queue_id="rollout", recover=True,
                         exclusive_owner="the killed coordinator is gone") as q:
            receipt = q.lookup_submission(f"result:{first.attempt_id}")
            assert receipt is not None and receipt.position == 0
            assert asdict(receipt.result_ref) == ref
            assert q.producer_state("dataset") == {"cursor": 2}
            assert q.heartbeat([second]) == ["StaleAttempt"]  # revoked by the new epoch
            (again,) = q.acquire("w2").assignments
            assert again.task.task_id == "prompt:1"
            assert again.lease.generation == second.generation + 1
            assert again.lease.attempt_id != second.attempt_id
            assert again.lease.coordinator_epoch != second.coordinator_epoch
            # the revoked attempt spent one unit of its budget (straw-queue's rule)
            assert q.task_status("prompt:1")["failures"] == 1
            # the producer's lost reply, retried after the recovery: the same task ids
            tasks = [TaskSpec("prompt:0", input_ref=RecordSetRef.from_dict(src)),
                     TaskSpec("prompt:1")]
            assert q.submit_tasks("dataset:0", tasks, producer_id="dataset",
                                  producer_state={"cursor": 2}) == ["prompt:0", "prompt:1"]


def test_sealed_input_with_leased_work_answers_empty_until_nothing_is_leased(store, queue):
    """straw-queue: ``end_of_input`` only once input is sealed and nothing is pending or
    leased; ``draining`` only after ``drain()``; otherwise ``empty`` (a leased task may
    still come back to pending)."""
    queue.submit_tasks("r", [TaskSpec("prompt:0"), TaskSpec("prompt:1")])
    (a,) = queue.acquire("w", 1).assignments
    queue.seal_input("sealed")
    (b,) = queue.acquire("w", 1).assignments  # pending work is still handed out
    assert queue.acquire("other").status == "empty"
    assert queue.release_tasks([b.lease], request_id="back") == ["released"]
    (b,) = queue.acquire("other").assignments  # ... and so is work that came back
    complete(queue, store, a.lease)
    assert queue.acquire("other", task_prefix="nothing:").status == "empty"
    complete(queue, store, b.lease)
    assert queue.acquire("other").status == "end_of_input"
    queue.drain()
    assert queue.acquire("other").status == "draining"


def test_a_lease_naming_an_unknown_task_is_a_stale_attempt(store, queue):
    """straw-queue answers a lease whose task the queue does not know (an edited task id)
    as any lease that is not current: per lease where the call reports per lease, raised
    elsewhere; the real lease stays current."""
    inp = store.publish([Record("prompt", b"p")], submission_id="prompt")
    queue.submit_tasks("r", [TaskSpec("prompt:0", input_ref=inp)])
    (a,) = queue.acquire("w", 1).assignments
    ghost = dataclasses.replace(a.lease, task_id="never-submitted")
    assert queue.heartbeat([ghost, a.lease]) == ["StaleAttempt", "extended"]
    result = publish_result(store, ghost, sid="ghost-result")
    raising = [
        lambda: queue.complete_task(ghost, submission_id="c", result_ref=result,
                                    result_digest=result.digest),
        lambda: queue.fail_task(ghost, request_id="f", failure="x"),
        lambda: queue.yield_task(ghost, request_id="y", input_ref=inp),
        lambda: queue.yield_tasks([{"lease": ghost, "input_ref": inp}], request_id="ys"),
        lambda: queue.save_task_progress(ghost, request_id="p", input_ref=inp),
        lambda: queue.save_task_progress_many([{"lease": ghost, "input_ref": inp}],
                                              request_id="pm"),
        # its attempt has a reader, whose lease this is not: nothing is released
        lambda: queue.release_task_reads([ghost]),
    ]
    for call in raising:
        with pytest.raises(StaleAttempt, match="never-submitted"):
            call()
    assert queue.release_tasks([ghost], request_id="rel") == ["StaleAttempt"]
    assert queue.outstanding_reads() == (a.lease,)
    assert queue.heartbeat([a.lease]) == ["extended"]
    complete(queue, store, a.lease)


def test_release_task_reads_of_an_attempt_without_a_reader_releases_nothing(store, queue):
    """straw-queue: a lease whose attempt has no outstanding reader (an edited attempt id,
    or released already) is no error and releases nothing; only the reader's own lease
    ends its protection."""
    inp = store.publish([Record("prompt", b"p")], submission_id="prompt")
    queue.submit_tasks("r", [TaskSpec("prompt:0", input_ref=inp)])
    (a,) = queue.acquire("w", 1).assignments
    assert queue.release_task_reads([dataclasses.replace(a.lease, attempt_id="zz")]) is None
    assert queue.outstanding_reads() == (a.lease,)
    with pytest.raises(StaleAttempt):  # its attempt, another token: not its lease
        queue.release_task_reads([dataclasses.replace(a.lease, token="0" * 64)])
    assert queue.outstanding_reads() == (a.lease,)
    assert queue.release_task_reads([a.lease]) is None
    assert queue.outstanding_reads() == ()
    assert queue.release_task_reads([a.lease]) is None  # released already: nothing


def test_the_epoch_is_the_str_its_leases_carry_and_a_recovery_moves_it_on(tmp_path):
    root = str(tmp_path / "pool")
    with SharedFilesystemStore(root, "epochs") as store:
        q = Coordinator(store, queue_id="work", exclusive_owner="first")
        q.submit_tasks("r", [TaskSpec("a")])
        lease = q.acquire("w").assignments[0].lease
        assert isinstance(q.epoch, str) and lease.coordinator_epoch == q.epoch
        first = q.epoch_number
        q.close()
        q2 = Coordinator(store, queue_id="work", exclusive_owner="second", recover=True)
        assert q2.epoch != lease.coordinator_epoch and q2.epoch_number == first + 1
        assert q2.acquire("w").assignments[0].lease.coordinator_epoch == q2.epoch
        q2.close()
