"""What becomes of a group a generation client returns (``straw.rollout.generation``):
the five outcomes, the per-group plan a return is carried out from, and the content
identity of a returned group's publication (equal content, equal digest: a retried
attempt reuses its reference, other content for the same attempt is a conflict)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from straw.protocol import CommitReceipt, Lease, encode
from straw.refs import Record, RecordSetRef, payload_view

from .samples import SampleGroup, Stage

COMPLETED, RETURNED, REQUEUED, RELEASED, REJECTED = (
    "completed", "returned", "requeued", "released", "rejected")


@dataclasses.dataclass(frozen=True)
class Returned:
    """What became of one returned group: ``action`` is ``completed`` (``receipt``),
    ``returned`` (pending again with its continuation, at ``stage``), ``requeued`` (the
    staleness bound returned its prompt alone), ``released`` (its captures did not cover
    its tokens: it resumes from its previous input) or ``rejected`` (failed for good,
    ``reason``)."""

    task_id: str
    action: str
    stage: Stage | None = None
    receipt: CommitReceipt | None = None
    reason: str = ""


@dataclasses.dataclass
class ReturnPlan:
    """One returned group's fate, decided before anything changes, then carried out:
    its task and lease, the group to publish, its ``action`` and the publication's
    reference once written."""

    task_id: str
    lease: Lease
    group: SampleGroup
    action: str
    reason: str = ""
    ref: RecordSetRef | None = None
    # what complete_many measures the group's staleness from: with a bound, the per-sample
    # staleness against the version the bound was applied with; without one, each
    # sample's version_span, measured by the controller against the version it serves
    # when it accepts the group (no round trip here to learn it)
    staleness: list[int | None] = dataclasses.field(default_factory=list)
    versions: list[list[int] | None] | None = None


def content_digest(records: Sequence[Record], deps: Sequence[RecordSetRef]) -> str:
    """What a group's publication holds: record ids, codecs, metadata, tokens, payloads
    and dependencies (equal content, equal digest)."""
    h = hashlib.sha256()
    for i, r in enumerate(records):
        h.update(encode([r.record_id, r.codec, dict(r.metadata), r.tokens or 0]))
        h.update(payload_view(r.payload, f"records[{i}]"))
    h.update(encode([d.digest for d in deps]))
    return h.hexdigest()


__all__ = ["Returned", "COMPLETED", "RETURNED", "REQUEUED", "RELEASED", "REJECTED"]
