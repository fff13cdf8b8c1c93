"""The forms in which straw-queue 0.1.6 callers hand references to the queue, and
references kept alive by a producer's state (its continuation)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from straw import Coordinator, Record, RecordSetRef, SharedFilesystemStore, TaskSpec
from straw.errors import InvalidReference, UnsafeRecovery


def _store(root):
    # one pack per publication: what collection reclaims shows exactly which one is kept
    return SharedFilesystemStore(root, "run", segment_target_bytes=0)


def _queue(store, *, recover=False):
    return Coordinator(store, queue_id="gen", exclusive_owner="the test", recover=recover)


def _blob(store, name, deps=()):
    ref = store.publish([Record(name, name.encode() * 10)], submission_id=name,
                        dependencies=deps)
    store.seal()
    return ref


def _exists(store, ref):
    return (Path(store.root) / ref.path).exists()


def test_replace_moves_a_record_set_like_a_record_ref(tmp_path):
    with _store(tmp_path) as store:
        ref = _blob(store, "a")
        moved = dataclasses.replace(ref, segment=dataclasses.replace(ref.segment, offset=7))
        assert moved.manifest.segment.offset == 7 and moved.manifest.ordinal == 1
        assert (moved.digest, moved.records, moved.tokens) == (ref.digest, 1, 0)
        # unchanged: the same value, the same hash
        same = dataclasses.replace(ref, segment=ref.segment)
        assert same == ref and hash(same) == hash(ref)
        # a moved reference names no extent: refused, not read from elsewhere
        with pytest.raises(InvalidReference):
            store.validate(moved)
        with pytest.raises(InvalidReference, match="manifest must be a RecordRef"):
            RecordSetRef("m", ref.digest, 1, 0, 0, segment=ref.segment)  # type: ignore[arg-type]


def test_queue_calls_take_a_references_dict_form(tmp_path):
    with _store(tmp_path) as store, _queue(store) as q:
        prompt = _blob(store, "prompt")
        assert q.submit_tasks("r1", [TaskSpec("t1", dataclasses.asdict(prompt))]) == ["t1"]
        assert q.task_status("t1")["spec"]["input_ref"] == prompt.to_dict()
        lease = q.acquire("w").assignments[0].lease
        partial = _blob(store, "partial")
        assert q.yield_tasks([{"lease": dataclasses.asdict(lease),
                               "input_ref": dataclasses.asdict(partial)}],
                             request_id="y1") == "pending"
        assert RecordSetRef.from_dict(q.task_status("t1")["spec"]["input_ref"]) == partial
        lease = q.acquire("w").assignments[0].lease
        result = store.publish([Record("out", b"o", metadata={
            "task_id": lease.task_id, "attempt_id": lease.attempt_id})], submission_id="out")
        receipt = q.complete_task(lease, submission_id="c1",
                                  result_ref=dataclasses.asdict(result),
                                  result_digest=result.digest)
        assert receipt.result_ref == result
        bad = dict(dataclasses.asdict(prompt), digest="zz")
        with pytest.raises(InvalidReference, match="digest"):
            q.submit_tasks("r2", [TaskSpec("t2", bad)])


def test_a_producers_state_keeps_the_records_it_names(tmp_path):
    with _store(tmp_path) as store:
        q = _queue(store)
        rng = _blob(store, "rng")
        cursor = _blob(store, "cursor")
        q.submit_tasks("p1", [], producer_id="data",
                       producer_state={"rng": rng, "deep": [{"c": dataclasses.asdict(cursor)}],
                                       "step": 3})
        store.release_publications([rng, cursor])  # the producer state is their only owner
        q.collect_garbage()
        assert _exists(store, rng) and _exists(store, cursor)
        state = q.producer_state("data")
        assert RecordSetRef.from_dict(state["rng"]) == rng and state["step"] == 3
        assert RecordSetRef.from_dict(state["deep"][0]["c"]) == cursor
        q.close()
        q = _queue(store, recover=True)  # recovery rebuilds the roots from the journal
        q.collect_garbage()
        assert _exists(store, rng) and _exists(store, cursor)
        assert next(store.read(rng)).payload == b"rng" * 10
        q.close()


def test_a_producers_new_state_releases_what_only_the_old_one_named(tmp_path):
    with _store(tmp_path) as store, _queue(store) as q:
        shared = _blob(store, "shared")
        old = _blob(store, "old")
        q.submit_tasks("p1", [], producer_id="data", producer_state={"s": [old, shared]})
        new = _blob(store, "new")
        q.submit_tasks("p2", [], producer_id="data", producer_state={"s": [new, shared]})
        store.release_publications([shared, old, new])
        q.collect_garbage()
        assert not _exists(store, old)
        assert _exists(store, new) and _exists(store, shared)
        # the old request's retry is answered from its receipt: nothing resurrected
        assert q.submit_tasks("p1", [], producer_id="data",
                              producer_state={"s": [old, shared]}) == []
        assert RecordSetRef.from_dict(q.producer_state("data")["s"][0]) == new


def test_a_producer_state_reference_must_be_valid_and_of_this_run(tmp_path):
    with _store(tmp_path) as store, _queue(store) as q:
        ref = _blob(store, "a")
        bad = dict(ref.to_dict(), records=-1)
        with pytest.raises(InvalidReference, match="records"):
            q.submit_tasks("p1", [], producer_id="data", producer_state={"s": bad})
        with SharedFilesystemStore(tmp_path, "other") as other:
            foreign = other.publish([Record("f", b"f")], submission_id="f")
        with pytest.raises(InvalidReference, match="belongs to run 'other'"):
            q.submit_tasks("p2", [], producer_id="data", producer_state={"s": foreign})
        assert q.producer_state("data") is None


def test_priority_out_of_range_names_the_signed_64_bit_range(tmp_path):
    with _store(tmp_path) as store, _queue(store) as q:
        for field, value in (("priority", 2**63), ("scheduling_key", -2**63 - 1)):
            with pytest.raises(ValueError, match=rf"tasks\[0\]\.{field} must be a signed "
                                                 "64-bit integer"):
                q.submit_tasks("r", [TaskSpec("t", **{field: value})])
        assert q.pending_tasks() == []


@pytest.mark.parametrize("owner", [False, "", "   ", 3])
def test_an_empty_single_owner_guarantee_is_unsafe_recovery(tmp_path, owner):
    with _store(tmp_path) as store:
        with pytest.raises(UnsafeRecovery, match="exclusive_owner"):
            Coordinator(store, exclusive_owner=owner)
        Coordinator(store).close()  # ours: leaving it out is fine, the lock enforces it
