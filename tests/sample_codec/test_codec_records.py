"""The sample codec without a store: ``sample_records`` makes exactly what ``encode_sample``
publishes, ``sample_from_records`` decodes records in memory or with lazy TensorRefs, and
``tensor.tensor_from_record`` decodes one tensor.v1 record, checksums verified."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from straw import CorruptData, Record, SharedFilesystemStore, UnsupportedSchema
from straw.codec import decode_sample, encode_sample, sample_from_records, sample_records
from straw.tensor import DTYPES, TensorRef, publish_tensors, tensor_from_record, tensor_record


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with SharedFilesystemStore(str(tmp_path_factory.mktemp("pool")), "c") as s:
        yield s


def test_records_are_what_encode_sample_publishes(store):
    shared = np.arange(12, dtype=np.int64).reshape(3, 4)
    sample = {"a": [shared, shared], "b": (np.float32(2.5), "x"), "t": torch.ones(2)}
    records, deps = sample_records(sample, tokens=17)
    assert [r.codec for r in records] == ["sample.v1", "tensor.v1", "tensor.v1"]
    assert records[0].tokens == 17 and deps == []
    ref = encode_sample(store, sample, submission_id="same")
    stored = list(store.read(ref))
    assert [r.codec for r in stored] == [r.codec for r in records]
    assert [bytes(memoryview(r.payload)) for r in stored[1:]] == \
        [bytes(memoryview(r.payload).cast("B")) for r in records[1:]]
    for back in (sample_from_records(records), sample_from_records(stored),
                 decode_sample(store, ref)):
        assert back["a"][0] is back["a"][1]  # stored once, decoded to one object
        assert np.array_equal(back["a"][0], shared) and back["b"][1] == "x"
        assert np.array_equal(np.asarray(back["t"]), np.ones(2, np.float32))
    lazy = sample_from_records(stored, tensors=TensorRef.from_record_set_many(store, ref),
                               lazy_tensors_over=0)
    assert isinstance(lazy["a"][0], TensorRef) and lazy["a"][0].shape == (3, 4)


def test_tensor_refs_in_a_sample_are_dependencies(store):
    (t,) = publish_tensors(store, {"x": np.zeros(3, np.uint8)}, submission_id="dep")
    records, deps = sample_records({"x": t})
    assert deps == [t.publication] and len(records) == 1
    back = sample_from_records(records, store=store)
    assert isinstance(back["x"], TensorRef) and back["x"].load().tolist() == [0, 0, 0]


def test_not_a_sample_is_refused():
    with pytest.raises(UnsupportedSchema, match="record 0 is json.v1"):
        sample_from_records([Record("s", b"{}", "json.v1")])
    with pytest.raises(UnsupportedSchema, match="none"):
        sample_from_records([])
    records, _ = sample_records([1])
    with pytest.raises(UnsupportedSchema, match="format 9"):
        sample_from_records([dataclasses.replace(records[0], metadata={"format": 9})])
    with pytest.raises(CorruptData, match="does not decode"):
        sample_from_records([dataclasses.replace(records[0], payload=b"\xc1")])


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_tensor_from_record_round_trips(dtype):
    for shape in [(), (0, 3), (5,), (2, 3, 4)]:
        a = (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape)
        back = tensor_from_record(tensor_record(a, "t", chunk_bytes=8))
        assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)
        assert back.flags.writeable  # a copy, not a view of the record's buffer


def test_tensor_from_record_refuses_damage():
    rec = tensor_record(np.arange(100, dtype=np.int32), "t", chunk_bytes=64)
    raw = bytearray(bytes(memoryview(rec.payload)))
    raw[300] ^= 0x10
    with pytest.raises(CorruptData, match="chunk checksums"):
        tensor_from_record(dataclasses.replace(rec, payload=bytes(raw)))
    with pytest.raises(UnsupportedSchema, match="does not make"):
        tensor_from_record(dataclasses.replace(rec, metadata={**rec.metadata, "shape": [99]}))
    with pytest.raises(UnsupportedSchema, match="not a tensor.v1 record"):
        tensor_from_record(Record("t", b"", "bytes.v1"))


# --- the fast path of plain samples ---------------------------------------------------
def _walked(value, registry=None):
    """Record 0's bytes as the full walk (``_Encoder``) makes them."""
    import msgpack

    from straw.codec import DEFAULT_REGISTRY
    from straw.sample_codec.encode import _Encoder
    enc = _Encoder(DEFAULT_REGISTRY if registry is None else registry)
    return msgpack.packb(enc.enc(value, "sample", 0), use_bin_type=True)


_plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.text(max_size=4) | st.integers(-5, 5) | st.binary(max_size=3), kids, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.lists(_plain_values, max_size=3) | st.dictionaries(st.text(max_size=4),
                                                               _plain_values, max_size=4))
def test_plain_samples_pack_at_once_with_the_walks_bytes(value):
    from straw.codec import DEFAULT_REGISTRY
    from straw.sample_codec.encode import _plain_body
    body = _plain_body(value, DEFAULT_REGISTRY)
    assert body is not None  # taken: lists, dicts and plain values only
    assert body == _walked(value)
    (record,), deps = sample_records(value, tokens=3)
    assert bytes(record.payload) == body and deps == [] and record.tokens == 3
    assert record.metadata == {"format": 1, "tensors": 0}
    assert _walked(sample_from_records([record])) == body  # decodes to the same (NaN too)


def test_what_plain_packing_cannot_say_goes_through_the_walk():
    from straw.codec import DEFAULT_REGISTRY, MAX_DEPTH, Registry
    from straw.sample_codec.encode import _plain_body

    class Text(str):
        pass

    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    loop: list = [1]
    loop.append(loop)
    walked_only = [
        {"a": (1, 2)}, [{(1, 2): "tuple key"}], [2**64], {"n": -(2**63) - 1},
        [bytearray(b"x")], [np.int64(3)],
        {"t": np.zeros(2)}, 5, "text", (1,),
    ]
    for value in walked_only:
        assert _plain_body(value, DEFAULT_REGISTRY) is None, value
        (rec, *_), _ = sample_records(value)
        assert bytes(rec.payload) == _walked(value)  # the walk's own encoding
    for value, error, cls in ((deep, "deeper", ValueError), (loop, "cycle", ValueError),
                              ({"m": memoryview(b"x")}, "memoryview", TypeError),
                              ([Text("s")], "Text", TypeError)):  # exact types only
        assert _plain_body(value, DEFAULT_REGISTRY) is None  # (msgpack would pack these)
        with pytest.raises(cls, match=error):
            sample_records(value)
    # a registry that encodes list itself: every list goes through its encoder
    reg = Registry()
    reg.register(list, "test.list", 1, lambda x: {"items": tuple(x)}, lambda v: list(v))
    assert _plain_body([1, 2], reg) is None
    (rec,), _ = sample_records([1, 2], registry=reg)
    assert bytes(rec.payload) == _walked([1, 2], reg) != _walked([1, 2])
