"""Rank shards of a training batch: how the batch builder divides samples among
data-parallel ranks, the small reference each rank receives, and what a rank loads.

* ``partition_by_tokens(tokens, world)``: sample ordinals per rank, balanced by tokens
  (greedy, largest first, onto the rank with the fewest tokens among those that may
  take one more: every rank takes ``n // world`` samples, ``n % world`` of them one
  more).  Deterministic: the partition is part of a batch's plan, so a replayed plan
  divides the samples identically.
* ``shard_records(batch_id, plan_digest, rank, world, samples)``: the records of one
  rank's shard (``straw.codec`` sample records) and the publications they depend on.
* ``RankBatchRef``: ``(batch_id, plan_digest, rank, world, shard)``, what travels to a
  rank (Ray, a pipe): a few hundred bytes pickled (tested under 1 KiB), whatever the
  batch holds.  ``load(store)`` reads only that rank's shard: one small manifest and the
  shard's record 0 plus its small tensors; capture tensors (R3 routes, top-k) stay lazy
  ``TensorRef``s, so a CP/TP rank reads only its rows (``ref.rows(a, b)``).

Layout (version 2, columnar): the samples' dicts in record 0, except their *columns*:
a key every sample of the shard holds as a 1-D NumPy array of one dtype (the token ids
of the default conversion, a hook's loss masks) is stored as ONE ``tensor.v1`` record,
the samples' arrays concatenated, with their lengths in record 0.  (Version 1 stored one
tensor record per sample and key: 256 samples made 256 small records, each with its own
frame, checksum and read; the builder's publication and the rank's load were dominated
by them.)  ``load`` gives each sample a view of its slice of the column (one read, one
chunk-checksum pass), reinserted as the sample's first keys; the column and its lengths
are checked (``CorruptData`` when they disagree).  Anything else (torch tensors, NumPy
arrays of more dimensions, captures that are ``TensorRef``s) stays a per-sample value as
in version 1.  A version 1 shard is still read (its samples are stored whole).
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

import numpy as np

from straw.checks import check_count
from straw.codec import sample_from_records, sample_records
from straw.errors import CorruptData, UnsupportedSchema
from straw.refs import Record, RecordSetRef
from straw.tensor import DTYPES, TensorRef

SHARD_SCHEMA = "straw.rollout.shard"
SHARD_VERSION = 2
# the versions ``RankBatchRef.load`` reads (1: every sample stored whole, no columns)
SHARD_VERSIONS_READ = (1, 2)
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


def _column_keys(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys stored as columns: held by every sample as a 1-D NumPy array of one
    straw dtype, each sample its own array object (a shared one decodes to one object
    in a per-sample layout; a column would make copies of it)."""
    first = samples[0]
    keys = []
    for key, v in first.items():
        if not (isinstance(key, str) and type(v) is np.ndarray and v.ndim == 1
                and v.dtype.name in DTYPES):
            continue
        dtype = v.dtype
        arrays = [s.get(key) for s in samples]
        if all(type(a) is np.ndarray and a.ndim == 1 and a.dtype == dtype for a in arrays) \
                and len({id(a) for a in arrays}) == len(arrays):
            keys.append(key)
    return keys


def shard_records(batch_id: str, plan_digest: str, rank: int, world: int,
                  samples: Sequence[Mapping[str, Any]]
                  ) -> tuple[list[Record], list[RecordSetRef]]:
    """The records of rank ``rank``'s shard holding ``samples`` (each a mapping of train
    data, in plan order) and the publications they must depend on (module docstring,
    "Layout")."""
    keys = _column_keys(samples) if samples else []
    columns = {k: {"data": np.concatenate([s[k] for s in samples]),
                   "lengths": [len(s[k]) for s in samples]} for k in keys}
    rest = [{k: v for k, v in s.items() if k not in columns} for s in samples] \
        if columns else [dict(s) for s in samples]
    value = {"schema": SHARD_SCHEMA, "version": SHARD_VERSION, "batch_id": batch_id,
             "plan_digest": plan_digest, "rank": rank, "world": world, "samples": rest,
             "columns": columns}
    return sample_records(value)


def _with_columns(value: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The samples of a decoded version 2 shard, each with its views of the columns."""
    samples, columns = value.get("samples"), value.get("columns")
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples) \
            or not isinstance(columns, dict):
        raise CorruptData(f"{where}: the shard's samples or columns are malformed")
    if not columns:
        return samples
    cols: list[tuple[str, np.ndarray[Any, Any], list[int]]] = []
    for key, col in columns.items():
        data = col.get("data") if isinstance(col, dict) else None
        lengths = col.get("lengths") if isinstance(col, dict) else None
        if isinstance(data, TensorRef):  # larger than the lazy bound: columns are read
            data = data.load(framework="numpy")
        if not (isinstance(key, str) and type(data) is np.ndarray and data.ndim == 1
                and isinstance(lengths, list) and len(lengths) == len(samples)
                and all(type(n) is int and n >= 0 for n in lengths)
                and sum(lengths) == len(data)):
            raise CorruptData(f"{where}: column {key!r} does not hold one 1-D array "
                              f"split into the lengths of its {len(samples)} samples")
        if any(key in s for s in samples):
            raise CorruptData(f"{where}: column {key!r} is also a key of a sample")
        cols.append((key, data, [0, *np.cumsum(lengths).tolist()]))
    # each sample's slices of the columns: views of the one array read (no copies)
    return [{**{key: data[bounds[i]:bounds[i + 1]] for key, data, bounds in cols}, **s}
            for i, s in enumerate(samples)]


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
                or value.get("version") not in SHARD_VERSIONS_READ:
            raise UnsupportedSchema(
                f"{self.shard!r} is not a {SHARD_SCHEMA} of a version this straw reads "
                f"({', '.join(map(str, SHARD_VERSIONS_READ))}; it holds "
                f"{value.get('schema') if isinstance(value, dict) else type(value).__name__}"
                f" version {value.get('version') if isinstance(value, dict) else None}): a "
                "rank reference of another kind, or a shard of a newer straw")
        got = (value.get("batch_id"), value.get("plan_digest"), value.get("rank"),
               value.get("world"))
        want = (self.batch_id, self.plan_digest, self.rank, self.world)
        if got != want:
            raise ValueError(f"the shard of rank {self.rank} holds batch {got[0]!r} plan "
                             f"{got[1]!r} rank {got[2]}/{got[3]}, its reference names batch "
                             f"{want[0]!r} plan {want[1]!r} rank {want[2]}/{want[3]}: training "
                             "ranks received inconsistent batch identities")
        samples = list(value["samples"]) if value["version"] == 1 else \
            _with_columns(value, f"shard {self.shard!r}")
        return RankShard(self.batch_id, self.plan_digest, self.rank, self.world, samples)


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


__all__ = ["SHARD_SCHEMA", "SHARD_VERSION", "SHARD_VERSIONS_READ", "DEFAULT_LAZY_BYTES",
           "partition_by_tokens", "shard_records",
           "RankShard", "RankBatchRef", "check_batch_identities"]
