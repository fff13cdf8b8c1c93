"""A yielded task joins the tail of its (priority, key) FIFO, in the order of the updates,
as in straw-queue (its users, vime among them, return partial rollouts with
``yield_tasks`` and expect them behind the work already queued); release and failure keep
the submission position.  The order is journaled: a recovered queue hands tasks out in
the same order."""

from __future__ import annotations

import dataclasses

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec

OWNER = "this test process owns the only coordinator"


def _pending(q):  # type: ignore[no-untyped-def]
    return [t.task_id for t in q.pending_tasks()]


def test_yield_moves_tasks_to_the_tail_in_update_order(tmp_path):
    store = SharedFilesystemStore(tmp_path, "order")
    q = Coordinator(store, exclusive_owner=OWNER)
    inp = store.publish([Record("in", b"in")], submission_id="in")
    q.submit_tasks("first", [TaskSpec(t, input_ref=inp) for t in "abc"])
    la, lb = (a.lease for a in q.acquire("w", max_tasks=2).assignments)
    q.submit_tasks("later", [TaskSpec("d", input_ref=inp)])
    part = store.publish([Record("partial", b"p")], submission_id="partial")
    updates = [{"lease": dataclasses.asdict(lb), "input_ref": dataclasses.asdict(part)},
               {"lease": la, "input_ref": None}]
    assert q.yield_tasks(updates, request_id="return") == "pending"
    assert _pending(q) == ["c", "d", "b", "a"]
    assert q.yield_tasks(updates, request_id="return") == "pending"  # a retry moves nothing
    assert _pending(q) == ["c", "d", "b", "a"]
    # release and failure keep the position: c is still first
    (lc,) = (a.lease for a in q.acquire("w").assignments)
    assert lc.task_id == "c"
    q.release_tasks([lc])
    (lc,) = (a.lease for a in q.acquire("w").assignments)
    q.fail_task(lc, failure="transient")
    assert _pending(q) == ["c", "d", "b", "a"]
    # a later yield goes behind the earlier ones
    (ld,) = (a.lease for a in q.acquire("w", task_ids=["d"]).assignments)
    q.yield_task(ld, request_id="d up", input_ref=None)
    assert _pending(q) == ["c", "b", "a", "d"]
    q.close()
    with Coordinator(store, exclusive_owner=OWNER, recover=True) as again:
        assert [a.task.task_id for a in again.acquire("w", max_tasks=4).assignments] == \
            ["c", "b", "a", "d"]
        assert again.task_status("b")["spec"]["input_ref"] == dataclasses.asdict(part)
    store.close()
