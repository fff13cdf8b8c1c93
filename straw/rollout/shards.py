"""Rank shards of a training batch: how the batch builder divides samples among
data-parallel ranks, the small reference each rank receives, and what a rank loads.

* ``partition_by_tokens(tokens, world)``: sample ordinals per rank, balanced by tokens
  (greedy, largest first, onto the rank with the fewest tokens among those that may
  take one more: every rank takes ``n // world`` samples, ``n % world`` of them one
  more).  Deterministic: the partition is part of a batch's plan, so a replayed plan
  divides the samples identically.
* ``RankBatchRef``: ``(batch_id, plan_digest, rank, world, shard)``, what travels to a
  rank (Ray, a pipe): a few hundred bytes pickled (tested under 1 KiB), whatever the
  batch holds.  ``load(store)`` reads only that rank's shard: one small manifest and the
  shard's record 0 plus its small tensors; capture tensors (R3 routes, top-k) stay lazy
  ``TensorRef``s, so a CP/TP rank reads only its rows (``ref.rows(a, b)``).
* ``check_batch_identities(refs)``: every rank of a step got the same batch: same batch
  id and plan digest, ``refs[r].rank == r``, ``world == len(refs)``.  A mismatch (a rank
  handed another batch's reference, or a stale one) is a ``ValueError`` naming the rank;
  ``load`` checks the shard it reads against the reference too.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from straw.checks import check_count
from straw.codec import sample_from_records
from straw.errors import UnsupportedSchema
from straw.refs import RecordSetRef
from straw.tensor import TensorRef

SHARD_SCHEMA = "straw.rollout.shard"
SHARD_VERSION = 1
# tensors above this size stay lazy when a rank loads its shard (token ids and masks are
# small and always read; captures are large and read by row range)
DEFAULT_LAZY_BYTES = 1 << 20


def partition_by_tokens(tokens: Sequence[int], world: int) -> list[list[int]]:
    """Sample ordinals per rank (each list ascending), balanced by ``tokens`` (module
    docstring)."""
    check_count("world", world, minimum=1)
    n = len(tokens)
    if n < world:
        raise ValueError(f"{n} samples cannot feed {world} data-parallel ranks: every rank "
                         "needs at least one sample (a larger batch, or fewer ranks)")
    # every rank takes n // world samples, n % world of them one more
    floor, extra = divmod(n, world)
    # (tokens so far, samples so far, rank): the least loaded rank first, ties to the
    # rank with fewer samples, then the lower rank
    heap = [(0, 0, r) for r in range(world)]
    parts: list[list[int]] = [[] for _ in range(world)]
    order = sorted(range(n), key=lambda i: (-tokens[i], i))
    for i in order:
        skipped = []
        while True:
            load, count, rank = heapq.heappop(heap)
            if count < floor or (count == floor and extra > 0):
                break
            skipped.append((load, count, rank))
        if count == floor:
            extra -= 1
        parts[rank].append(i)
        if count + 1 < floor + (extra > 0):
            heapq.heappush(heap, (load + tokens[i], count + 1, rank))
        for entry in skipped:
            heapq.heappush(heap, entry)
    return [sorted(p) for p in parts]


@dataclass(frozen=True)
class RankShard:
    """What one rank loads: its samples (the conversion's dicts, in plan order) and the
    batch identity they belong to."""

    batch_id: str
    plan_digest: str
    rank: int
    world: int
    samples: list[dict[str, Any]]

    @property
    def tokens(self) -> int:
        return sum(len(s["tokens"]) for s in self.samples if "tokens" in s)


@dataclass(frozen=True)
class RankBatchRef:
    """The small reference a data-parallel rank receives (module docstring)."""

    batch_id: str
    plan_digest: str
    rank: int
    world: int
    shard: RecordSetRef

    def __post_init__(self) -> None:
        check_count("RankBatchRef.rank", self.rank)
        check_count("RankBatchRef.world", self.world, minimum=1)
        if self.rank >= self.world:
            raise ValueError(f"RankBatchRef.rank {self.rank} is not below world {self.world}")
        if not isinstance(self.shard, RecordSetRef):
            raise TypeError(f"RankBatchRef.shard must be a RecordSetRef, got "
                            f"{type(self.shard).__name__}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # positional fields only (no field names or dataclass state): stays small
        return (RankBatchRef, (self.batch_id, self.plan_digest, self.rank, self.world,
                               self.shard))

    def to_dict(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "plan_digest": self.plan_digest,
                "rank": self.rank, "world": self.world, "shard": self.shard.to_dict()}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RankBatchRef:
        return cls(value["batch_id"], value["plan_digest"], value["rank"], value["world"],
                   RecordSetRef.from_dict(value["shard"]))

    def load(self, store: Any, *, rank: int | None = None,
             lazy_tensors_over: int = DEFAULT_LAZY_BYTES) -> RankShard:
        """This rank's shard, read through ``store`` (any store of the pool's run).
        ``rank``: the reader's rank, checked against the reference.  Tensors larger than
        ``lazy_tensors_over`` bytes come back as lazy ``TensorRef``s."""
        if rank is not None and rank != self.rank:
            raise ValueError(f"rank {rank} received the reference of rank {self.rank} of "
                             f"batch {self.batch_id!r}: training ranks received inconsistent "
                             "batch identities (hand reference r to rank r)")
        manifest = store.checked_manifest(self.shard)
        head = store.read_record(manifest.record_refs[0])
        tensors = TensorRef.from_record_set_many(store, self.shard)
        value = sample_from_records([head], tensors=tensors,
                                    lazy_tensors_over=lazy_tensors_over, store=store)
        if not isinstance(value, dict) or value.get("schema") != SHARD_SCHEMA \
                or value.get("version") != SHARD_VERSION:
            raise UnsupportedSchema(f"{self.shard!r} is not a {SHARD_SCHEMA} version "
                                    f"{SHARD_VERSION} (a rank reference of another kind)")
        got = (value.get("batch_id"), value.get("plan_digest"), value.get("rank"),
               value.get("world"))
        want = (self.batch_id, self.plan_digest, self.rank, self.world)
        if got != want:
            raise ValueError(f"the shard of rank {self.rank} holds batch {got[0]!r} plan "
                             f"{got[1]!r} rank {got[2]}/{got[3]}, its reference names batch "
                             f"{want[0]!r} plan {want[1]!r} rank {want[2]}/{want[3]}: training "
                             "ranks received inconsistent batch identities")
        return RankShard(self.batch_id, self.plan_digest, self.rank, self.world,
                         list(value["samples"]))


def check_batch_identities(refs: Sequence[RankBatchRef]) -> None:
    """Every rank of one training step holds the same batch (module docstring)."""
    if not refs:
        raise ValueError("no rank references: a training step needs one per rank")
    first = refs[0]
    for r, ref in enumerate(refs):
        if not isinstance(ref, RankBatchRef):
            raise TypeError(f"refs[{r}] must be a RankBatchRef, got {type(ref).__name__}")
        if (ref.batch_id, ref.plan_digest) != (first.batch_id, first.plan_digest) \
                or ref.rank != r or ref.world != len(refs):
            raise ValueError(
                f"training ranks received inconsistent batch identities: rank {r} holds "
                f"batch {ref.batch_id!r} plan {ref.plan_digest!r} as rank {ref.rank}/"
                f"{ref.world}, rank 0 batch {first.batch_id!r} plan {first.plan_digest!r} "
                f"of {len(refs)} ranks; hand every rank the references of one next_batch "
                "call, reference r to rank r")


__all__ = ["SHARD_SCHEMA", "SHARD_VERSION", "DEFAULT_LAZY_BYTES", "partition_by_tokens",
           "RankShard", "RankBatchRef", "check_batch_identities"]
