"""straw-queue 0.1.6 keeps ``Limits`` and ``max_record_bytes`` as fields that reject and
throttle nothing (its docs/USAGE.md: "no longer caps records", "no longer reject
pending/in-flight work"), and code written for it passes small values relying on that.
Here such a caller runs unchanged; the bounds still work, as our addition, for a
coordinator or store opened with ``enforce_limits=True``."""

from __future__ import annotations

import dataclasses

import pytest

from straw import Coordinator, Limits, Record, SharedFilesystemStore, TaskSpec
from straw.errors import ResourceLimitExceeded
from straw.protocol import LEGACY_LIMIT_FIELDS

OWNER = "this test process owns the only coordinator"


def _result(store, lease, payload, sid):  # type: ignore[no-untyped-def]
    return store.publish([Record("out", payload, metadata={
        "task_id": lease.task_id, "attempt_id": lease.attempt_id})], submission_id=sid)


def _every_limit_one() -> Limits:
    """Every field straw-queue's Limits has, at 1 (straw's own bounds at their defaults:
    no straw-queue caller sets them)."""
    return Limits(**{name: 1 for name in LEGACY_LIMIT_FIELDS})


def test_the_legacy_fields_are_straw_queues():
    ours = {f.name for f in dataclasses.fields(Limits)}
    assert set(LEGACY_LIMIT_FIELDS) <= ours
    assert ours - set(LEGACY_LIMIT_FIELDS) == {
        "max_tasks_per_request", "max_leases_per_worker", "max_unconsumed_results",
        "max_ready_batches"}


def test_straws_own_bounds_are_enforced_either_way(tmp_path):
    """A bound straw-queue does not have is straw's addition: whoever sets it means it."""
    with SharedFilesystemStore(tmp_path, "run") as store:
        with Coordinator(store, exclusive_owner=OWNER,
                         limits=Limits(max_tasks_per_request=2, pending_tasks=1)) as q:
            with pytest.raises(ResourceLimitExceeded, match="max_tasks_per_request"):
                q.submit_tasks("many", [TaskSpec(f"t{i}") for i in range(3)])
            q.submit_tasks("two", [TaskSpec("a"), TaskSpec("b")])  # pending_tasks: carried


def test_small_limits_are_carried_not_enforced(tmp_path):
    limits = _every_limit_one()
    with SharedFilesystemStore(tmp_path, "run") as store:
        with Coordinator(store, exclusive_owner=OWNER, limits=limits) as q:
            assert q.limits == limits  # what the caller passed, as straw-queue keeps it
            q.submit_tasks("many", [TaskSpec(f"t{i}", metadata={"x": "y" * 100})
                                    for i in range(3)]
                           + [TaskSpec(f"c{i}", control=True, estimated_records=0) for i in (1, 2)])
            got = q.acquire("w", max_tasks=3)
            assert got.status == "acquired" and len(got.assignments) == 3
            assert len(q.acquire("b", max_tasks=2, control=True).assignments) == 2
            lease = got.assignments[0].lease
            big = _result(store, lease, b"x" * 100, "big")
            receipt = q.complete_task(lease, submission_id="done", result_ref=big)
            assert receipt.result_ref.payload_bytes == 100
        with Coordinator(store, exclusive_owner=OWNER, limits=limits, recover=True) as q:
            # a recovered queue with the same legacy limits serves as before
            q.submit_tasks("more", [TaskSpec("t3"), TaskSpec("t4")])
            assert q.task_status("t3")["state"] == "pending"


def test_enforce_limits_keeps_the_bounds(tmp_path):
    limits = Limits(pending_tasks=2, inflight_tasks=1, metadata_bytes=64,
                    max_result_bytes=4, max_tasks_per_request=2)
    with SharedFilesystemStore(tmp_path, "run") as store:
        with Coordinator(store, exclusive_owner=OWNER, limits=limits,
                         enforce_limits=True) as q:
            with pytest.raises(ResourceLimitExceeded, match="max_tasks_per_request"):
                q.submit_tasks("many", [TaskSpec(f"t{i}") for i in range(3)])
            with pytest.raises(ResourceLimitExceeded, match="metadata_bytes"):
                q.submit_tasks("meta", [TaskSpec("m", metadata={"x": "y" * 100})])
            q.submit_tasks("ok", [TaskSpec("a"), TaskSpec("b")])
            with pytest.raises(ResourceLimitExceeded, match="pending_tasks"):
                q.submit_tasks("one-more", [TaskSpec("c")])
            (a,) = q.acquire("w", max_tasks=2).assignments
            assert q.acquire("w").status == "backpressured"
            with pytest.raises(ResourceLimitExceeded, match="max_result_bytes"):
                q.complete_task(a.lease, submission_id="big",
                                result_ref=_result(store, a.lease, b"12345", "big"))


def test_enforce_limits_must_be_a_bool(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        with pytest.raises(TypeError, match="enforce_limits"):
            Coordinator(store, exclusive_owner=OWNER, enforce_limits=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="enforce_limits"):
            SharedFilesystemStore(tmp_path, "run", enforce_limits="yes")  # type: ignore[arg-type]


def test_max_record_bytes_is_carried_unless_enforced(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", max_record_bytes=1024,
                               max_buffer_bytes=128) as store:
        assert store.max_record_bytes == 1024
        ref = store.publish([Record("large", b"a" * 1025)], submission_id="large")
        assert next(store.read(ref)).payload == b"a" * 1025
        (member,) = store.write_records([Record("m", b"b" * 4096)], submission_id="members")
        assert store.read_record(member).payload == b"b" * 4096
    with SharedFilesystemStore(tmp_path, "run", max_record_bytes=1024,
                               enforce_limits=True) as store:
        with pytest.raises(ResourceLimitExceeded, match="max_record_bytes=1024"):
            store.publish([Record("large", b"a" * 1025)], submission_id="refused")
        assert store.lookup_submission("refused") is None  # nothing written
        store.publish([Record("fits", b"a" * 1024)], submission_id="fits")
