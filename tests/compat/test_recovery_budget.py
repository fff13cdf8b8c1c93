"""A recovery's revocation of older leases and the retry budget (spec Q6).

straw-queue's rule, our default: every lease a recovery revokes spends one unit of its task's
``max_attempts`` (a leased attempt was made), so ``max_attempts=1`` means at most one attempt
even across coordinator crashes.  ``recovery_spends_budget=False`` (the rollout layer's
policy) returns revoked tasks to pending unspent.  The policy is journaled with each epoch,
so a replay applies each recovery's own policy, not the reader's.
"""

from __future__ import annotations

import pytest

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec
from straw.errors import StaleAttempt


@pytest.fixture
def store(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run") as s:
        yield s


def open_queue(store, **kwargs):
    return Coordinator(store, queue_id="q", namespace=True, **kwargs)


def complete(q, store, lease):
    meta = {"task_id": lease.task_id, "attempt_id": lease.attempt_id}
    ref = store.publish([Record("out", b"x", metadata=meta)],
                        submission_id=f"out:{lease.attempt_id}")
    return q.complete_task(lease, submission_id=f"done:{lease.attempt_id}", result_ref=ref,
                           result_digest=ref.digest)


def test_a_recovery_spends_one_unit_per_revoked_lease(store):
    q = open_queue(store)
    q.submit_tasks("s", [TaskSpec("once", max_attempts=1), TaskSpec("thrice")])
    leases = [a.lease for a in q.acquire("w", 2).assignments]
    q.close()
    with open_queue(store, recover=True) as q:
        assert q.task_status("once")["state"] == "failed"
        assert q.task_status("thrice")["state"] == "pending"
        assert q.task_status("thrice")["failures"] == 1
        for lease in leases:  # revoked: never commits
            with pytest.raises(StaleAttempt):
                complete(q, store, lease)
        # two more recoveries while leased exhaust the default budget of 3
        (again,) = q.acquire("w").assignments
        assert again.task.task_id == "thrice"
    for _ in range(2):
        with open_queue(store, recover=True) as q:
            if q.task_status("thrice")["state"] == "pending":
                q.acquire("w")
    with open_queue(store, recover=True) as q:
        assert q.task_status("thrice")["state"] == "failed"
        assert q.task_status("thrice")["failures"] == 3


def test_a_task_failed_by_recovery_keeps_its_reader_protection(store):
    """D5: the revocation ends the right to commit, not the reader's hold on the input;
    the input goes once the reads are released."""
    ref = store.publish([Record("input", b"still reading")], submission_id="input")
    q = open_queue(store)
    q.submit_tasks("s", [TaskSpec("t", input_ref=ref, max_attempts=1)])
    (assignment,) = q.acquire("reader").assignments
    store.seal()
    q.close()
    with open_queue(store, recover=True) as q:
        assert q.task_status("t")["state"] == "failed"
        assert q.collect_garbage()["reclaimed_files"] == 0
        assert bytes(next(store.read(ref)).payload) == b"still reading"
        assert q.outstanding_reads() == (assignment.lease,)
        q.release_task_reads([assignment.lease])
        assert q.collect_garbage()["reclaimed_files"] == 1


def test_the_rollout_policy_returns_revoked_tasks_unspent(store):
    q = open_queue(store, recovery_spends_budget=False)
    q.submit_tasks("s", [TaskSpec("once", max_attempts=1)])
    (first,) = q.acquire("w").assignments
    q.close()
    with open_queue(store, recover=True, recovery_spends_budget=False) as q:
        status = q.task_status("once")
        assert (status["state"], status["failures"]) == ("pending", 0)
        (again,) = q.acquire("w").assignments
        assert again.lease.generation == first.lease.generation + 1  # attempts never reused
        complete(q, store, again.lease)
        assert q.task_status("once")["state"] == "completed"


def test_each_epoch_is_replayed_under_its_own_policy(store):
    q = open_queue(store)
    q.submit_tasks("s", [TaskSpec("t", max_attempts=3)])
    q.acquire("w")
    q.close()
    with open_queue(store, recover=True, recovery_spends_budget=False) as q:
        assert q.task_status("t")["failures"] == 0  # this recovery's policy spends nothing
        q.acquire("w")
    with open_queue(store, recover=True) as q:
        assert q.task_status("t")["failures"] == 1
    # reopened under either policy, the journal's epochs say what each recovery did
    for spends in (False, True):
        with open_queue(store, recover=True, recovery_spends_budget=spends) as q:
            assert q.task_status("t")["failures"] == 1
            assert q.task_status("t")["state"] == "pending"


def test_the_policy_is_a_bool(store):
    with pytest.raises(TypeError, match="recovery_spends_budget must be a bool"):
        open_queue(store, recovery_spends_budget="no")
