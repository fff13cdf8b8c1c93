"""straw-queue 0.1.6's documented flows, rewritten by us, run unchanged against straw.

Each test follows one of straw-queue's README / docs/USAGE.md / examples flows call for
call (the same public names, keyword arguments and return shapes a straw-queue user
writes), with our own data.  What differs on purpose is listed in docs/COMPATIBILITY.md;
pack files are ``*.pack`` in both, though their layout and format are ours.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from straw import (
    Coordinator,
    Publication,
    Record,
    RecordSetRef,
    SharedFilesystemStore,
    TaskSpec,
)
from straw.protocol import Lease, encode

torch = pytest.importorskip("torch")


def _packs(root: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(root).rglob("*.pack"))


def test_quickstart_publish_retain_collect(tmp_path):
    # README quick start: a checkpoint owner keeps a publication past its staging.
    with SharedFilesystemStore(str(tmp_path), "quickstart", online_gc=True) as store:
        ref = store.publish([Record("greeting", b"good morning")], submission_id="greet-1")
        store.retain("application:ckpt-a", [ref])
        store.release_publications([ref])
        assert next(store.read(ref)).payload == b"good morning"
        store.seal()
        assert store.collect_garbage()["reclaimed_files"] == 0
        store.release("application:ckpt-a")
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_records_codecs_one_pack_and_reader_pin(tmp_path):
    # examples/records.py: bytes, JSON, a custom codec in one packed write; a pin holds data.
    root = str(tmp_path)
    with SharedFilesystemStore(root, "records", online_gc=True,
                               codecs=("bytes.v1", "json.v1", "notes.v1")) as store:
        refs = store.publish_many(
            [
                Publication((Record("text", "grüße, 世界".encode()),)),
                Publication((Record("config", json.dumps({"beams": 4}).encode(), "json.v1"),)),
                Publication((Record("notes", b"opaque application bytes", "notes.v1"),)),
            ],
            submission_id="three-at-once",
        )
        assert len(refs) == 3 and all(isinstance(r, RecordSetRef) for r in refs)
        assert next(store.read(refs[0])).payload.decode() == "grüße, 世界"
        assert json.loads(next(store.read(refs[1])).payload) == {"beams": 4}
        assert next(store.read(refs[2])).codec == "notes.v1"
        assert len(_packs(root)) == 1

        store.retain("application:ckpt", refs)
        store.release_publications(refs)
        store.seal()
        with store.pin(refs):
            store.release("application:ckpt")
            assert store.collect_garbage()["reclaimed_files"] == 0
            assert next(store.read(refs[0])).payload.decode() == "grüße, 世界"
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_references_round_trip_through_asdict(tmp_path):
    # USAGE "Records and custom data": refs serialise with asdict, restore with from_dict.
    with SharedFilesystemStore(str(tmp_path), "refs") as store:
        first = store.publish([Record("a", b"1", tokens=3)], submission_id="first")
        second = store.publish([Record("b", b"22", tokens=4)], submission_id="second",
                               dependencies=[first])
        value = json.loads(json.dumps(dataclasses.asdict(second)))
        restored = RecordSetRef.from_dict(value)
        assert restored == second
        assert restored.manifest.segment.path == second.manifest.segment.path
        assert (restored.records, restored.payload_bytes, restored.tokens) == (1, 3, 7)
        members = store.validate(restored)
        assert [store.read_record(m).payload for m in members] == [b"22"]
        assert [dict(r.metadata) for r in store.read(restored)] == [{}]


def test_tensors_two_queues_share_and_copy_on_write(tmp_path):
    # examples/tensors.py: checked row reads, two namespaced queues sharing one tensor
    # publication, tensor-level copy-on-write, reclamation when the last owner goes.
    from straw.tensor import publish_tensors, release_tensor_publications

    with SharedFilesystemStore(str(tmp_path), "tensors", codecs=("tensor.v1",),
                               online_gc=True) as store:
        table, weights = publish_tensors(
            store,
            {"table": np.arange(32, dtype=np.float32).reshape(8, 4), "weights": torch.ones(8)},
            submission_id="source",
        )
        assert table[3:5].shape == (2, 4)
        shared, ordinal = table.share(store, submission_id="share-table")
        store.seal()
        patched = table.updated(store, torch.full((1, 4), -1.0), rows=slice(0, 1),
                                submission_id="patched")
        assert table.load()[0].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert patched.load()[0].tolist() == [-1.0] * 4
        store.seal()

        with Coordinator(store, queue_id="left", namespace=True, exclusive_owner="test") as a, \
                Coordinator(store, queue_id="right", namespace=True,
                            exclusive_owner="test") as b:
            a.submit_tasks("in-left", [TaskSpec("l", input_ref=shared)])
            b.submit_tasks("in-right", [TaskSpec("r", input_ref=shared)])
            a.cancel_task("l", request_id="done-left")
            assert a.collect_garbage()["reclaimed_files"] == 0
            assert weights.load().tolist() == [1.0] * 8
            b.cancel_task("r", request_id="done-right")
            assert b.collect_garbage()["reclaimed_files"] == 1
        assert patched[0:1].tolist() == [[-1.0] * 4]
        release_tensor_publications(store, [patched])
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_restore_tensor_descriptors_from_a_shared_publication(tmp_path):
    # USAGE "Tensors": restore several descriptors of one publication at once.
    from straw.tensor import TensorRef, publish_tensors

    with SharedFilesystemStore(str(tmp_path), "restore",
                               codecs=("bytes.v1", "json.v1", "tensor.v1")) as store:
        feats, mask = publish_tensors(store, {
            "feats": np.arange(12, dtype=np.int32).reshape(3, 4),
            "mask": torch.tensor([True, False, True]),
        }, submission_id="feats-1")
        dependency, ordinal = feats.share(store, submission_id="share-feats")
        restored = TensorRef.from_record_set_many(store, dependency)
        assert restored[ordinal].shape == feats.shape
        with store.read_session() as reader:
            again = TensorRef.from_record_set_many(store, dependency, reader=reader)
            assert again[1].load(reader=reader).tolist() == [True, False, True]
        # (straw-queue returns torch; ours returns what was published: NumPy here, see
        # docs/COMPATIBILITY.md)
        assert np.array_equal(TensorRef.from_record_set(store, dependency, 0).load(),
                              np.arange(12, dtype=np.int32).reshape(3, 4))


def test_work_queue_accept_replay_acknowledge_reclaim(tmp_path):
    # examples/work_queue.py: submit, acquire, complete (retry = same receipt), replay,
    # acknowledge through the "training" consumer, checkpoint-aware reclamation.
    with SharedFilesystemStore(str(tmp_path), "work", online_gc=True) as store, \
            Coordinator(store, queue_id="jobs", exclusive_owner="this test") as queue:
        source = store.publish([Record("word", b"straw")], submission_id="word-1")
        queue.submit_tasks("submit-words", [TaskSpec("reverse-1", input_ref=source)])
        assignment = queue.acquire("worker-a").assignments[0]
        lease = assignment.lease
        payload = next(store.read(assignment.task.input_ref)).payload[::-1]
        result = store.publish(
            [Record("reversed", payload,
                    metadata={"task_id": lease.task_id, "attempt_id": lease.attempt_id})],
            submission_id="reversed-1",
        )
        receipt = queue.complete_task(lease, submission_id="done-1", result_ref=result,
                                      result_digest=result.digest)
        assert queue.complete_task(lease, submission_id="done-1", result_ref=result,
                                   result_digest=result.digest) == receipt
        queue.seal_input("no-more-words")
        page = queue.read_commits()
        assert page == queue.read_commits()
        assert page.end_of_input and page.commits[0].task_id == "reverse-1"
        assert next(store.read(page.commits[0].result_ref)).payload == b"warts"

        store.retain("application:ckpt", [result])
        store.seal()
        state = store.publish([Record("state", encode({"version": 1}), "json.v1")],
                              submission_id="state-1")
        token = queue.open_consumer("training", exclusive_owner="every reader finished")
        queue.save_consumer_state("training", token=token, request_id="ack-1",
                                  state_ref=state, fetch_cursor=page.cursor,
                                  processed_cursor=page.cursor)
        assert queue.collect_garbage()["reclaimed_files"] == 0
        store.release("application:ckpt")
        assert queue.collect_garbage()["reclaimed_files"] == 1
        assert next(store.read(state)).codec == "json.v1"


def test_scheduling_order_and_continuations(tmp_path):
    # USAGE "Persistent task scheduling": priority desc, scheduling_key asc, FIFO; a
    # yield_tasks batch returns leased work at the tail of its key's FIFO.
    with SharedFilesystemStore(str(tmp_path), "sched") as store, \
            Coordinator(store, exclusive_owner="this test") as queue:
        queue.submit_tasks("batch-1", [
            TaskSpec("p:low", priority=0, scheduling_key=5),
            TaskSpec("p:high", priority=2, scheduling_key=9),
            TaskSpec("p:mid-a", priority=1, scheduling_key=3),
            TaskSpec("p:mid-b", priority=1, scheduling_key=3),
            TaskSpec("p:mid-old", priority=1, scheduling_key=1),
        ])
        order = [t.task_id for t in queue.pending_tasks()]
        assert order == ["p:high", "p:mid-old", "p:mid-a", "p:mid-b", "p:low"]
        assert [t.task_id for t in queue.pending_tasks(min_priority=1)] == order[:4]

        got = queue.acquire("w", 2, task_ids=["p:mid-a", "p:mid-a", "p:low"])
        assert got.status == "acquired"
        assert [a.task.task_id for a in got.assignments] == ["p:mid-a", "p:low"]
        partial = store.publish([Record("prefix", b"tok tok")], submission_id="cont-1")
        updates = [{"lease": got.assignments[0].lease, "input_ref": partial,
                    "priority": 1, "scheduling_key": 3, "metadata": {"stage": "partial"}},
                   {"lease": got.assignments[1].lease, "input_ref": partial}]
        queue.yield_tasks(updates, request_id="return-1")
        queue.yield_tasks(updates, request_id="return-1")  # a lost reply, retried
        order = [t.task_id for t in queue.pending_tasks()]
        # a returned task joins the tail of its key's FIFO (mid-b, then mid-a; spec Q4)
        assert order == ["p:high", "p:mid-old", "p:mid-b", "p:mid-a", "p:low"]
        back = {t.task_id: t for t in queue.pending_tasks(task_prefix="p:mid-a")}
        assert back["p:mid-a"].input_ref == partial
        assert back["p:mid-a"].metadata == {"stage": "partial"}


def test_control_tasks_need_control_acquire(tmp_path):
    # USAGE / FORMAT: control tasks are handed out only to acquire(control=True).
    with SharedFilesystemStore(str(tmp_path), "control") as store, \
            Coordinator(store, exclusive_owner="this test") as queue:
        queue.submit_tasks("c-1", [TaskSpec("collect:1", allow_empty=True, control=True,
                                            estimated_records=0)])
        assert queue.acquire("gen", 4).assignments == ()
        got = queue.acquire("manager", 1, task_ids=["collect:1"], control=True)
        assert [a.task.task_id for a in got.assignments] == ["collect:1"]
        assert got.assignments[0].task.control is True


def test_producer_cursor_commits_with_its_tasks(tmp_path):
    # USAGE "What resumes after a restart": producer state rides the submit transaction.
    with SharedFilesystemStore(str(tmp_path), "producer") as store:
        with Coordinator(store, exclusive_owner="first") as queue:
            assert queue.producer_state("dataset") is None
            cursor = {"version": 1, "cursor": {"sample_offset": 4, "epoch_id": 0}}
            queue.submit_tasks("dataset:0", [TaskSpec(f"prompt:{i}") for i in range(2)],
                               producer_id="dataset", producer_state=cursor)
            assert queue.producer_state("dataset") == cursor
        with Coordinator(store, exclusive_owner="second", recover=True) as queue:
            assert queue.producer_state("dataset") == cursor
            assert sorted(t.task_id for t in queue.pending_tasks()) == ["prompt:0", "prompt:1"]


def test_publication_receipt_after_a_lost_reply(tmp_path):
    # USAGE "Recover a writer publication after a lost reply".
    root = str(tmp_path)
    writer = SharedFilesystemStore(root, "receipts")
    writer_id = writer.writer_id
    ref = writer.publish([Record("r", b"payload")], submission_id="pub-1")
    writer.close()
    with SharedFilesystemStore(root, "receipts") as peer:
        assert peer.publication_receipt(writer_id, api="publish", submission_id="pub-1") == [ref]
        assert peer.publication_receipt(writer_id, api="publish", submission_id="other") is None


def _serve_coordinator(root: str, pipe) -> None:
    from straw.rpc import serve

    queue = Coordinator(SharedFilesystemStore(root, "rpc-run"), exclusive_owner="test supervisor")
    serve(queue, ("127.0.0.1", 0), token="secret-token", ready=lambda a: pipe.send(a[1]))


def _rpc_worker(root: str, port: int, n: int) -> None:
    from straw.rpc import QueueClient

    client = QueueClient(f"http://127.0.0.1:{port}", token="secret-token")
    store = SharedFilesystemStore(root, "rpc-run")
    client.call("submit_tasks", request_id=f"producer-{n}",
                tasks=[TaskSpec(f"job-{n}-{i}") for i in range(3)])
    assignments = client.call("acquire", worker_id=f"w{n}", max_tasks=3)["assignments"]
    leases = [Lease(**a["lease"]) for a in assignments]
    refs = store.write_records(
        [Record(lease.task_id, f"out:{lease.task_id}".encode(),
                metadata={"task_id": lease.task_id, "attempt_id": lease.attempt_id})
         for lease in leases],
        submission_id=f"micro-{n}",
    )
    for lease, rref in zip(leases, refs, strict=True):
        result = store.record_set([rref], submission_id=lease.task_id)
        client.call("complete_task", lease=lease, submission_id=lease.task_id,
                    result_ref=result, result_digest=result.digest)
    store.close()


@pytest.mark.slow
def test_multiprocess_workers_over_rpc_then_recovery(tmp_path):
    # examples/multiprocess.py: a served coordinator, worker processes with their own
    # stores, the coordinator SIGKILLed, recovery and replay of every result.
    root = str(tmp_path / "run")
    os.makedirs(root)
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    owner = ctx.Process(target=_serve_coordinator, args=(root, sender))
    owner.start()
    workers = []
    try:
        assert receiver.poll(60), "the coordinator did not start"
        port = receiver.recv()
        workers = [ctx.Process(target=_rpc_worker, args=(root, port, n)) for n in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
            assert w.exitcode == 0
        owner.kill()
        owner.join(10)
        assert owner.exitcode is not None
        with SharedFilesystemStore(root, "rpc-run") as store, \
                Coordinator(store, exclusive_owner="old process joined", recover=True) as queue:
            queue.seal_input("producers-done")
            first = queue.read_commits()
            assert first == queue.read_commits()
            assert len(first.commits) == 9 and first.end_of_input
            for commit in first.commits:
                assert next(store.read(commit.result_ref)).payload == \
                    f"out:{commit.task_id}".encode()
    finally:
        for p in [*workers, owner]:
            if p.is_alive():
                p.kill()
            p.join(10)
        receiver.close()
        sender.close()


def test_errors_are_runtime_errors():
    # straw-queue callers catch RuntimeError around storage and queue calls.
    from straw import errors

    for name in ("CorruptData", "InvalidReference", "IdempotencyConflict", "StaleAttempt",
                 "LeaseExpired", "StorageUnavailable", "QuotaExceeded", "IndeterminateCommit",
                 "UnsafeRecovery", "ResourceLimitExceeded", "UnsupportedSchema", "WriterBusy",
                 "WriterFenced"):
        assert issubclass(getattr(errors, name), errors.QueueError), name
        assert issubclass(getattr(errors, name), RuntimeError), name
    assert issubclass(errors.QuotaExceeded, errors.StorageUnavailable)
    assert sys.modules["straw.errors"] is errors
