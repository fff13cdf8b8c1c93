"""A batch's plan (RL3: a planned batch never changes): the selected groups' positions,
commit ids and digests, each sample's token count, the rank partition
(``partition_by_tokens``), the conversion configuration and the parallel layout, and
its digest.  The plan is durable (``plan_batch``) before any hook runs; planning an
existing batch id again with another plan, or getting a ready batch back under another
plan (RL11), is ``IdempotencyConflict``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from straw.errors import CorruptData, IdempotencyConflict
from straw.protocol import CommitReceipt
from straw.refs import RecordSetRef

from ..shards import RankBatchRef, partition_by_tokens
from .consumer import BuilderConsumer
from .entries import Accepted
from .records import (
    PLAN_SCHEMA,
    READY_SCHEMA,
    canonical,
    digest,
    hook_name,
    json_record,
    read_json,
)


class Planner:
    """The plans of one builder: ``dp_size`` ranks, and what the plan digest covers
    besides the selection (``conversion``, ``parallel``, the hooks' names and
    ``reward_key``: ``ValueError`` unless they are JSON)."""

    def __init__(self, store: Any, *, dp_size: int, conversion: Mapping[str, Any] | None,
                 parallel: Mapping[str, Any] | None, reward_hook: Any, convert_hook: Any,
                 reward_key: str | None) -> None:
        self.store = store
        self.dp_size = dp_size
        try:
            self.configuration = json.loads(canonical({
                "conversion": dict(conversion or {}), "reward_key": reward_key,
                "reward_hook": hook_name(reward_hook),
                "convert_hook": hook_name(convert_hook)}))
            self.parallel = json.loads(canonical({**dict(parallel or {}),
                                                  "dp_size": dp_size}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"conversion and parallel must be JSON mappings: {e}") from None

    def plan(self, batch_id: str, rid: str, receipt: CommitReceipt,
             groups: list[Accepted]) -> dict[str, Any]:
        """The plan of batch ``batch_id`` (rollout ``rid``, collection ``receipt``)."""
        flat = [(g, j) for g in range(len(groups)) for j in range(len(groups[g].tokens))]
        parts = partition_by_tokens([groups[g].tokens[j] for g, j in flat], self.dp_size)
        # restored groups are not commits of this queue: nothing of theirs to acknowledge
        positions = sorted({receipt.position, *(e.position for e in groups if not e.restored)})
        plan: dict[str, Any] = {
            "schema": PLAN_SCHEMA, "version": 1, "batch_id": batch_id, "rollout_id": rid,
            "collection": {"position": receipt.position, "commit_id": receipt.commit_id,
                           "digest": receipt.digest},
            "groups": [{"position": e.position, "commit_id": e.commit_id,
                        "digest": e.ref.digest, "environment": e.environment,
                        "tokens": list(e.tokens), **({"restored": True} if e.restored else {})}
                       for e in groups],
            "partition": [[list(flat[i]) for i in part] for part in parts],
            "configuration": self.configuration, "parallel": self.parallel,
            "input_positions": positions}
        plan["digest"] = digest(plan)
        return plan

    def ensure_planned(self, consumer: BuilderConsumer, batch_id: str,
                       plan: dict[str, Any], view: Mapping[str, Any] | None
                       ) -> RecordSetRef:
        """``plan`` durable and planned on the queue (``view``: the batch's, if it was
        planned before: then it must be this plan)."""
        if view is not None:
            ref = RecordSetRef.from_dict(view["plan_ref"])
            stored = read_json(self.store, ref, f"plan of batch {batch_id!r}")
            if not isinstance(stored, dict) or stored.get("digest") != plan["digest"]:
                raise IdempotencyConflict(
                    f"batch {batch_id!r} was planned with another selection, conversion "
                    f"configuration or parallel layout (plan {stored.get('digest')!r}, now "
                    f"{plan['digest']!r}); an existing batch id cannot be reused with "
                    "another plan: restore the configuration it was planned with")
            return ref
        ref = self.store.publish([json_record("plan", plan)],
                                 submission_id=f"plan:{batch_id}:{plan['digest']}")
        consumer.coord.plan_batch(consumer.id, token=consumer.token, batch_id=batch_id,
                                  input_positions=plan["input_positions"], plan_ref=ref)
        return ref

    def ready_refs(self, ready_ref: RecordSetRef, batch_id: str,
                   plan_digest: str) -> list[RankBatchRef]:
        """A ready batch's rank references, if it was built from ``plan_digest`` (what
        this builder plans for it now): a ready batch is bound to its plan, as a planned
        one is (another conversion configuration or layout must not get the stored batch
        back, converted the old way)."""
        ready = read_json(self.store, ready_ref, f"ready record of batch {batch_id!r}")
        if not isinstance(ready, dict) or ready.get("schema") != READY_SCHEMA:
            raise CorruptData(f"the ready record of batch {batch_id!r} is not a "
                              f"{READY_SCHEMA}")
        if ready["world"] != self.dp_size:
            raise ValueError(f"batch {batch_id!r} is ready for {ready['world']} ranks, this "
                             f"builder has dp_size {self.dp_size}: an existing batch cannot "
                             "be reused with another parallel layout")
        if ready.get("plan_digest") != plan_digest:  # RL11: only under its own plan
            raise IdempotencyConflict(
                f"batch {batch_id!r} is ready, built with another selection, conversion "
                f"configuration or parallel layout (plan {ready.get('plan_digest')!r}, now "
                f"{plan_digest!r}); an existing batch id cannot be reused with another "
                "plan: restore the configuration it was built with")
        return [RankBatchRef(batch_id, ready["plan_digest"], r, ready["world"],
                             RecordSetRef.from_dict(s)) for r, s in enumerate(ready["ranks"])]


__all__ = ["Planner"]
