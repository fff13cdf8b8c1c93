"""straw.rollout.shards, layout version 2 (columnar): the keys every sample of a shard
holds as a 1-D NumPy array (the token ids) are one tensor record per shard, read back as
views; everything else is stored per sample as before; a version 1 shard still loads; a
column that disagrees with its samples is ``CorruptData``.  And the builder's own
collection is used as written, not parsed back from the pool."""

from __future__ import annotations

import numpy as np
import pytest

from straw import CorruptData, SharedFilesystemStore, UnsupportedSchema
from straw.codec import sample_records
from straw.rollout import BatchBuilder, EnvironmentMix, RankBatchRef
from straw.rollout import builder as builder_module
from straw.rollout.shards import SHARD_SCHEMA, SHARD_VERSION, shard_records
from straw.tensor import TensorRef, publish_tensors

from .pool import Pool, make_group


@pytest.fixture
def store(tmp_path):
    s = SharedFilesystemStore(str(tmp_path / "pool"), "job")
    yield s
    s.close()


@pytest.fixture
def pool(tmp_path):
    p = Pool(str(tmp_path / "pool"))
    yield p
    p.close()


def _samples(n: int) -> list[dict]:
    return [{"tokens": np.arange(i, i + 3 + i % 4, dtype=np.int32),
             "loss_mask": np.ones(3 + i % 4, dtype=np.float32) * i,
             "reward": float(i), "index": i, "metadata": {"k": [i]}}
            for i in range(n)]


def _publish(store, records, deps=(), sid="shard"):
    return store.publish(records, submission_id=sid, dependencies=list(deps))


def test_columns_are_one_tensor_record_per_shard_whatever_the_sample_count(store):
    samples = _samples(64)
    records, deps = shard_records("batch:b", "d", 0, 1, samples)
    # record 0 plus one tensor record per column (tokens, loss_mask): not one per sample
    assert len(records) == 3 and [r.codec for r in records[1:]] == ["tensor.v1"] * 2
    ref = _publish(store, records, deps)
    shard = RankBatchRef("batch:b", "d", 0, 1, ref).load(store, rank=0)
    assert len(shard.samples) == 64
    for got, want in zip(shard.samples, samples, strict=True):
        assert set(got) == set(want)
        for k in ("tokens", "loss_mask"):
            assert type(got[k]) is np.ndarray and got[k].dtype == want[k].dtype
            assert got[k].tolist() == want[k].tolist()
        assert (got["reward"], got["index"], got["metadata"]) == \
            (want["reward"], want["index"], want["metadata"])
    assert shard.tokens == sum(len(s["tokens"]) for s in samples)
    # the samples' arrays are views of one array read once
    bases = [s["tokens"].base for s in shard.samples]
    assert all(b is not None for b in bases) and len({id(b) for b in bases}) == 1


def test_a_large_column_is_read_even_above_the_lazy_bound(store):
    samples = _samples(8)
    ref = _publish(store, *shard_records("batch:b", "d", 0, 1, samples))
    shard = RankBatchRef("batch:b", "d", 0, 1, ref).load(store, lazy_tensors_over=0)
    assert [s["tokens"].tolist() for s in shard.samples] == \
        [s["tokens"].tolist() for s in samples]


def test_values_that_are_not_columns_stay_per_sample(store):
    torch = pytest.importorskip("torch")
    shared = np.arange(5, dtype=np.int64)
    samples = [{"tokens": np.arange(4, dtype=np.int32) + i,
                "t": torch.arange(3) + i,                      # torch: kept as torch
                "grid": np.zeros((2, 2), dtype=np.int32) + i,  # 2-D: not a column
                "same": shared,                                # one object twice
                "some": np.arange(2) if i else None}           # not in every sample
               for i in range(2)]
    records, deps = shard_records("batch:b", "d", 0, 1, samples)
    ref = _publish(store, records, deps)
    got = RankBatchRef("batch:b", "d", 0, 1, ref).load(store).samples
    assert [s["tokens"].tolist() for s in got] == [[0, 1, 2, 3], [1, 2, 3, 4]]
    assert [s["t"].tolist() for s in got] == [[0, 1, 2], [1, 2, 3]]
    assert isinstance(got[0]["t"], torch.Tensor)
    assert [s["grid"].tolist() for s in got] == [[[0, 0], [0, 0]], [[1, 1], [1, 1]]]
    assert got[0]["same"] is got[1]["same"]  # decoded to one object, as stored
    assert got[0]["some"] is None and got[1]["some"].tolist() == [0, 1]
    # tokens: one column record; t, grid (x2), same (once), some: per-sample records
    assert len(records) == 1 + 1 + 2 + 2 + 1 + 1


def test_lazy_captures_stay_references_next_to_columns(store):
    (routes,) = publish_tensors(store, {"routes": np.zeros((6, 2, 2), dtype=np.int32)},
                                submission_id="routes")
    samples = [{"tokens": np.arange(7, dtype=np.int32), "routes": routes}]
    records, deps = shard_records("batch:b", "d", 0, 1, samples)
    ref = _publish(store, records, deps)
    (got,) = RankBatchRef("batch:b", "d", 0, 1, ref).load(store).samples
    assert isinstance(got["routes"], TensorRef) and got["tokens"].tolist() == list(range(7))


def test_a_version_1_shard_still_loads(store):
    samples = _samples(3)
    value = {"schema": SHARD_SCHEMA, "version": 1, "batch_id": "batch:b",
             "plan_digest": "d", "rank": 0, "world": 1, "samples": samples}
    ref = _publish(store, *sample_records(value))
    got = RankBatchRef("batch:b", "d", 0, 1, ref).load(store).samples
    assert [s["tokens"].tolist() for s in got] == [s["tokens"].tolist() for s in samples]


@pytest.mark.parametrize("version", [0, 3, "2"])
def test_a_shard_of_an_unknown_version_is_unsupported_schema(store, version):
    value = {"schema": SHARD_SCHEMA, "version": version, "batch_id": "batch:b",
             "plan_digest": "d", "rank": 0, "world": 1, "samples": [], "columns": {}}
    ref = _publish(store, *sample_records(value))
    with pytest.raises(UnsupportedSchema, match="version"):
        RankBatchRef("batch:b", "d", 0, 1, ref).load(store)


def _crafted(store, columns, samples=None, sid="crafted"):
    value = {"schema": SHARD_SCHEMA, "version": SHARD_VERSION, "batch_id": "batch:b",
             "plan_digest": "d", "rank": 0, "world": 1,
             "samples": [{"index": 0}, {"index": 1}] if samples is None else samples,
             "columns": columns}
    return RankBatchRef("batch:b", "d", 0, 1, _publish(store, *sample_records(value),
                                                        sid=sid))


@pytest.mark.parametrize("columns", [
    {"tokens": {"data": np.arange(5, dtype=np.int32), "lengths": [2, 2]}},   # sum != 5
    {"tokens": {"data": np.arange(4, dtype=np.int32), "lengths": [4]}},      # 1 length
    {"tokens": {"data": np.arange(4, dtype=np.int32), "lengths": [5, -1]}},  # negative
    {"tokens": {"data": np.zeros((2, 2), dtype=np.int32), "lengths": [1, 1]}},  # 2-D
    {"tokens": {"data": [1, 2], "lengths": [1, 1]}},                          # no array
    {"tokens": [1, 2]},                                                       # no mapping
])
def test_a_column_that_disagrees_with_its_samples_is_corrupt_data(store, columns):
    ref = _crafted(store, columns, sid=f"crafted:{columns!r}")
    with pytest.raises(CorruptData, match="column 'tokens'"):
        ref.load(store)


def test_a_column_that_is_also_a_sample_key_is_corrupt_data(store):
    ref = _crafted(store, {"index": {"data": np.arange(2, dtype=np.int32),
                                     "lengths": [1, 1]}})
    with pytest.raises(CorruptData, match="also a key"):
        ref.load(store)


def test_the_builder_uses_its_own_collection_as_written(pool, monkeypatch):
    """The collection a builder just committed is not read and parsed back (twice: for
    the plan and when the scan passes its commit); a builder that did not write it
    (restarted) reads it from the pool, with the same plan."""
    parsed = []
    real = builder_module.Accepted.from_dict
    monkeypatch.setattr(builder_module.Accepted, "from_dict",
                        classmethod(lambda cls, v: parsed.append(v) or real(v)))
    pool.accept([make_group(i, n=2) for i in range(6)])
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(3), dp_size=1) as b:
        refs = b.next_batch(0)
        assert parsed == [] and b.collections.own == {}
        assert b.metrics()["backlog"] == 3
        digest = refs[0].plan_digest
        # a failing hook leaves batch 1 planned, not ready: a new builder replays it
        b.convert_hook = lambda sample, reward: 1 / 0
        with pytest.raises(ZeroDivisionError):
            b.next_batch(1)
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(3), dp_size=1) as b:
        assert b.next_batch(0)[0].plan_digest == digest  # ready: returned again
        parsed.clear()
        refs = b.next_batch(1)  # collected by the first builder: read from the pool
        assert len(parsed) >= 3
        assert sorted(s["group_index"] for s in refs[0].load(pool.store).samples) == \
            [3, 3, 4, 4, 5, 5]
