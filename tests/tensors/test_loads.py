"""Tensor reads on the block path: a load reads ``_READ_BYTES`` blocks through
one descriptor and verifies every chunk as its block lands; a chunk that fails once (a
stale descriptor) is read again the checked way, damage stays ``CorruptData`` naming the
tensor and the chunk; short reads fall back to the visibility-lag rules; the block and
chunk arithmetic holds for any chunk size, block size and row range; ``out=`` buffers
that do not fit are refused, naming what fits, before anything is read."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import straw.tensor as T
import straw.tensors.loads as loads
from straw import CorruptData, InvalidReference, SharedFilesystemStore
from straw.fs import PosixFS
from straw.read.cache import PackCache
from straw.tensor import publish_tensors

MiB = 1 << 20


class TamperFS(PosixFS):
    """PosixFS whose ``readinto`` counts its calls and can, for the next calls, return
    nothing (``short``: as a file not fully visible yet) or hand back one byte flipped
    (``flip``: file offset, and how many reads covering it get the flip) — what bytes
    read through a descriptor that meanwhile went to another file look like."""

    def __init__(self) -> None:
        self.calls = 0
        self.short = 0
        self.flip_at = -1
        self.flips = 0

    def readinto(self, fd: int, buffer, offset: int) -> int:
        self.calls += 1
        if self.short:
            self.short -= 1
            return 0
        view = memoryview(buffer).cast("B")
        n = super().readinto(fd, view, offset)
        if self.flips and offset <= self.flip_at < offset + n:
            self.flips -= 1
            view[self.flip_at - offset] ^= 0xFF
        return n


def _payload_offset(ref: T.TensorRef) -> int:
    """Where the tensor's bytes start in its pack file."""
    return ref._session().payload_location(ref.record)[2]


def _flip_in_file(path: str, at: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([b[0] ^ 0xFF]), at)
    finally:
        os.close(fd)


@pytest.fixture
def tamper(tmp_path):
    fs = TamperFS()
    with SharedFilesystemStore(str(tmp_path), "t", fs=fs) as store:
        yield store, fs


def _random(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_load_reads_blocks_through_one_descriptor(tamper, monkeypatch):
    store, fs = tamper
    value = _random((1024, 1024))  # 4 MiB: four blocks of _READ_BYTES
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    assert np.array_equal(ref.load(), value)  # the manifest is cached from here on
    lookups = []
    real_fd = PackCache.fd
    monkeypatch.setattr(PackCache, "fd", lambda self, path: (lookups.append(path),
                                                            real_fd(self, path))[1])
    fs.calls = 0
    assert np.array_equal(ref.load(), value)
    assert fs.calls == value.nbytes // loads._READ_BYTES
    assert len(lookups) == 1


def test_a_chunk_that_fails_once_is_read_again_and_returned_verified(tamper):
    store, fs = tamper
    value = _random((1024, 1024), seed=1)
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    at = _payload_offset(ref)
    ref.load()  # the manifest is cached: from here on only the payload is read
    for where in (3 * MiB + 17, 5, value.nbytes - 1):  # a later block, the first, the end
        fs.flip_at, fs.flips = at + where, 1
        assert np.array_equal(ref.load(), value)
        assert fs.flips == 0  # the block read did see the flipped byte
    fs.flip_at, fs.flips = at + 2 * MiB + 3, 1
    out = np.empty_like(value)
    assert ref.load(out=out) is out and np.array_equal(out, value)
    fs.flip_at, fs.flips = at + 2 * MiB + 3, 2  # the second, checked read sees it too
    with pytest.raises(CorruptData, match=r"tensor 'x'.*chunk 8 "):
        ref.load()


def test_damage_in_a_later_block_is_corrupt_data_naming_tensor_and_chunk(tamper):
    store, _ = tamper
    value = _random((1024, 1024), seed=2)  # 4 KiB rows, 64 rows per 256 KiB chunk
    (ref,) = publish_tensors(store, {"w": value}, submission_id="a")
    at = _payload_offset(ref)
    _flip_in_file(os.path.join(store.root, ref.publication.path), at + 13 * T.CHUNK_BYTES + 9)
    for read in (ref.load, lambda: ref.load(out=np.empty_like(value)),
                 lambda: ref.rows(13 * 64 + 5, 13 * 64 + 6), lambda: ref.rows(1, 1023),
                 lambda: ref.rows(0, 14 * 64)):
        with pytest.raises(CorruptData, match=r"tensor 'w' .*chunk 13 \(bytes 3407872\.\."):
            read()
    assert np.array_equal(ref.rows(0, 13 * 64), value[:13 * 64])
    assert np.array_equal(ref.rows(14 * 64, 1024), value[14 * 64:])
    assert np.array_equal(ref.rows(14 * 64 + 3, 1000), value[14 * 64 + 3:1000])


def test_short_block_reads_fall_back_to_the_checked_read(tamper):
    store, fs = tamper
    value = _random((1024, 1024), seed=3)
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    ref.load()
    fs.calls, fs.short = 0, 1  # the first block reads as not visible yet, once
    assert np.array_equal(ref.load(), value)
    assert fs.calls == value.nbytes // loads._READ_BYTES + 1


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with SharedFilesystemStore(str(tmp_path_factory.mktemp("pool")), "t") as store:
        yield store


_published = [0]


@given(rows=st.integers(1, 60), cols=st.integers(1, 9), chunk=st.integers(1, 300),
       blocks=st.sampled_from([1, 2, 3, 7]), data=st.data())
def test_block_and_chunk_arithmetic(shared, rows, cols, chunk, blocks, data):
    """Any chunk size (rows cut anywhere), blocks of any number of chunks: every row range
    reads back exactly, and a flipped byte fails exactly the reads touching its chunk."""
    value = np.random.default_rng(rows * 1000 + cols).integers(
        -2**15, 2**15, (rows, cols), dtype=np.int16)
    saved = loads._READ_BYTES
    loads._READ_BYTES = blocks * chunk
    try:
        _published[0] += 1  # (each example's own tensor: the flip damages only it)
        (ref,) = publish_tensors(shared, {"v": value}, submission_id=f"p{_published[0]}",
                                 chunk_bytes=chunk)
        a = data.draw(st.integers(0, rows))
        b = data.draw(st.integers(a, rows))
        assert np.array_equal(ref.rows(a, b), value[a:b])
        assert np.array_equal(ref.load(), value)
        pos = data.draw(st.integers(0, value.nbytes - 1))
        _flip_in_file(os.path.join(shared.root, ref.publication.path),
                      _payload_offset(ref) + pos)
        bad = pos // chunk
        row = cols * 2
        touched = a < b and a * row // chunk <= bad <= (b * row - 1) // chunk
        if touched:
            with pytest.raises(CorruptData, match=f"chunk {bad} "):
                ref.rows(a, b)
        else:
            assert np.array_equal(ref.rows(a, b), value[a:b])
        with pytest.raises(CorruptData, match=f"chunk {bad} "):
            ref.load()
    finally:
        loads._READ_BYTES = saved


def test_out_buffers_that_do_not_fit_are_refused_before_reading(tamper):
    store, fs = tamper
    value = torch.from_numpy(_random((6, 5), seed=4))
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    ref.load()
    bad_torch = [torch.zeros(6, 5, dtype=torch.float64), torch.zeros(5, 6),
                 torch.zeros(5, 6).t(), torch.zeros(30)]
    for out in bad_torch:
        fs.calls = 0
        with pytest.raises(ValueError, match=r"contiguous CPU torch\.float32 tensor of "
                                             r"shape \[6, 5\], got"):
            ref.load(out=out)
        assert fs.calls == 0 and not out.any()
    frozen = np.zeros((6, 5), np.float32)
    frozen.flags.writeable = False
    for out in (np.zeros((6, 5), np.float64), np.zeros((5, 6), np.float32), frozen,
                np.zeros((6, 10), np.float32)[:, ::2]):
        with pytest.raises(ValueError, match=r"writable C-contiguous float32 array of shape "
                                             r"\[6, 5\], got"):
            ref.load(out=out)
        assert not out.any()
    with pytest.raises(ValueError, match=r"shape \[2, 5\]"):
        ref.rows(1, 3, out=torch.zeros(3, 5))
    with pytest.raises(TypeError, match="torch tensor or NumPy array, got bytearray"):
        ref.load(out=bytearray(120))
    fs.calls = 0
    rows = torch.zeros(2, 5)
    assert ref.rows(1, 3, out=rows) is rows and torch.equal(rows, value[1:3])


def test_the_manifest_check_runs_once_per_reference_and_session(tamper, monkeypatch):
    store, _ = tamper
    value = _random((64, 8), seed=5)
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    checks = []
    real = T.TensorRef._chunks
    monkeypatch.setattr(T.TensorRef, "_chunks",
                        lambda self, session: (checks.append(session), real(self, session))[1])
    assert np.array_equal(ref.load(), value)
    assert np.array_equal(ref.rows(3, 9), value[3:9])
    assert np.array_equal(ref.load(out=np.empty_like(value)), value)
    assert len(checks) == 1
    with store.read_session() as other:  # another session checks for itself
        assert np.array_equal(ref.using(other).load(), value) and len(checks) == 2
    # a reference edited after its original was checked is a new reference: checked, refused
    edited = dataclasses.replace(ref, shape=(32, 16))._bound(store)
    with pytest.raises(InvalidReference, match="edited or stale"):
        edited.load()


# --- two threads per load (spans of at least _PARALLEL_LOAD bytes) -----------------------


class ThreadFS(TamperFS):
    """TamperFS that records which thread made each read, can hold the first read of the
    loading thread until another thread has read a block and the other thread's first read
    until the loading thread has begun one (``rendezvous``), and can slow
    every read down (``delay``) while counting the reads in flight."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.threads: list[int] = []
        self.rendezvous = False
        self.other_read = threading.Event()
        self.loader_read = threading.Event()
        self.delay = 0.0
        self.inflight = 0
        self.guard = threading.Lock()

    def readinto(self, fd: int, buffer, offset: int) -> int:
        import threading
        import time

        me = threading.get_ident()
        with self.guard:
            self.threads.append(me)
            self.inflight += 1
        try:
            if self.rendezvous and me == self.loader:
                self.loader_read.set()
                assert self.other_read.wait(10), "no second thread read a block"
            elif self.rendezvous:
                # the helper waits for the loader's first read too: alone, it could take
                # every block before the loader claims one (a CI run saw the helper read
                # all 4 blocks of a load, the loader none)
                assert self.loader_read.wait(10), "the loading thread read no block"
            n = super().readinto(fd, buffer, offset)
            if me != self.loader:
                self.other_read.set()
            time.sleep(self.delay)
            return n
        finally:
            with self.guard:
                self.inflight -= 1


@pytest.fixture
def two_threads(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(loads, "_PARALLEL_LOAD", 2 * loads._READ_BYTES)
    monkeypatch.setattr(loads, "_use_helper", lambda nbytes: True)
    fs = ThreadFS()
    fs.loader = threading.get_ident()
    with SharedFilesystemStore(str(tmp_path), "t", fs=fs) as store:
        yield store, fs


def test_a_large_load_is_read_and_verified_by_two_threads(two_threads):
    store, fs = two_threads
    value = _random((1024, 1024), seed=6)  # 4 blocks
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    ref.load()
    fs.threads.clear()
    fs.rendezvous = True  # the loading thread waits until the helper has read a block
    out = np.empty_like(value)
    assert ref.load(out=out) is out and np.array_equal(out, value)
    assert len(set(fs.threads)) == 2 and len(fs.threads) == value.nbytes // loads._READ_BYTES
    fs.rendezvous, fs.other_read = False, type(fs.other_read)()
    assert np.array_equal(ref.rows(1, 1023), value[1:1023])


def test_damage_read_by_either_thread_is_corrupt_data(two_threads):
    store, fs = two_threads
    value = _random((1024, 1024), seed=7)
    (ref,) = publish_tensors(store, {"w": value}, submission_id="a")
    at = _payload_offset(ref)
    ref.load()
    fs.rendezvous = True  # both threads take part in every load below
    for chunk in (0, 5, 15):  # (the first block, later ones: either thread's)
        fs.other_read = type(fs.other_read)()
        fs.flip_at, fs.flips = at + chunk * T.CHUNK_BYTES + 11, 1  # once: re-read, fine
        assert np.array_equal(ref.load(), value) and fs.flips == 0
        fs.other_read = type(fs.other_read)()
        fs.flip_at, fs.flips = at + chunk * T.CHUNK_BYTES + 11, 2  # persists: damage
        with pytest.raises(CorruptData, match=rf"tensor 'w' .*chunk {chunk} "):
            ref.load()
        assert fs.inflight == 0
    fs.flips = 0
    _flip_in_file(os.path.join(store.root, ref.publication.path), at + 9 * T.CHUNK_BYTES)
    fs.other_read = type(fs.other_read)()
    with pytest.raises(CorruptData, match=r"chunk 9 "):
        ref.load(out=np.empty_like(value))


def test_a_failed_load_returns_only_after_the_helper_stopped(two_threads):
    store, fs = two_threads
    value = _random((2048, 1024), seed=8)  # 8 blocks
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    ref.load()
    fs.delay = 0.05  # every block read takes a while: the helper is mid-read at the error
    fs.rendezvous = True
    fs.flip_at, fs.flips = _payload_offset(ref) + 100, 2  # the first block is damaged
    fs.threads.clear()
    with pytest.raises(CorruptData, match="chunk 0 "):
        ref.load()
    assert fs.inflight == 0  # nothing still writes into the buffer of the failed load
    assert len(fs.threads) < value.nbytes // loads._READ_BYTES + 1  # the helper stopped early


def test_a_large_load_told_to_use_one_thread_stays_on_it(two_threads, monkeypatch):
    store, fs = two_threads
    monkeypatch.setattr(loads, "_use_helper", lambda nbytes: False)
    value = _random((1024, 1024), seed=9)
    (ref,) = publish_tensors(store, {"x": value}, submission_id="a")
    ref.load()
    fs.threads.clear()
    assert np.array_equal(ref.load(), value)
    assert set(fs.threads) == {fs.loader} and len(fs.threads) == value.nbytes // loads._READ_BYTES
