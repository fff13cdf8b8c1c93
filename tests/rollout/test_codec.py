"""straw.rollout.codec: a SampleGroup as records and back (pure), through a real store, with
lazy captures, shared TensorRef captures, and clear errors for stored data that is not a
valid group."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from straw import CorruptData, Record, SharedFilesystemStore, UnsupportedSchema
from straw.codec import sample_records
from straw.rollout.codec import (
    GROUP_SCHEMA,
    group_from_records,
    group_from_value,
    group_records,
    group_value,
)
from straw.rollout.samples import Sample, SampleGroup, Status, VersionSpan
from straw.tensor import TensorRef, publish_tensors


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with SharedFilesystemStore(str(tmp_path_factory.mktemp("pool")), "rollout") as s:
        yield s


def rich_group() -> SampleGroup:
    samples = []
    for i in range(2):
        samples.append(Sample(
            {"messages": [{"role": "user", "content": "2+2?"}], "id": 7}, tuple(range(10)), 6,
            Status.COMPLETED if i == 0 else Status.ABORTED, {"acc": 1.0} if i == 0 else None,
            (VersionSpan(0, 4, 3), VersionSpan(4, 6, "v4")), 7, 14 + i, {"turns": (1, 2)},
            routes=np.arange(9 * 4 * 2, dtype=np.int32).reshape(9, 4, 2),
            topk_ids=torch.arange(6 * 3, dtype=torch.int32).reshape(6, 3),
            topk_logprobs=-np.ones((6, 3), np.float32)))
    return SampleGroup(tuple(samples), "math", {"epoch_id": 0, "dataset_index": 3})


def same_group(a: SampleGroup, b: SampleGroup) -> bool:
    """Equal values (Sample == leaves captures out), and equal captures."""
    if a != b:
        return False
    for x, y in zip(a.samples, b.samples, strict=True):
        for name in ("routes", "topk_ids", "topk_logprobs"):
            u, v = getattr(x, name), getattr(y, name)
            if (u is None) != (v is None):
                return False
            if u is not None and not np.array_equal(np.asarray(u), np.asarray(v)):
                return False
    return True


def test_round_trip_without_a_store():
    group = rich_group()
    records, deps = group_records(group)
    assert deps == []
    assert [r.codec for r in records] == ["sample.v1"] + ["tensor.v1"] * 6
    assert records[0].tokens == group.tokens == 20
    back = group_from_records(records)
    assert same_group(back, group)
    assert back.samples[0].status is Status.COMPLETED
    assert back.samples[0].metadata == {"turns": (1, 2)}  # the tuple stays a tuple
    assert back.samples[0].versions[1].version == "v4"


def test_round_trip_through_a_store_and_lazy_captures(store):
    group = rich_group()
    records, deps = group_records(group)
    ref = store.publish(records, submission_id="group-1", dependencies=deps)
    stored = list(store.read(ref))
    assert same_group(group_from_records(stored), group)
    lazy = group_from_records(stored, tensors=TensorRef.from_record_set_many(store, ref),
                              lazy_tensors_over=0)
    routes = lazy.samples[0].routes
    assert isinstance(routes, TensorRef) and routes.shape == (9, 4, 2)
    assert np.array_equal(routes[2:4], group.samples[0].routes[2:4])  # a rank's rows only


def test_a_shared_tensor_ref_capture_is_a_dependency_not_a_copy(store):
    (shared,) = publish_tensors(store, {"routes": np.ones((5, 2, 2), np.uint8)},
                                submission_id="shared-routes")
    group = SampleGroup((Sample("p", tuple(range(6)), 3, Status.COMPLETED, 0.5,
                                group_index=0, index=0, routes=shared),))
    records, deps = group_records(group)
    assert deps == [shared.publication]
    assert [r.codec for r in records] == ["sample.v1"]  # no bytes copied
    ref = store.publish(records, submission_id="group-shared", dependencies=deps)
    back = group_from_records(store.read(ref), store=store)
    assert isinstance(back.samples[0].routes, TensorRef)
    assert np.array_equal(back.samples[0].routes.load(), np.ones((5, 2, 2), np.uint8))


def stored(value) -> list[Record]:
    records, _ = sample_records(value)
    return records


def test_stored_data_that_is_not_a_valid_group_is_refused():
    value = group_value(rich_group())
    with pytest.raises(UnsupportedSchema, match="not a straw.rollout.group"):
        group_from_records(stored({"schema": "other"}))
    with pytest.raises(UnsupportedSchema, match="version 2"):
        group_from_records(stored({**value, "version": 2}))
    nan = {**value, "samples": [{**value["samples"][0], "reward": float("nan")}]}
    with pytest.raises(CorruptData, match=r"samples\[0\] does not make a valid sample.*finite"):
        group_from_records(stored(nan))
    missing = {**value, "samples": [{k: v for k, v in value["samples"][0].items()
                                     if k != "status"}]}
    with pytest.raises(CorruptData, match="is not a stored sample"):
        group_from_records(stored(missing))
    mixed = {**value, "samples": [value["samples"][0], {**value["samples"][1], "prompt": "x"}]}
    with pytest.raises(CorruptData, match="valid group.*one prompt"):
        group_from_records(stored(mixed))
    with pytest.raises(CorruptData, match="environment"):
        group_from_value({**value, "environment": 3})
    with pytest.raises(CorruptData, match="versions"):
        group_from_records(stored({**value, "samples": [
            {**value["samples"][0], "versions": [[0, 1]]}]}))
    with pytest.raises(UnsupportedSchema, match="record 0"):
        group_from_records([Record("x", b"{}", "json.v1")])
    assert GROUP_SCHEMA == "straw.rollout.group"


def test_token_ids_are_packed_as_int32_or_int64():
    for ids, width in [((0, 5, 2**31 - 1), 4), ((-1, 2**31), 8), ((2**63 - 1, -(2**63)), 8),
                       ((), 4)]:
        group = SampleGroup((Sample("p", ids),))
        value = group_value(group)
        assert value["samples"][0]["tokens"][0] == width
        assert group_from_records(group_records(group)[0]).samples[0].tokens == ids
    with pytest.raises(ValueError, match="64-bit"):
        Sample("p", (2**63,))
    value = group_value(SampleGroup((Sample("p", (1, 2)),)))
    bad = {**value, "samples": [{**value["samples"][0], "tokens": [4, b"abc"]}]}
    with pytest.raises(CorruptData, match="token bytes"):
        group_from_records(stored(bad))


def test_a_damaged_capture_is_corrupt_data():
    records, _ = group_records(rich_group())
    damaged = bytearray(bytes(memoryview(records[1].payload)))
    damaged[0] ^= 1
    records[1] = dataclasses.replace(records[1], payload=bytes(damaged))
    with pytest.raises(CorruptData, match="chunk checksums"):
        group_from_records(records)


versions = st.one_of(st.integers(-5, 50), st.text("0123456789-vx", max_size=3))


@st.composite
def groups(draw):
    n = draw(st.integers(1, 4))
    prompt = draw(st.one_of(st.text(max_size=8), st.dictionaries(st.text(max_size=3),
                                                                 st.integers(), max_size=2)))
    samples = []
    for i in range(n):
        response = draw(st.integers(0, 6))
        tokens = tuple(draw(st.lists(st.integers(0, 2**31), min_size=response,
                                     max_size=response + 4)))
        cuts = sorted(set(draw(st.lists(st.integers(0, response), max_size=4))))
        spans = tuple(VersionSpan(a, b, draw(versions))
                      for a, b in zip(cuts, cuts[1:], strict=False) if b > a)
        reward = draw(st.one_of(st.none(), st.floats(-1e9, 1e9),
                                st.dictionaries(st.text(max_size=3), st.floats(-1, 1),
                                                max_size=2)))
        samples.append(Sample(prompt, tokens, response, draw(st.sampled_from(list(Status))),
                              reward, spans, 3, i, draw(st.dictionaries(
                                  st.text(max_size=3), st.integers(), max_size=2))))
    return SampleGroup(tuple(samples), draw(st.sampled_from(["", "a"])))


@given(groups())
def test_any_group_round_trips(group):
    records, deps = group_records(group)
    assert deps == [] and len(records) == 1
    assert group_from_records(records) == group
