"""A lease of another queue (or run) authorises nothing on this one, and is answered as
straw-queue answers it: ``StaleAttempt`` per lease in ``heartbeat``, ``StaleAttempt`` from
the calls that take one lease.  vime heartbeats a parent branch's leases through a child
queue and drops whatever comes back stale."""

from __future__ import annotations

import dataclasses

import pytest

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec
from straw.errors import StaleAttempt

OWNER = "this test process owns the only coordinator"


@pytest.fixture
def two_queues(tmp_path):
    store = SharedFilesystemStore(tmp_path, "leases")
    inp = store.publish([Record("in", b"in")], submission_id="in")
    parent = Coordinator(store, queue_id="parent", namespace=True, exclusive_owner=OWNER)
    child = Coordinator(store, queue_id="child", namespace=True, exclusive_owner=OWNER)
    for q in (parent, child):
        q.submit_tasks("seed", [TaskSpec("prompt:0", input_ref=inp)])
    foreign = parent.acquire("w").assignments[0].lease
    own = child.acquire("w").assignments[0].lease
    yield store, parent, child, foreign, own
    parent.close()
    child.close()


def test_heartbeat_answers_each_foreign_lease_stale_and_extends_its_own(two_queues):
    _, _, child, foreign, own = two_queues
    other_run = dataclasses.replace(own, run_id="another-run")
    assert child.heartbeat([foreign, own, other_run]) == ["StaleAttempt", "extended",
                                                         "StaleAttempt"]


def test_single_lease_calls_refuse_a_foreign_lease_and_change_nothing(two_queues):
    store, parent, child, foreign, _ = two_queues
    result = store.publish([Record("r", b"r", metadata={"task_id": "prompt:0",
                                                        "attempt_id": foreign.attempt_id})],
                           submission_id="result")
    before = child.task_status("prompt:0")
    with pytest.raises(StaleAttempt, match="given to queue 'child'"):
        child.complete_task(foreign, submission_id="c", result_ref=result)
    with pytest.raises(StaleAttempt):
        child.fail_task(foreign, request_id="f", failure="x")
    with pytest.raises(StaleAttempt):
        child.yield_task(foreign, request_id="y", input_ref=None)
    assert child.task_status("prompt:0") == before
    # the lease still works on its own queue
    assert parent.heartbeat([foreign]) == ["extended"]
