"""A batch's selection made durable (RL2): the control task ``collection:<rollout_id>``
acquired by id, its list of group receipts published (depending on the groups) and
completed: the collection receipt, whose commit id names the batch.  A collection this
builder wrote is kept as written until its scan passes the commit, so that it is not
read and parsed back."""

from __future__ import annotations

from typing import Any

from straw.errors import CorruptData
from straw.protocol import CommitReceipt, Lease, TaskSpec
from straw.refs import RecordSetRef

from ..environments import MixState
from .entries import Accepted
from .records import BUILDER_WORKER, COLLECTION_SCHEMA, json_record, read_json


class Collections:
    """The collections of one builder's queue; ``own``: those this builder committed,
    by commit id, until its scan passes them: (publication, groups, mix state after)."""

    def __init__(self, coordinator: Any, store: Any) -> None:
        self.coord = coordinator
        self.store = store
        self.own: dict[str, tuple[RecordSetRef, tuple[Accepted, ...], MixState]] = {}

    def lease(self, task_id: str) -> Lease | None:
        """The collection task's lease: acquired now, or ours from before."""
        self.coord.submit_tasks(task_id, [TaskSpec(task_id, control=True,
                                                   estimated_records=0)])
        got = self.coord.acquire(BUILDER_WORKER, 1, task_ids=[task_id], control=True)
        if got.assignments:
            return got.assignments[0].lease
        status = self.coord.task_status(task_id)
        if status is not None and status["state"] == "leased" and status["lease"]:
            return Lease(**status["lease"])  # ours, from before a lost reply or a restart
        return None

    def collect(self, task_id: str, rollout_id: str, chosen: list[Accepted],
                before: MixState, after: MixState) -> CommitReceipt:
        """Commit the collection of ``chosen`` for ``rollout_id`` (or find the one
        committed before a lost reply or a restart): its receipt."""
        lease = self.lease(task_id)
        if lease is None:
            receipt = self.coord.lookup_submission(task_id)
            if receipt is None:
                status = self.coord.task_status(task_id)
                raise RuntimeError(f"collection task {task_id!r} cannot be acquired (state "
                                   f"{status and status['state']!r}); it was cancelled or "
                                   "failed: use a new rollout id")
            return receipt
        body = {"schema": COLLECTION_SCHEMA, "version": 1, "rollout_id": rollout_id,
                "groups": [e.to_dict() for e in chosen], "mix_before": before.to_dict(),
                "mix_after": after.to_dict()}
        ref = self.store.publish(
            [json_record("collection", body, {"task_id": lease.task_id,
                                              "attempt_id": lease.attempt_id})],
            submission_id=f"collection:{lease.attempt_id}",
            dependencies=[e.ref for e in chosen])
        receipt = self.coord.complete_task(lease, submission_id=task_id, result_ref=ref,
                                           result_digest=ref.digest)
        if receipt.result_ref == ref:  # the commit names what was just written: keep it
            # (until the scan passes the commit: at most the batches being built)
            self.own[receipt.commit_id] = (ref, tuple(chosen), after)
        return receipt

    def read(self, receipt: CommitReceipt) -> dict[str, Any]:
        value = read_json(self.store, receipt.result_ref, f"collection {receipt.task_id!r}")
        if not isinstance(value, dict) or value.get("schema") != COLLECTION_SCHEMA:
            raise CorruptData(f"the result of {receipt.task_id!r} is not a "
                              f"{COLLECTION_SCHEMA}")
        return value

    def collected(self, receipt: CommitReceipt) -> tuple[list[Accepted], MixState]:
        """The groups of a collection commit and the mix state after it: as this builder
        wrote them when the receipt names its own collection publication (``collect``),
        else read and parsed from the pool."""
        own = self.own.get(receipt.commit_id)
        if own is not None and own[0] == receipt.result_ref:
            return list(own[1]), own[2]
        value = self.read(receipt)
        return ([Accepted.from_dict(e) for e in value["groups"]],
                MixState.from_dict(value["mix_after"]))


__all__ = ["Collections"]
