"""straw-queue calls whose error class, return value or idempotency rule a caller relies on:
a bad local dependency index, an unregistered codec, a completion retried with the same
records published elsewhere, ``journal.sequence``, the benchmark profile's read
amplification and payload rates."""

from __future__ import annotations

import argparse
import json

import pytest

from straw import Coordinator, Publication, Record, SharedFilesystemStore, TaskSpec
from straw.errors import IdempotencyConflict, InvalidReference, UnsupportedSchema


@pytest.fixture
def store(tmp_path):  # type: ignore[no-untyped-def]
    with SharedFilesystemStore(tmp_path, "calls") as s:
        yield s


@pytest.mark.parametrize("pubs", [
    [Publication([Record("a", b"x")], dependencies=(0,))],           # itself
    [Publication([Record("a", b"x")], dependencies=(3,))],           # past the end
    [Publication([Record("a", b"x")], dependencies=(-1,))],          # negative
    [Publication([Record("a", b"x")]),
     Publication([Record("b", b"y")], dependencies=(1,))],           # itself, not first
])
def test_local_dependency_out_of_order_is_invalid_reference(store, tmp_path, pubs):
    """straw-queue: InvalidReference("Local dependencies must precede publication");
    straw said ValueError before, so the class is both.  Nothing is written."""
    with pytest.raises(InvalidReference, match="Local dependencies must precede") as e:
        store.publish_many(pubs, submission_id="bad")
    assert isinstance(e.value, ValueError)
    assert "dependencies[0]" in str(e.value)  # names the field
    assert store.lookup_submission("bad") is None
    # a correct order is accepted by the same store
    refs = store.publish_many([Publication([Record("a", b"x")]),
                               Publication([Record("b", b"y")], dependencies=(0,))],
                              submission_id="good")
    assert [next(store.read(r)).payload for r in refs] == [b"x", b"y"]


def test_unregistered_codec_is_unsupported_schema(store):
    with pytest.raises(UnsupportedSchema, match="'custom.v1' is not registered") as e:
        store.publish([Record("r", b"x", codec="custom.v1")], submission_id="r")
    assert isinstance(e.value, ValueError)
    assert "codecs=('custom.v1',)" in str(e.value)  # says how to open the store
    assert store.lookup_submission("r") is None


def _result(store: SharedFilesystemStore, lease, sid: str, payload: bytes = b"out"):  # type: ignore[no-untyped-def]
    return store.publish([Record("out", payload, metadata={"task_id": lease.task_id,
                                                           "attempt_id": lease.attempt_id})],
                         submission_id=sid)


def test_completion_retry_with_the_same_records_elsewhere_is_the_same_receipt(tmp_path):
    """A retry after a lost reply that republished the same records (another submission,
    so another extent) is the original completion; it survives recovery.  Other records,
    or another claimed digest, are IdempotencyConflict; a claimed digest that is not the
    reference's on a new submission is InvalidReference."""
    store = SharedFilesystemStore(tmp_path, "calls")
    queue = Coordinator(store, exclusive_owner="test")
    queue.submit_tasks("r", [TaskSpec("a"), TaskSpec("b")])
    lease, lease_b = (a.lease for a in queue.acquire("w", 2).assignments)
    ref = _result(store, lease, "first")
    receipt = queue.complete_task(lease, submission_id="c", result_ref=ref,
                                  result_digest=ref.digest)
    again = _result(store, lease, "republished")
    assert again.manifest.segment != ref.manifest.segment and again.digest == ref.digest
    queue.close()
    restored = Coordinator(store, exclusive_owner="test", recover=True)
    assert restored.complete_task(lease, submission_id="c", result_ref=again,
                                  result_digest=again.digest) == receipt
    assert restored.complete_task(lease, submission_id="c", result_ref=again) == receipt
    assert len(restored.read_commits().commits) == 1
    other = _result(store, lease, "other", b"changed")
    with pytest.raises(IdempotencyConflict, match="'c'"):
        restored.complete_task(lease, submission_id="c", result_ref=other)
    with pytest.raises(IdempotencyConflict):
        restored.complete_task(lease, submission_id="c", result_ref=ref, result_digest="changed")
    (lease_b,) = (a.lease for a in restored.acquire("w", 1).assignments)
    out_b = _result(store, lease_b, "b")
    with pytest.raises(InvalidReference, match="differs from the reference's digest"):
        restored.complete_task(lease_b, submission_id="d", result_ref=out_b,
                               result_digest=ref.digest)
    assert len(restored.read_commits().commits) == 1
    restored.close()
    store.close()


def test_journal_sequence_counts_transactions_and_not_retries(tmp_path):
    store = SharedFilesystemStore(tmp_path, "calls")
    with Coordinator(store, exclusive_owner="test") as queue:
        before = queue.journal.sequence
        assert before == queue.journal.seq
        queue.submit_tasks("r", [TaskSpec("a")])
        assert queue.journal.sequence == before + 1
        queue.submit_tasks("r", [TaskSpec("a")])  # a retry journals nothing
        assert queue.journal.sequence == before + 1
    store.close()


@pytest.mark.parametrize("checked", [True, False])
def test_benchmark_profile_reports_read_amplification_and_payload_rates(tmp_path, checked):
    from straw.benchmark import profile
    mib = 1024**2
    writes = [{"op": "write", "time": t, "bytes": n * mib + 100, "host": "w", "seconds": 0.1,
               "records": [{"codec": "bytes.v1", "bytes": n * mib}]}
              for t, n in [(10.2, 2), (10.7, 4), (11.5, 1)]]
    read = {"op": "read_range", "time": 10.4, "bytes": 2 * mib, "host": "r", "seconds": 0.1}
    if checked:
        read["checked_bytes"] = 6 * mib
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "w.jsonl").write_text("\n".join(json.dumps(e) for e in writes))
    (trace / "r.jsonl").write_text(json.dumps(read))
    out = tmp_path / "profile.json"
    profile(argparse.Namespace(trace=str(trace), output=str(out)))
    got = json.loads(out.read_text())
    assert got["checked_read_amplification"] == (3 if checked else None)
    one = got["payload_completion_rates"][0]
    assert one["write_peak_mib_s"] == 6  # payload only: 2 + 4 MiB completed in second 10
    assert one["extent_write_peak_mib_s"] == 6 + 200 / mib  # whole extents
    assert one["checked_read_peak_mib_s"] == (6 if checked else None)


def _json(store: SharedFilesystemStore, sid: str, value: object, deps=()):  # type: ignore[no-untyped-def]
    return store.publish([Record(sid, json.dumps(value).encode(), "json.v1")],
                         submission_id=sid, dependencies=list(deps))


def test_ready_batch_named_by_a_checkpoint_is_no_longer_ready_bytes(tmp_path):
    """usage_with_reservations.ready_bytes counts ready batches that training has not
    finished and no registered checkpoint names (the checkpoint keeps those); releasing
    the checkpoint makes an unfinished batch count again.  Also after a recovery."""
    store = SharedFilesystemStore(tmp_path, "calls")
    q = Coordinator(store, exclusive_owner="test")
    q.submit_tasks("r", [TaskSpec("a")])
    (lease,) = (a.lease for a in q.acquire("w", 1).assignments)
    out = _result(store, lease, "out")
    q.complete_task(lease, submission_id="c", result_ref=out)
    token = q.open_consumer("training", exclusive_owner="trainer")
    state = _json(store, "state", {"version": 1})
    plan = _json(store, "plan", {"order": [0]})
    q.plan_batch("training", token=token, batch_id="b", input_positions=[0], plan_ref=plan)
    ready = store.publish([Record("batch", b"x" * 1000)], submission_id="ready")
    q.batch_ready("training", token=token, batch_id="b", ready_ref=ready, state_ref=state,
                  fetch_cursor=1, processed_cursor=1)

    def ready_bytes(queue: Coordinator) -> int:
        return int(queue.metrics()["usage_with_reservations"]["ready_bytes"])

    assert ready_bytes(q) == ready.payload_bytes == 1000
    model = _json(store, "model", {"step": 1})
    ckpt = _json(store, "ckpt", {"version": 1, "checkpoint_id": "step-1",
                                 "consumer_state": state.to_dict(), "batch_ids": ["b"],
                                 "training_dependencies": [model.to_dict()]},
                 deps=(state, model))
    q.register_checkpoint("step-1", ckpt)
    assert ready_bytes(q) == 0
    q.close()
    q = Coordinator(store, exclusive_owner="test", recover=True)
    assert ready_bytes(q) == 0
    q.release_checkpoint("step-1")
    assert ready_bytes(q) == 1000
    q.close()
    store.close()


def test_usage_reserves_the_estimates_of_leased_tasks(tmp_path):
    """usage_with_reservations adds each leased task's estimated records, bytes and
    tokens (control tasks estimate none) to the accepted results, as straw-queue's; a
    task that leaves the lease (completed, failed, cancelled) reserves nothing more."""
    store = SharedFilesystemStore(tmp_path, "calls")
    q = Coordinator(store, exclusive_owner="test")

    def usage() -> tuple[int, int, int, int, int]:
        u = q.metrics()["usage_with_reservations"]
        return u["records"], u["bytes"], u["tokens"], u["inflight"], u["control_inflight"]

    q.submit_tasks("r", [TaskSpec("a", estimated_records=3, estimated_bytes=10,
                                  estimated_tokens=5),
                         TaskSpec("b", estimated_bytes=7),
                         TaskSpec("c", control=True, estimated_records=0)])
    assert usage() == (0, 0, 0, 0, 0)  # pending tasks reserve nothing
    (a,) = (x.lease for x in q.acquire("w", 1).assignments)
    q.acquire("builder", control=True)
    assert usage() == (3, 10, 5, 1, 1)
    (b,) = (x.lease for x in q.acquire("w", 1).assignments)
    assert usage() == (4, 17, 5, 2, 1)
    out = store.publish([Record("o", b"12", tokens=4, metadata={
        "task_id": a.task_id, "attempt_id": a.attempt_id})], submission_id="out")
    q.complete_task(a, submission_id="done", result_ref=out, result_digest=out.digest)
    assert usage() == (1 + 1, 7 + 2, 4, 1, 1)  # a's result replaces its reservation
    q.cancel_task("b", request_id="cancel")
    assert usage() == (1, 2, 4, 0, 1)
    q.close()
    store.close()


@pytest.mark.parametrize("api", ["write_records", "publish"])
def test_retry_of_a_reclaimed_result_is_invalid_reference(tmp_path, api):
    """A retry whose original result was garbage collected since gets no reference to
    bytes that are gone; the writer goes on taking new requests, and a retry of a result
    that is still there returns it."""
    with SharedFilesystemStore(tmp_path, "calls", segment_target_bytes=0) as store:
        call = getattr(store, api)
        kept = call([Record("kept", b"kept")], submission_id="kept")
        first = call([Record("first", b"first")], submission_id="first")
        store.retain("app:kept", list(kept) if api == "write_records" else [kept])
        store.release_publications(list(first) if api == "write_records" else [first])
        assert store.collect_garbage()["reclaimed_files"] == 1
        with pytest.raises(InvalidReference, match="Reference has been reclaimed") as e:
            call([Record("first", b"first")], submission_id="first")
        assert "'first'" in str(e.value) and "new submission_id" in str(e.value)
        with pytest.raises(IdempotencyConflict):  # other content is still a conflict
            call([Record("first", b"other")], submission_id="first")
        assert call([Record("kept", b"kept")], submission_id="kept") == kept
        other = call([Record("other", b"other")], submission_id="other")
        store.release_publications(list(other) if api == "write_records" else [other])
        store.release("app:kept")
        store.collect_garbage()
        # "kept" is still staged (never released): one root, and its bytes stay
        assert store.collect_garbage()["owners"] == 1
        if api == "write_records":
            assert store.read_record(kept[0]).payload == b"kept"
        else:
            assert next(store.read(kept)).payload == b"kept"
        store.release_publications(list(kept) if api == "write_records" else [kept])
        assert store.collect_garbage()["owners"] == 0
