"""straw.tensor: round trips for every dtype and shape class, checked row slices,
corruption confined to the chunks a read touches, sharing, new versions, rejections."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import straw.tensor as T
import straw.tensors.loads as loads
from straw import CorruptData, InvalidReference, Record, SharedFilesystemStore
from straw.errors import UnsupportedSchema
from straw.tensor import (
    CHUNK_BYTES,
    DTYPES,
    TensorRef,
    publish_tensors,
    release_tensor_publications,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMPY_DTYPES = [d for d in DTYPES if d != "bfloat16"]
_counter = [0]


def sid() -> str:
    _counter[0] += 1
    return f"s{_counter[0]}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with SharedFilesystemStore(str(tmp_path_factory.mktemp("pool")), "t") as s:
        yield s


def _np_value(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _torch_value(dtype: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(_np_value("float32", shape, seed)).to(torch.bfloat16)
    return torch.from_numpy(_np_value(dtype, shape, seed))


shapes = st.one_of(
    st.just(()),  # scalar
    st.lists(st.integers(0, 5), min_size=1, max_size=3).filter(lambda s: 0 in s),  # empty
    st.lists(st.integers(1, 40), min_size=1, max_size=1),
    st.lists(st.integers(1, 9), min_size=2, max_size=4),
).map(tuple)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                            b.view(-1).view(torch.uint8) if b.numel() else b)
    return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape \
        and a.tobytes() == b.tobytes()


@given(dtype=st.sampled_from(list(DTYPES)), shape=shapes, seed=st.integers(0, 99),
       use_torch=st.booleans(), chunk=st.sampled_from([8, 64, 1000, CHUNK_BYTES]),
       data=st.data())
def test_round_trip_every_dtype_and_shape(store, dtype, shape, seed, use_torch, chunk, data):
    if dtype == "bfloat16":
        use_torch = True
    value = _torch_value(dtype, shape, seed) if use_torch else _np_value(dtype, shape, seed)
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid(), chunk_bytes=chunk)
    assert ref.shape == shape and ref.dtype == dtype
    assert ref.source == ("torch" if use_torch else "numpy")
    assert ref.nbytes == store._session.payload_location(ref.record)[0].length
    # load() is torch whenever torch is importable (straw-queue's rule); NumPy on request
    as_torch = value if use_torch else torch.from_numpy(value)
    assert _same(as_torch, ref.load())
    if not use_torch:
        assert _same(value, ref.load(framework="numpy"))
    if shape:
        a = data.draw(st.integers(-shape[0] - 2, shape[0] + 2))
        b = data.draw(st.integers(-shape[0] - 2, shape[0] + 2))
        assert _same(as_torch[a:b], ref[a:b])
    back = TensorRef.from_dict(ref.to_dict(), store)
    assert back == ref and _same(as_torch, back.load())


def test_slices_at_chunk_boundaries(store):
    value = np.arange(64 * 5, dtype=np.int32).reshape(64, 5)  # 20-byte rows
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid(), chunk_bytes=60)
    for a in range(0, 65):
        for b in (a, a + 1, a + 3, a + 7, 64):
            assert np.array_equal(ref[a:b], value[a:b]), (a, b)
    assert np.array_equal(ref[-3:], value[-3:])
    assert np.array_equal(ref[7], value[7]) and np.array_equal(ref[-1], value[-1])
    assert np.array_equal(ref.rows(10, 20), value[10:20])


def _corrupt(store, ref: TensorRef, at: int) -> None:
    path = os.path.join(store.root, ref.publication.path)
    fd = os.open(path, os.O_RDWR)
    try:
        pos = store._session.payload_location(ref.record)[2] + at
        b = os.pread(fd, 1, pos)
        os.pwrite(fd, bytes([b[0] ^ 0xFF]), pos)
    finally:
        os.close(fd)


def test_corruption_in_one_chunk_is_detected_only_by_reads_touching_it(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "t") as s:
        value = np.arange(1000, dtype=np.int64).reshape(100, 10)  # 80-byte rows
        (ref,) = publish_tensors(s, {"x": value}, submission_id="c", chunk_bytes=800)
        _corrupt(s, ref, 800 * 3 + 5)  # chunk 3 = rows 30..39
        with pytest.raises(CorruptData, match="chunk 3"):
            ref.load()
        with pytest.raises(CorruptData, match="chunk 3"):
            ref[39:41]
        with pytest.raises(CorruptData):
            ref[35]
        assert np.array_equal(ref[0:30], value[0:30])
        assert np.array_equal(ref[40:], value[40:])
        with pytest.raises(CorruptData):
            ref.load(out=np.empty_like(value))


def test_one_row_read_touches_one_chunk(store, monkeypatch):
    value = np.zeros((8192, 1024), dtype=np.float32)
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid())
    seen = []
    orig = loads.ChunkReader.read_chunks
    monkeypatch.setattr(loads.ChunkReader, "read_chunks",
                        lambda self, expected, e0, lo, hi, dst, base: (
                            seen.append((lo, hi, dst.nbytes)),
                            orig(self, expected, e0, lo, hi, dst, base)))
    ref[4097:4098]
    k = 4097 * 4096 // CHUNK_BYTES
    assert seen == [(k, k + 1, CHUNK_BYTES)]


def test_load_type_rule_and_framework(store, monkeypatch):
    t_ref, n_ref = publish_tensors(store, {"t": torch.ones(3), "n": np.ones(3)},
                                   submission_id=sid())
    # torch whenever importable, as straw-queue's load() (its callers use torch calls on
    # the result); the framework it was published from is recorded, not obeyed
    assert isinstance(t_ref.load(), torch.Tensor) and isinstance(n_ref.load(), torch.Tensor)
    assert (t_ref.source, n_ref.source) == ("torch", "numpy")
    assert isinstance(t_ref.load(framework="numpy"), np.ndarray)
    assert isinstance(n_ref.load(framework="numpy"), np.ndarray)
    assert isinstance(n_ref.load(framework="torch"), torch.Tensor)
    monkeypatch.setattr(loads, "_torch", lambda: None)  # as if torch were not importable
    assert isinstance(t_ref.load(), np.ndarray)
    with pytest.raises(ImportError):
        n_ref.load(framework="torch")
    with pytest.raises(ValueError):
        n_ref.load(framework="jax")


def test_bfloat16_without_numpy_support(store, monkeypatch):
    value = torch.tensor([[1.5, -2.0], [3.25, float("inf")]], dtype=torch.bfloat16)
    (ref,) = publish_tensors(store, {"b": value}, submission_id=sid())
    assert torch.equal(ref.load(), value) and ref.load().dtype == torch.bfloat16
    monkeypatch.setattr(loads, "_torch", lambda: None)
    bits = ref.load()
    assert isinstance(bits, np.ndarray) and bits.shape == (2, 2)
    if bits.dtype == np.uint16:  # no ml_dtypes: the raw bit patterns
        assert torch.equal(torch.from_numpy(bits).view(torch.bfloat16), value)
    assert ref[1:2].shape == (1, 2)


def test_non_contiguous_grad_and_byteorder_inputs(store):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6).requires_grad_()
    view = base.t()[1:4]
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(20, dtype=np.int16)[::2]
    refs = publish_tensors(store, {"v": view, "big": big, "s": strided}, submission_id=sid())
    assert torch.equal(refs[0].load(), view.detach())
    big_back = refs[1].load(framework="numpy")
    assert np.array_equal(big_back, big) and big_back.dtype == np.int32
    assert np.array_equal(refs[2].load(framework="numpy"), strided)


def test_load_into_out_and_pin_memory(store):
    value = torch.randn(5, 7)
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid())
    out = torch.empty(5, 7)
    assert ref.load(out=out) is out and torch.equal(out, value)
    nout = np.empty((5, 7), np.float32)
    assert ref.load(out=nout) is nout and np.array_equal(nout, value.numpy())
    rows = torch.empty(2, 7)
    assert torch.equal(ref.rows(1, 3, out=rows), value[1:3])
    for bad in (torch.empty(5, 7, dtype=torch.float64), torch.empty(7, 5),
                torch.empty(7, 5).t(), np.empty((5, 7), np.float64)):
        with pytest.raises(ValueError):
            ref.load(out=bad)
    with pytest.raises(TypeError):
        ref.load(out=[0] * 35)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pinned = ref.load(pin_memory=True)
    assert torch.equal(pinned, value)
    if not torch.cuda.is_available():
        assert any("pin_memory" in str(x.message) for x in w)


def test_large_tensor_parallel_paths(store):
    value = torch.randn(4096, 1024)  # 16 MiB: publishing hashes chunks in the thread pool
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid())
    assert torch.equal(ref.load(), value)
    assert torch.equal(ref[100:4000], value[100:4000])


def test_slice_and_index_rejections(store):
    s_ref, v_ref = publish_tensors(store, {"s": np.float32(2.5), "v": np.arange(6)},
                                   submission_id=sid())
    assert s_ref.load() == np.float32(2.5) and s_ref.load().shape == ()
    with pytest.raises(TypeError, match="0-d"):
        s_ref[0:1]
    with pytest.raises(TypeError, match="0-d"):
        s_ref[0]
    with pytest.raises(TypeError, match="0-d"):
        len(s_ref)
    with pytest.raises(TypeError, match="step"):  # straw-queue's class
        v_ref[::2]
    with pytest.raises(IndexError):
        v_ref[6]
    with pytest.raises(TypeError):
        v_ref["a"]
    with pytest.raises(TypeError):
        v_ref[1, 2]
    assert v_ref[4:2].shape == (0,) and len(v_ref) == 6


@pytest.mark.parametrize("bad, exc", [
    ({"x": np.zeros(3, np.complex64)}, TypeError),
    ({"x": np.zeros(3, np.uint16)}, TypeError),
    ({"x": torch.zeros(3, dtype=torch.complex64)}, TypeError),
    ({"x": [1, 2, 3]}, TypeError),
    ({"x": 3.0}, TypeError),
    ({"x": np.array(["a"])}, TypeError),
    ({"x": torch.zeros(3).to_sparse()}, TypeError),
    ({1: np.zeros(3)}, TypeError),
    ({"": np.zeros(3)}, TypeError),
    ({}, ValueError),
])
def test_publish_rejections(store, bad, exc):
    with pytest.raises(exc):
        publish_tensors(store, bad, submission_id=sid())


def test_publish_rejects_non_mapping_and_bad_chunk(store):
    with pytest.raises(TypeError):
        publish_tensors(store, [np.zeros(3)], submission_id=sid())
    with pytest.raises(ValueError):
        publish_tensors(store, {"x": np.zeros(3)}, submission_id=sid(), chunk_bytes=0)


def test_serialisation_binding_and_edited_refs(store, tmp_path):
    value = np.arange(12, dtype=np.int16).reshape(3, 4)
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid())
    unbound = pickle.loads(pickle.dumps(ref))
    assert unbound == ref and getattr(unbound, "_reader", None) is None
    # a pickle names the module path callers import, whatever module holds the code:
    # references pickled by straw of either layout load in the other
    assert b"straw.tensor\x94\x8c\t_unpickle" in pickle.dumps(ref)
    assert dataclasses.asdict(ref)["shape"] == (3, 4)
    assert np.array_equal(unbound.load(), value)  # opens a read-only store at ref.root
    with SharedFilesystemStore(store.root, "t", writer_id="other") as other:
        assert np.array_equal(TensorRef.from_dict(ref.to_dict()).using(other)[1:], value[1:])
        assert np.array_equal(unbound.load(reader=other.read_session()), value)
    d = ref.to_dict()
    edited = TensorRef.from_dict({**d, "shape": [4, 3]}, store)
    with pytest.raises(InvalidReference, match="edited or stale"):
        edited.load()
    with pytest.raises(InvalidReference, match="edited or stale"):  # checked before any read
        TensorRef.from_dict({**d, "shape": [5, 4]}, store).load()
    with pytest.raises(InvalidReference):
        TensorRef.from_dict({"name": "x"})
    lost = TensorRef.from_dict({**d, "root": str(tmp_path / "nowhere")})
    with pytest.raises(InvalidReference, match="no pool"):
        lost.load()
    with SharedFilesystemStore(str(tmp_path / "p2"), "other-run") as foreign:
        with pytest.raises(InvalidReference):
            ref.using(foreign)
        with pytest.raises(InvalidReference):
            ref.share(foreign)
    with pytest.raises(TypeError):
        ref.using(object())


def test_share_updated_and_from_record_set_many(store):
    a, b = np.arange(10, dtype=np.float64).reshape(5, 2), torch.zeros(3, dtype=torch.int8)
    pub = store.publish([Record("note", b"hello"),
                         T.tensor_record(a, "a"), T.tensor_record(b, "b")], submission_id=sid())
    tensors = TensorRef.from_record_set_many(store, pub)
    assert sorted(tensors) == [1, 2]
    ra, rb = tensors[1], tensors[2]
    assert np.array_equal(ra.load(), a) and torch.equal(rb.load(), b)
    assert TensorRef.from_record_set(store, pub, 2) == rb
    with pytest.raises(UnsupportedSchema):  # straw-queue's class: not a tensor record
        TensorRef.from_record_set(store, pub, 0)
    with pytest.raises(InvalidReference):
        TensorRef.from_record_set(store, pub, 3)
    publication, ordinal = ra.share(store, submission_id="ignored")
    assert (publication, ordinal) == (pub, 1)
    user = store.publish([Record("uses", b"x")], submission_id=sid(), dependencies=[publication])
    assert store.checked_manifest(user).dependencies == (pub,)
    new = ra.updated(store, [[-1, -2]], submission_id=sid(), rows=slice(1, 2))
    expect = a.copy()
    expect[1] = [-1, -2]
    assert np.array_equal(new.load(), expect) and np.array_equal(ra.load(), a)
    assert new.publication != ra.publication
    whole = rb.updated(store, torch.ones(3, dtype=torch.int8), submission_id=sid())
    assert torch.equal(whole.load(), torch.ones(3, dtype=torch.int8))
    assert torch.equal(rb.load(), b)
    with pytest.raises(ValueError):
        rb.updated(store, torch.ones(4), submission_id=sid())


def test_release_tensor_publications(store):
    refs = publish_tensors(store, {"a": np.zeros(2), "b": np.ones(2)}, submission_id=sid())
    (other,) = publish_tensors(store, {"c": np.zeros(2)}, submission_id=sid())

    class Recording:
        released: list = []

        def release_publications(self, pubs):
            self.released.extend(pubs)

    rec = Recording()
    assert release_tensor_publications(rec, [*refs, other]) == [refs[0].publication,
                                                                  other.publication]
    assert rec.released == [refs[0].publication, other.publication]
    with pytest.raises(TypeError):
        release_tensor_publications(rec, [refs[0].publication])
    if not hasattr(store, "release_publications"):
        with pytest.raises(NotImplementedError):
            release_tensor_publications(store, refs)


def test_idempotent_publish(store):
    value = np.arange(5)
    first = publish_tensors(store, {"x": value}, submission_id="idem")
    assert publish_tensors(store, {"x": value}, submission_id="idem") == first


def test_import_without_torch(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, straw.tensor as T, straw.codec as C\n"
        "from straw import SharedFilesystemStore\n"
        f"s = SharedFilesystemStore({str(tmp_path)!r}, 'r')\n"
        "(r,) = T.publish_tensors(s, {'x': np.arange(4)}, submission_id='a')\n"
        "assert np.array_equal(r[1:3], [1, 2])\n"
        "ref = C.encode_sample(s, {'a': np.ones(2)}, submission_id='b')\n"
        "assert C.decode_sample(s, ref)['a'].tolist() == [1.0, 1.0]\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_recycled_load_buffers_never_alias_live_results(store):
    value = np.arange(1 << 19, dtype=np.float32).reshape(512, 1024)  # 2 MiB: cached buffers
    (ref,) = publish_tensors(store, {"x": value}, submission_id=sid(), chunk_bytes=1 << 16)
    first = ref.load()
    keep = first[3:5]  # a view keeps the buffer in use after `first` is gone
    del first
    second = ref.load()
    assert not np.shares_memory(keep, second)
    second[:] = -1
    assert np.array_equal(keep, value[3:5])
    t_ref = publish_tensors(store, {"t": torch.from_numpy(value)}, submission_id=sid())[0]
    a = t_ref.load()
    b = t_ref.load()
    assert a.data_ptr() != b.data_ptr()
    ptr = a.data_ptr()
    del a
    c = t_ref.load()  # the freed buffer is reused
    assert c.data_ptr() == ptr and torch.equal(c, torch.from_numpy(value))
    T.set_load_buffer_cache(0)
    try:
        assert torch.equal(t_ref.load(), c)
    finally:
        T.set_load_buffer_cache(512 << 20)
    with pytest.raises(ValueError):
        T.set_load_buffer_cache(-1)


def test_release_tensor_publications_lets_collection_reclaim_them(tmp_path):
    for release in (False, True):
        with SharedFilesystemStore(str(tmp_path / str(release)), "t") as s:
            refs = publish_tensors(s, {"a": np.zeros(3), "b": np.ones(3)}, submission_id="d")
            s.seal()
            if release:
                assert release_tensor_publications(s, refs) == [refs[0].publication]
            s.collect_garbage()
            # staged (unreleased) publications are protected; released ones are reclaimed
            assert s.disk_usage()["pack_files"] == (0 if release else 1)
            if not release:
                assert np.array_equal(refs[1].load(), np.ones(3))
