"""straw-queue 0.1.6 accounts tokens and task estimates as unsigned 64-bit integers: a
record of 2**64-1 tokens, a task estimating 2**64-1 of anything, are accepted.  A *sum*
of them past 2**64-1 is a ``ValueError`` saying "overflow": before anything is written
(a publication whose tokens with its dependencies' pass 64 bits), or from the report that
adds them (``metrics()``), never a wrapped count, and never a queue whose journal, history
or recovery breaks on it."""

from __future__ import annotations

import dataclasses

import pytest

from straw import Coordinator, Record, RecordSetRef, SharedFilesystemStore, TaskSpec
from straw.errors import InvalidReference

U64 = 2**64 - 1
OWNER = "this test process owns the only coordinator"


def _packs(root):  # type: ignore[no-untyped-def]
    return {p: p.stat().st_size for p in root.rglob("*.pack")}


def test_a_record_of_2_64_minus_1_tokens_round_trips(tmp_path):
    with SharedFilesystemStore(tmp_path, "u64") as store:
        ref = store.publish([Record("r", b"x", tokens=U64)], submission_id="big")
        assert ref.tokens == U64
        assert RecordSetRef.from_dict(dataclasses.asdict(ref)) == ref
        assert store.validate(ref)
        assert next(store.read(ref)).tokens == U64
        with pytest.raises(ValueError, match=r"0\.\.2\*\*64-1"):
            store.publish([Record("r", b"x", tokens=U64 + 1)], submission_id="too big")
        # a reference's usage is unsigned 64-bit too: past it, straw-queue's phrase
        with pytest.raises(InvalidReference, match="Invalid result usage"):
            store.validate(dataclasses.replace(ref, tokens=U64 + 1))
    with SharedFilesystemStore(tmp_path, "u64") as reopened:
        assert reopened.validate(ref)


def test_a_sum_past_64_bits_is_refused_before_anything_is_written(tmp_path):
    with SharedFilesystemStore(tmp_path, "u64", segment_target_bytes=0) as store:
        leaf = store.publish([Record("leaf", b"leaf", tokens=U64)], submission_id="leaf")
        before = _packs(tmp_path)
        with pytest.raises(ValueError, match="overflow"):
            store.publish([Record("more", b"x", tokens=1)], dependencies=[leaf],
                          submission_id="deps")
        with pytest.raises(ValueError, match="overflow"):
            store.publish([Record("a", b"a", tokens=U64), Record("b", b"b", tokens=1)],
                          submission_id="records")
        assert _packs(tmp_path) == before
        # the writer goes on; a dependency that fits is accepted
        ok = store.publish([Record("more", b"x", tokens=0)], dependencies=[leaf],
                           submission_id="deps")
        assert ok.tokens == U64


def test_estimates_are_unsigned_and_their_sum_overflows_only_the_report(tmp_path):
    store = SharedFilesystemStore(tmp_path, "u64")
    q = Coordinator(store, exclusive_owner=OWNER)
    with pytest.raises(ValueError, match=r"estimated_bytes must be .*0\.\.2\*\*64-1"):
        q.submit_tasks("bad", [TaskSpec("bad", estimated_bytes=U64 + 1)])
    q.submit_tasks("in", [TaskSpec("a", estimated_tokens=U64, estimated_bytes=U64),
                          TaskSpec("b", estimated_tokens=1)])
    assert q.metrics()["usage_with_reservations"]["tokens"] == 0
    leases = [a.lease for a in q.acquire("w", max_tasks=2).assignments]
    assert len(leases) == 2
    with pytest.raises(ValueError, match="usage_with_reservations.tokens .*overflow"):
        q.metrics()
    assert q.task_status("a")["spec"]["estimated_tokens"] == U64  # the rest still answers
    q.cancel_task("b", request_id="cancel b")
    usage = q.metrics()["usage_with_reservations"]
    assert (usage["tokens"], usage["bytes"]) == (U64, U64)
    q.close()
    with Coordinator(store, exclusive_owner=OWNER, recover=True) as again:
        assert again.task_status("a")["spec"]["estimated_tokens"] == U64
        assert again.task_status("b")["state"] == "cancelled"
        assert again.metrics()["usage_with_reservations"]["tokens"] == 0  # leases revoked
    store.close()


def test_accepted_results_past_64_bits_survive_snapshots_and_recovery(tmp_path):
    """Accepted results of 2**64-1 tokens each: the journal, its snapshots and the
    history segments (which keep per-block usage sums) hold them; only the usage report
    overflows."""
    store = SharedFilesystemStore(tmp_path, "u64")
    q = Coordinator(store, exclusive_owner=OWNER, snapshot_every=2)
    q.submit_tasks("in", [TaskSpec(f"t{i}") for i in range(6)])
    for i, a in enumerate(q.acquire("w", max_tasks=6).assignments):
        lease = a.lease
        result = store.publish([Record("out", b"x", tokens=U64, metadata={
            "task_id": lease.task_id, "attempt_id": lease.attempt_id})], submission_id=f"r{i}")
        q.complete_task(lease, submission_id=f"done{i}", result_ref=result,
                        result_digest=result.digest)
    with pytest.raises(ValueError, match="overflow"):
        q.metrics()
    q.snapshot()
    q.close()
    with Coordinator(store, exclusive_owner=OWNER, recover=True) as again:
        commits = again.read_commits(limit=10).commits
        assert len(commits) == 6
        assert all(c.result_ref.tokens == U64 for c in commits)
        with pytest.raises(ValueError, match="overflow"):
            again.metrics()
    store.close()
