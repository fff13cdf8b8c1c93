"""The conversion of a planned batch to train data: the reward hook over the selected
groups' raw rewards (each checked finite), the conversion hook (``default_convert`` by
default) per sample, and every rank's shard published, at most ``io_concurrency`` at a
time.  Captures stay lazy ``TensorRef``s throughout: no capture byte is read or
copied."""

from __future__ import annotations

import array
import concurrent.futures
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from straw.refs import Record, RecordSetRef

from ..samples import Sample, SampleGroup
from ..shards import shard_records
from .entries import Accepted
from .groups import DecodedGroups
from .records import canonical

RewardHook = Callable[[list[list[Any]]], Sequence[Sequence[float]]]
ConvertHook = Callable[[Sample, float], Mapping[str, Any]]


# a C int is 4 bytes on every platform we run on (checked: NumPy is the fallback)
_INT32_CODE = "i" if array.array("i").itemsize == 4 else None


def token_array(tokens: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """The ids as an int32 array when they all fit (every vocabulary in use), else int64:
    one C pass that fails on the first id past int32 (half the cost of an int64 array
    plus its min and max; this runs for every sample of every batch)."""
    if _INT32_CODE is not None:
        try:
            return np.frombuffer(array.array(_INT32_CODE, tokens), dtype=np.int32)
        except OverflowError:
            return np.asarray(tokens, dtype=np.int64)
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size == 0 or (int(ids.min()) >= -(2**31) and int(ids.max()) < 2**31):
        ids = ids.astype(np.int32)
    return ids


def default_convert(sample: Sample, reward: float) -> dict[str, Any]:
    """The default train data of a sample: token ids (int32/int64 array), lengths,
    reward (post-processed) and raw reward, status, indices, metadata, and the capture
    tensors as they are (lazy ``TensorRef``s: stored as references, never copied)."""
    decoded = sample.int32_ids()  # a stored group's sample: its array, no round trip
    tokens = decoded.copy() if decoded is not None else token_array(sample.tokens)
    return {"tokens": tokens, "response_length": sample.response_length,
            "reward": reward, "raw_reward": sample.reward, "status": sample.status.value,
            "group_index": sample.group_index, "index": sample.index,
            "metadata": dict(sample.metadata), "routes": sample.routes,
            "topk_ids": sample.topk_ids, "topk_logprobs": sample.topk_logprobs}


@dataclass
class Conversion:
    """The hooks of a builder and what it converts with them (``BatchBuilder``'s
    ``reward_hook``, ``convert_hook``, ``reward_key``), its ranks and I/O bound; the
    selected groups come from ``decoded`` (kept from the scan, else read again)."""

    store: Any
    decoded: DecodedGroups
    dp_size: int
    io_concurrency: int
    reward_hook: RewardHook | None
    convert_hook: ConvertHook | None
    reward_key: str | None

    def _raw_reward(self, group: SampleGroup, g: int, j: int, batch_id: str) -> Any:
        reward = group.samples[j].reward
        if isinstance(reward, dict) and self.reward_hook is None:
            if self.reward_key is None or self.reward_key not in reward:
                raise ValueError(f"batch {batch_id!r} group {g} sample {j} has the reward "
                                 f"mapping {sorted(reward)}: pass reward_key= (one of them) "
                                 "or a reward_hook that makes one number per sample")
            return reward[self.reward_key]
        return reward

    def rewards(self, batch_id: str, groups: list[Accepted]) -> list[list[float]]:
        raw: list[list[Any]] = []
        for g, e in enumerate(groups):
            group = self.decoded.group(e)
            self.decoded.keep(e.commit_id, group)  # for the conversion, within the budget
            raw.append([self._raw_reward(group, g, j, batch_id)
                        for j in range(len(group.samples))])
        out = self.reward_hook(raw) if self.reward_hook is not None else raw
        if len(out) != len(raw):
            raise ValueError(f"batch {batch_id!r}: the reward hook returned {len(out)} "
                             f"groups for {len(raw)}")
        checked: list[list[float]] = []
        for g, (got, want) in enumerate(zip(out, raw, strict=True)):
            got = list(got)
            if len(got) != len(want):
                raise ValueError(f"batch {batch_id!r} group {g}: the reward hook returned "
                                 f"{len(got)} rewards for {len(want)} samples")
            row = []
            for j, r in enumerate(got):
                value = float(r) if isinstance(r, (int, float, np.floating, np.integer)) \
                    and not isinstance(r, bool) else math.nan
                if not math.isfinite(value):
                    raise ValueError(f"batch {batch_id!r} group {g} (commit "
                                     f"{groups[g].position}) sample {j}: reward {r!r} is "
                                     "not a finite number; the batch stays planned, not "
                                     "ready: fix the reward hook and call next_batch again")
                row.append(value)
            checked.append(row)
        return checked

    def shards(self, batch_id: str, plan: Mapping[str, Any], groups: list[Accepted]
               ) -> list[RecordSetRef]:
        """Every rank's shard of the planned batch, durable (the hooks run here)."""
        rewards = self.rewards(batch_id, groups)
        owner: dict[tuple[int, int], int] = {}
        for rank, part in enumerate(plan["partition"]):
            for g, j in part:
                owner[(g, j)] = rank
        converted: dict[tuple[int, int], Mapping[str, Any]] = {}
        for g, e in enumerate(groups):  # one group at a time: captures stay lazy
            group = self.decoded.group(e)
            for j, sample in enumerate(group.samples):
                item = (self.convert_hook(sample, rewards[g][j])
                        if self.convert_hook is not None else default_convert(
                            sample, rewards[g][j]))
                if not isinstance(item, Mapping):
                    raise TypeError(f"batch {batch_id!r}: the conversion hook returned a "
                                    f"{type(item).__name__} for group {g} sample {j}; it "
                                    "returns a mapping of train data")
                converted[(g, j)] = {**item, "environment": e.environment}
        digest = plan["digest"]

        def publish(rank: int) -> RecordSetRef:
            part = plan["partition"][rank]
            records, deps = shard_records(batch_id, digest, rank, self.dp_size,
                                          [converted[(g, j)] for g, j in part])
            return self.store.publish(
                records,
                submission_id=f"shard:{batch_id}:{rank}:{shard_content(records, deps)}",
                dependencies=deps)

        # every rank's shard serialized and published, at most io_concurrency at a time
        # (the payload copies and the pack writes release the GIL); all of them are
        # durable before the ready record names them
        shards = bounded_map(publish, range(self.dp_size), self.io_concurrency)
        converted.clear()  # the batch's train data: published, not held any longer
        return shards


def bounded_map(fn: Callable[[int], RecordSetRef], items: Sequence[int], bound: int
                ) -> list[RecordSetRef]:
    """``[fn(i) for i in items]``, at most ``bound`` running at once (in order; the first
    error raised once every started call ended)."""
    if bound <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    with concurrent.futures.ThreadPoolExecutor(min(bound, len(items)),
                                               thread_name_prefix="straw.rollout io") as pool:
        return list(pool.map(fn, items))


def shard_content(records: Sequence[Record], deps: Sequence[RecordSetRef]) -> str:
    """A digest of a shard's content, for its submission id: a retry after a hook changed
    its output writes a new shard instead of conflicting (the plan is what is fixed)."""
    h = hashlib.blake2b(digest_size=16)
    for r in records:
        h.update(canonical([r.record_id, r.codec, dict(r.metadata), r.tokens]))
        h.update(memoryview(r.payload).cast("B"))
    for d in deps:
        h.update(d.digest.encode())
    return h.hexdigest()


__all__ = ["Conversion", "RewardHook", "ConvertHook", "default_convert", "token_array",
           "bounded_map", "shard_content"]
