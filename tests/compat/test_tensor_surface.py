"""The tensor surface of straw-queue 0.1.6 (``straw.tensor``), written as a straw-queue user
writes it, served by straw's engine; and the issue-12 bug of a reference read through a
store of another pool with the same run id."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import threading

import numpy as np
import pytest
import torch

from straw import Record, RecordRef, RecordSetRef, SharedFilesystemStore
from straw.clock import ManualClock
from straw.errors import (
    CorruptData,
    IdempotencyConflict,
    InvalidReference,
    TensorMismatch,
    UnsupportedSchema,
)
from straw.tensor import TensorRef, publish_tensors, tensor_record

CODECS = ("bytes.v1", "json.v1", "tensor.v1")

# straw-queue 0.1.6's fields, in its order, with its defaults (then ours)
STRAW_QUEUE_FIELDS = [
    ("path", dataclasses.MISSING), ("shape", dataclasses.MISSING),
    ("dtype", dataclasses.MISSING), ("nbytes", dataclasses.MISSING), ("kind", None),
    ("validated", False), ("offset", -1), ("checksum", None), ("codecs", CODECS),
    ("record_ref", None), ("root", ""), ("run_id", ""), ("blob_set", None),
    ("blob_ordinal", 0)]


def _store(root, run="tensors", **kw):
    return SharedFilesystemStore(root, run, codecs=CODECS, online_gc=True, **kw)


def _publish(store, sid="features-1"):
    return publish_tensors(store, {
        "features": np.arange(24, dtype=np.float32).reshape(6, 4),
        "scores": torch.ones(6, dtype=torch.float32)}, submission_id=sid)


def test_fields_names_order_and_defaults_are_straw_queues():
    fields = dataclasses.fields(TensorRef)
    got = [(f.name, f.default) for f in fields[:len(STRAW_QUEUE_FIELDS)]]
    assert got == STRAW_QUEUE_FIELDS
    assert [f.name for f in fields[len(STRAW_QUEUE_FIELDS):]] == [
        "source", "chunk_bytes", "pool_id"]


def test_publish_fills_the_fields_as_straw_queue_does(tmp_path):
    with _store(tmp_path) as store:
        features, scores = _publish(store)
        assert (features.kind, scores.kind) == ("features", "scores")
        assert features.validated and scores.validated
        assert (features.shape, features.dtype, features.nbytes) == ((6, 4), "float32", 96)
        assert (features.offset, features.checksum) == (-1, None)
        assert features.run_id == "tensors" and features.root == store.root
        assert features.path == os.path.join(store.root, features.record_ref.segment.path)
        assert os.path.isfile(features.path)
        assert features.codecs == tuple(sorted(store.codecs))
        assert features.blob_set == scores.blob_set
        assert (features.blob_ordinal, scores.blob_ordinal) == (0, 1)
        assert features.pool_id == store.pool_id is not None
        # record ids are straw-queue's: "<record_prefix or submission_id>:<name>"
        ids = [r.record_id for r in store.read(features.blob_set)]
        assert ids == ["features-1:features", "features-1:scores"]
        (p,) = publish_tensors(store, {"x": np.zeros(2)}, submission_id="s2",
                               record_prefix="job")
        assert [r.record_id for r in store.read(p.blob_set)] == ["job:x"]
        assert len(features) == 6 and features.torch_dtype is torch.float32


def test_tensor_record_takes_the_value_first(tmp_path):
    rec = tensor_record(torch.arange(3), "a", kind="alpha")
    assert (rec.record_id, rec.codec, rec.metadata["kind"]) == ("a", "tensor.v1", "alpha")
    assert tensor_record(np.zeros(2), "b").metadata["kind"] is None
    with pytest.raises(TypeError, match="swap"):  # the older straw call shape
        tensor_record("a", np.zeros(2))
    with _store(tmp_path) as store:
        pub = store.publish([tensor_record(torch.arange(3), "a"), Record("m", b"{}", "json.v1"),
                             tensor_record(torch.ones(2), "b", kind="b")], submission_id="m")
        restored = TensorRef.from_record_set_many(store, pub)
        assert sorted(restored) == [0, 2]
        assert restored[0].load().tolist() == [0, 1, 2]
        assert restored[0].kind is None and restored[2].kind == "b"
        assert restored[2].share(store, submission_id="reuse") == (pub, 2)
        assert not restored[0].validated
        assert TensorRef.from_record_set(store, pub, 2, validated=True).validated
        with pytest.raises(UnsupportedSchema):
            TensorRef.from_record_set(store, pub, 1)  # not a tensor record
        with pytest.raises(InvalidReference):
            TensorRef.from_record_set(store, pub, 3)


def test_load_is_torch_and_slices_are_contiguous_rows(tmp_path):
    with _store(tmp_path) as store:
        features, scores = _publish(store)
        got = features.load()
        assert isinstance(got, torch.Tensor)  # published from NumPy: torch, as straw-queue
        assert torch.equal(got, torch.arange(24, dtype=torch.float32).reshape(6, 4))
        assert torch.equal(features[1:3], got[1:3]) and features[4:2].shape == (0, 4)
        assert isinstance(features.load(framework="numpy"), np.ndarray)  # ours
        with pytest.raises(TypeError):
            features[::2]


def test_json_asdict_pickle_and_dict_round_trips(tmp_path):
    with _store(tmp_path) as store:
        features, _ = _publish(store)
        raw = json.loads(json.dumps(dataclasses.asdict(features)))
        raw["record_ref"] = RecordRef.from_dict(raw["record_ref"])
        raw["blob_set"] = RecordSetRef.from_dict(raw["blob_set"])
        rebuilt = TensorRef(**raw)
        assert rebuilt == features and hash(rebuilt) == hash(features)
        data = pickle.dumps(features)
        assert len(data) < 1024
        back = pickle.loads(data)
        assert back == features and getattr(back, "_reader", None) is None
        assert torch.equal(back.load(), features.load())
        assert TensorRef.from_dict(features.to_dict()) == features
        assert TensorRef.from_dict(json.loads(json.dumps(features.to_dict()))) == features
        marked = dataclasses.replace(features, validated=True, kind="features")
        assert pickle.loads(pickle.dumps(marked)) == marked


def test_an_earlier_straws_dict_is_read(tmp_path):
    with _store(tmp_path) as store:
        features, _ = _publish(store)
        earlier = {"record": features.record_ref.to_dict(), "name": "features",
                   "shape": [6, 4], "dtype": "float32", "source": "numpy",
                   "chunk_bytes": features.chunk_bytes, "root": store.root,
                   "publication": features.blob_set.to_dict()}
        ref = TensorRef.from_dict(earlier)
        assert (ref.kind, ref.nbytes, ref.blob_set, ref.blob_ordinal) == (
            "features", 96, features.blob_set, 0)
        assert torch.equal(ref.using(store).load(), features.load())


@pytest.mark.parametrize("change", [{"shape": (12, 2)}, {"dtype": "int32"}, {"nbytes": 48},
                                    {"shape": (6, 2)}])
def test_an_edited_descriptor_is_corrupt_data_before_any_payload_read(tmp_path, change):
    with _store(tmp_path) as store:
        features, _ = _publish(store)
        bad = dataclasses.replace(features, **change)
        for call in (bad.load, bad.validate, lambda: bad[0:0], lambda: bad[1:2],
                     lambda: bad._bytes(0, 0)):
            with pytest.raises(CorruptData, match="Typed tensor") as err:
                call()
            assert isinstance(err.value, InvalidReference)  # (ours: TensorMismatch)
            assert isinstance(err.value, TensorMismatch)
        features.validate()
        assert features._bytes(16, 32) == features.load().numpy().tobytes()[16:32]


def test_link_shares_storage_and_share(tmp_path):
    with _store(tmp_path / "a") as store, _store(tmp_path / "b") as other:
        features, scores = _publish(store)
        target = tmp_path / "linked"
        assert features.link(target) is features and not target.exists()
        assert features.shares_storage(store) and not features.shares_storage(other)
        assert scores.share(store, submission_id="s") == (scores.blob_set, 1)
        bare = TensorRef.from_record(store, scores.record_ref)
        assert bare.blob_set is None and torch.equal(bare.load(), scores.load())
        wrapped, ordinal = bare.share(store, submission_id="wrap")
        assert ordinal == 0 and wrapped.records == 1
        assert torch.equal(TensorRef.from_record_set(store, wrapped, 0).load(),
                           scores.load())
        with pytest.raises(InvalidReference, match="different storage"):
            features.share(other, submission_id="x")


# --- issue 12: a TensorRef read through a store of another pool with the same run id ----

def test_another_pool_with_the_same_run_id_fails_at_once_naming_both(tmp_path):
    clock = ManualClock()
    with _store(tmp_path / "one") as store, \
            _store(tmp_path / "two", clock=clock, visibility_backoff=5.0) as other:
        features, _ = _publish(store)
        other_features, _ = _publish(other)  # the same run id, the same publication
        assert store.pool_id != other.pool_id
        start = clock.now()
        calls = [lambda: features.load(reader=other),
                 lambda: features.load(reader=other.read_session()),
                 lambda: features.using(other),
                 lambda: pickle.loads(pickle.dumps(features)).using(other)[0:1],
                 lambda: TensorRef.from_record_set_many(store, features.blob_set,
                                                        reader=other.read_session()),
                 lambda: features._bytes(0, 4, reader=other)]
        for call in calls:
            with pytest.raises(InvalidReference) as err:
                call()
            text = str(err.value)
            assert store.pool_id in text and other.pool_id in text, text
            assert store.root in text and other.root in text, text
        assert clock.now() == start  # no retry window was spent
        assert torch.equal(other_features.load(reader=other), features.load())


def test_an_unbound_reference_refuses_another_pool_now_at_its_root(tmp_path):
    root = tmp_path / "pool"
    with _store(root) as store:
        features, _ = _publish(store)
        pool_id = store.pool_id
    data = pickle.dumps(features)
    os.rename(root, tmp_path / "moved")
    with _store(root) as impostor:  # another pool, same root and run id
        with pytest.raises(InvalidReference, match="same run id") as err:
            pickle.loads(data).load()
        assert pool_id in str(err.value) and impostor.pool_id in str(err.value)


# --- pool identity ----------------------------------------------------------------------

def test_pool_id_is_written_once_at_creation(tmp_path):
    with _store(tmp_path) as a, _store(tmp_path, run="another-run") as b:
        marker = json.loads((tmp_path / "POOL").read_text())
        assert marker["pool_id"] == a.pool_id == b.pool_id
        assert a.read_session().pool_id == a.pool_id


def test_an_older_pools_marker_gets_one_id_under_its_lock(tmp_path):
    with _store(tmp_path) as store:
        (old,) = publish_tensors(store, {"x": np.arange(4)}, submission_id="x")
    (tmp_path / "POOL").write_text(json.dumps({"format": "straw-pool", "version": 1}))
    ids: list[str | None] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            with _store(tmp_path) as s:
                ids.append(s.pool_id)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(ids) == 8
    assert len(set(ids)) == 1 and ids[0] is not None
    marker = json.loads((tmp_path / "POOL").read_text())
    assert marker == {"format": "straw-pool", "version": 1, "pool_id": ids[0]}
    # a reference of the pool before it had an id (pool_id None) still reads
    legacy = dataclasses.replace(old, pool_id=None)
    with _store(tmp_path) as s:
        assert torch.equal(legacy.load(reader=s), torch.arange(4))


def test_chunk_bytes_set_on_the_module_is_the_policy_of_records_made_after(tmp_path,
                                                                           monkeypatch):
    """straw-queue's callers change the checksum granularity by setting
    ``straw.tensor.CHUNK_BYTES``: it is read at each call, and a record keeps the one it
    was made with (a retry under another policy is new content)."""
    import straw.tensor as tensor

    value = torch.arange(1025, dtype=torch.uint8)
    with _store(tmp_path) as store:
        monkeypatch.setattr(tensor, "CHUNK_BYTES", 34)
        made = tensor_record(value, "same:value", kind="value")
        assert made.metadata["chunk_bytes"] == 34
        # one hex checksum per chunk, listed (straw-queue's shape of the field)
        assert len(made.metadata["chunks"]) == -(-1025 // 34)
        assert all(len(c) == 32 for c in made.metadata["chunks"])
        (ref,) = publish_tensors(store, {"value": value}, submission_id="same")
        monkeypatch.setattr(tensor, "CHUNK_BYTES", 17)
        with pytest.raises(IdempotencyConflict):
            publish_tensors(store, {"value": value}, submission_id="same")
        # the original records still name the same publication; reads use the record's
        # own granularity, whatever the module says now
        assert store.publish([made], submission_id="same") == ref.blob_set
        assert torch.equal(ref[31:37], value[31:37])
        assert torch.equal(ref.load(), value)
        # an explicit chunk_bytes wins over the module's
        assert tensor_record(value, "x", chunk_bytes=512).metadata["chunk_bytes"] == 512


def test_a_record_whose_checksums_are_one_string_is_still_read(tmp_path):
    """Records of an earlier straw concatenate the chunk checksums in one str."""
    import xxhash

    value = np.arange(300, dtype=np.int32)
    raw = value.view(np.uint8)
    chunks = "".join(xxhash.xxh3_128_hexdigest(raw[i:i + 512]) for i in range(0, raw.nbytes, 512))
    meta = {"dtype": "int32", "shape": [300], "source": "numpy", "kind": "v",
            "chunk_bytes": 512, "chunks": chunks}
    with _store(tmp_path) as store:
        pub = store.publish([Record("old:v", raw.tobytes(), "tensor.v1", meta)],
                            submission_id="old")
        ref = TensorRef.from_record_set(store, pub)
        assert np.array_equal(ref.load(framework="numpy"), value)
        assert np.array_equal(ref.rows(100, 200).numpy(), value[100:200])
        bad = dict(meta, chunks="0" * len(chunks))
        pub = store.publish([Record("bad:v", raw.tobytes(), "tensor.v1", bad)],
                            submission_id="bad")
        with pytest.raises(CorruptData):
            TensorRef.from_record_set(store, pub).load()


# --- a reference outlives the store that published it -----------------------------------

def test_a_reference_loads_after_the_store_that_published_it_is_closed(tmp_path):
    # straw-queue: a TensorRef is metadata holding no descriptor; it loads on its own
    with _store(tmp_path) as store:
        features, scores = _publish(store)
        session = store.read_session()
        via_session = features.using(session)
    session.close()
    expected = np.arange(24, dtype=np.float32).reshape(6, 4)
    assert np.array_equal(features.load().numpy(), expected)
    assert np.array_equal(features[2:4].numpy(), expected[2:4])
    assert np.array_equal(via_session.load().numpy(), expected)
    assert torch.equal(scores.load(), torch.ones(6))
    features.validate()
    # every check still applies: an edited reference is refused before any payload read
    with pytest.raises(TensorMismatch):
        dataclasses.replace(features, shape=(12, 2)).load()


def test_a_reference_bound_to_a_closed_store_refuses_another_pool_at_its_root(tmp_path):
    root = tmp_path / "pool"
    with _store(root) as store:
        features, _ = _publish(store)
    os.rename(root, tmp_path / "moved")
    with _store(root):  # another pool, same root and run id
        with pytest.raises(InvalidReference, match="same run id"):
            features.load()


@pytest.mark.parametrize("value", [torch.zeros(2, dtype=torch.complex64),
                                   np.zeros(2, dtype=np.complex128),
                                   np.array([1, "a"], dtype=object)])
def test_an_unsupported_dtype_is_unsupported_schema_and_type_error(tmp_path, value):
    with _store(tmp_path) as store:
        with pytest.raises(UnsupportedSchema, match="Unsupported tensor dtype") as err:
            publish_tensors(store, {"c": value}, submission_id="c")
        assert isinstance(err.value, TypeError)  # (straw's class before)
        with pytest.raises(TypeError, match="Unsupported tensor dtype"):
            tensor_record(value, "c")
        assert store.lookup_submission("c") is None
