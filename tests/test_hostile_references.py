"""References and inputs that must be refused at once (issue 11, findings 9-15).

A pool is read by code that did not write it: references arrive edited, fabricated or
stale, and the files under the pool may be swapped, replaced or damaged.  Every test here
is named after the finding it pins down; retries are counted through an injected clock
(``SleepCounter``), never timed.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading

import numpy as np
import pytest

import straw.read.buffers as read_buffers
import straw.tensors.buffers as tensor_buffers
from straw import (
    CorruptData,
    InvalidReference,
    Record,
    RecordSetRef,
    SharedFilesystemStore,
)
from straw.clock import ManualClock
from straw.coordinator import Coordinator
from straw.fs import PosixFS
from straw.protocol import TaskSpec
from straw.read.extent_reader import CHUNK
from straw.tensor import TensorRef, publish_tensors
from tests.refedit import edited, payload_at


def _store(root, **kw) -> SharedFilesystemStore:
    kw.setdefault("reserve_bytes", 1 << 20)
    kw.setdefault("writer_id", "w")  # a named writer: these tests restart it
    return SharedFilesystemStore(str(root), "run", **kw)


class SleepCounter(ManualClock):
    """A ManualClock that records every sleep (the visibility retries)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)


class InodeRecorder(PosixFS):
    """PosixFS that records the inode of every file it opens, however it was opened."""

    def __init__(self) -> None:
        self.inodes: list[int] = []

    def _record(self, fd: int) -> int:
        self.inodes.append(os.fstat(fd).st_ino)
        return fd

    def open(self, path, **kw):  # type: ignore[no-untyped-def]
        return self._record(super().open(path, **kw))

    def open_beneath(self, root, rel):  # type: ignore[no-untyped-def]
        return self._record(super().open_beneath(root, rel))


def _flipped(hex_digits: str) -> str:
    return ("1" if hex_digits[0] == "0" else "0") + hex_digits[1:]


# --- (9) a pool directory swapped for a symlink ------------------------------------------

def _pool_and_impostor(tmp_path):  # type: ignore[no-untyped-def]
    """A pool with one publication, and outside it a pack at the same relative path and
    offset holding other bytes (what a swapped directory would lead to)."""
    pool, other = tmp_path / "pool", tmp_path / "other"
    with _store(pool) as store:
        ref = store.publish([Record("a", b"pool" * 100)], submission_id="s")
    with _store(other) as store:
        fake = store.publish([Record("a", b"evil" * 100)], submission_id="s")
    assert (fake.path, fake.offset, fake.size) == (ref.path, ref.offset, ref.size)
    victim = str(pool / "runs/run/writers/w")
    outside = str(other / "runs/run/writers/w")
    return pool, ref, victim, outside, os.stat(other / fake.path).st_ino


class SwappingFS(InodeRecorder):
    """Once armed, swaps ``victim`` (a pool directory) for a symlink to ``outside``, or
    back, before every open and every path resolution: an adversary winning every race
    between two filesystem calls, deterministically."""

    def __init__(self, victim: str, outside: str) -> None:
        super().__init__()
        self.victim, self.outside = victim, outside
        self.armed = False
        self.swapped = False

    def toggle(self) -> None:
        if not self.armed:
            return
        if self.swapped:
            os.unlink(self.victim)
            os.rename(self.victim + ".real", self.victim)
        else:
            os.rename(self.victim, self.victim + ".real")
            os.symlink(self.outside, self.victim)
        self.swapped = not self.swapped

    def realpath(self, path):  # type: ignore[no-untyped-def]
        self.toggle()
        return super().realpath(path)

    def open(self, path, **kw):  # type: ignore[no-untyped-def]
        self.toggle()
        return super().open(path, **kw)

    def open_beneath(self, root, rel):  # type: ignore[no-untyped-def]
        self.toggle()
        return super().open_beneath(root, rel)


def test_pool_directory_swapped_for_a_symlink_is_never_followed(tmp_path):
    pool, ref, victim, outside, outside_inode = _pool_and_impostor(tmp_path)
    fs = SwappingFS(victim, outside)
    results: list[object] = []
    with _store(pool, fs=fs, clock=SleepCounter()) as reader:
        fs.armed = True
        for i in range(16):
            if i % 2:
                fs.toggle()  # shift the phase: every call meets both states
            with reader.read_session() as s:
                try:
                    results.append(bytes(next(s.read(ref)).payload))
                except InvalidReference as e:
                    assert "symbolic link" in str(e)
                    results.append(e)
        if fs.swapped:
            fs.toggle()
        fs.armed = False
    assert outside_inode not in fs.inodes, "a file outside the pool was opened"
    assert all(r == b"pool" * 100 or isinstance(r, InvalidReference) for r in results)
    assert b"pool" * 100 in results  # reads through the real directory work
    assert any(isinstance(r, InvalidReference) for r in results)  # the swap was met


def test_pool_directory_swapped_by_another_thread_is_never_followed(tmp_path):
    pool, ref, victim, outside, outside_inode = _pool_and_impostor(tmp_path)
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            os.rename(victim, victim + ".real")
            os.symlink(outside, victim)
            os.unlink(victim)
            os.rename(victim + ".real", victim)

    fs = InodeRecorder()
    thread = threading.Thread(target=swapper)
    ok = 0
    with _store(pool, fs=fs, clock=ManualClock()) as reader:
        thread.start()
        try:
            for _ in range(300):
                with reader.read_session() as s:
                    try:
                        assert bytes(next(s.read(ref)).payload) == b"pool" * 100
                        ok += 1
                    except (InvalidReference, CorruptData):
                        pass  # met the symlink, or the moment the directory was away
        finally:
            stop.set()
            thread.join()
        assert bytes(next(reader.read(ref)).payload) == b"pool" * 100
    assert outside_inode not in fs.inodes, "a file outside the pool was opened"


# --- (10) a FIFO or another non-regular file at a pack path ----------------------------

@pytest.mark.parametrize("kind", ["fifo", "fifo-with-writer", "directory", "socket"])
def test_non_regular_file_at_a_pack_path_is_refused_at_once(tmp_path, monkeypatch, kind):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x" * 100)], submission_id="s")
    pack = tmp_path / ref.path
    pack.unlink()
    holders: list[object] = []
    if kind.startswith("fifo"):
        os.mkfifo(pack)
        if kind == "fifo-with-writer":  # then even an open that blocks returns
            holders.append(os.open(pack, os.O_RDWR | os.O_NONBLOCK))
    elif kind == "directory":
        pack.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX)
        monkeypatch.chdir(pack.parent)  # a socket path must be short
        sock.bind(pack.name)
        holders.append(sock)
    clock = SleepCounter()
    outcome: list[BaseException | None] = []

    def read(reader: SharedFilesystemStore) -> None:
        try:
            reader.read(ref)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    try:
        with _store(tmp_path, clock=clock) as reader:
            t = threading.Thread(target=read, args=(reader,), daemon=True)
            t.start()
            t.join(timeout=60)  # a guard against hanging the suite, not a timing check
            assert not t.is_alive(), f"read() blocked on a {kind}"
    finally:
        for h in holders:
            if isinstance(h, int):
                os.close(h)
            else:
                h.close()  # type: ignore[attr-defined]
    assert isinstance(outcome[0], InvalidReference), outcome
    assert "not a regular file" in str(outcome[0])
    assert clock.sleeps == []


# --- (11) sizes validated against the file before any allocation -----------------------

@pytest.mark.parametrize("size", [8 << 30, 1 << 40])
@pytest.mark.parametrize("sealed", [True, False])
def test_huge_size_in_an_edited_reference_is_refused_before_allocation(
        tmp_path, monkeypatch, size, sealed):
    allocated: list[int] = []
    real_alloc = read_buffers.alloc

    def recording_alloc(n: int) -> memoryview:
        allocated.append(n)
        return real_alloc(n)

    monkeypatch.setattr(read_buffers, "alloc", recording_alloc)
    clock = SleepCounter()
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x" * 1000)], submission_id="s")
        if sealed:
            store.seal()
        bad = edited(ref, size=size)
        with _store(tmp_path, clock=clock) as reader:
            for call in (reader.read, reader.validate, reader.manifest):
                with pytest.raises(InvalidReference):
                    call(bad)
            assert bytes(next(reader.read(ref)).payload) == b"x" * 1000
        file_size = os.path.getsize(tmp_path / ref.path)
    # nothing beyond the file, except the bounded buffers of a first read
    assert max(allocated) <= max(file_size, CHUNK)
    assert clock.sleeps == []


def test_huge_tensor_shape_is_refused_before_allocation(tmp_path, monkeypatch):
    requested: list[int] = []
    real_take = tensor_buffers._BufferCache.take

    def recording_take(self, nbytes: int):  # type: ignore[no-untyped-def]
        requested.append(nbytes)
        return real_take(self, nbytes)

    monkeypatch.setattr(tensor_buffers._BufferCache, "take", recording_take)
    rows = 1 << 38
    with _store(tmp_path) as store:
        (t,) = publish_tensors(store, {"x": np.arange(32, dtype=np.float32).reshape(4, 8)},
                               submission_id="t")
        shape_only = dataclasses.replace(t, shape=(rows, 8))  # disagrees with nbytes
        consistent = dataclasses.replace(t, shape=(rows, 8), nbytes=rows * 32)
        with_size = dataclasses.replace(t, record_ref=edited(t.record, size=rows * 64),
                                        shape=(rows, 8), nbytes=rows * 32)
        d = t.to_dict()
        d["shape"], d["nbytes"] = [rows, 8], rows * 32
        d["record_ref"]["segment"]["size"] = rows * 64
        from_dict = TensorRef.from_dict(d)
        for forged in (shape_only, consistent, with_size, from_dict):
            bound = forged.using(store)
            with pytest.raises(InvalidReference):
                bound.load()
            with pytest.raises(InvalidReference):
                bound[0:rows]
            with pytest.raises(InvalidReference):
                bound.rows(1, rows)
        assert np.array_equal(t.load(), np.arange(32, dtype=np.float32).reshape(4, 8))
    assert all(n <= 128 for n in requested), requested


# --- (12) edited digest or records ------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [("digest", None), ("records", 2),
                                              ("records", 0)])
def test_edited_digest_or_records_is_refused_naming_the_field(tmp_path, field, value):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
        bad = edited(ref, **{field: _flipped(ref.digest) if value is None
                                          else value})
        assert bytes(next(store.read(ref)).payload) == b"x"  # the real one is cached now
        with _store(tmp_path) as reader:
            for r in (store, reader):
                for call in (r.read, r.validate, r.manifest):
                    with pytest.raises(InvalidReference, match=field):
                        call(bad)
            with reader.read_session() as s:
                with pytest.raises(InvalidReference, match=field):
                    s.read(bad)


# --- (13) no visibility retries on a final pack ----------------------------------------

def _sealed_pool(tmp_path, payload: bytes) -> tuple[RecordSetRef, RecordSetRef]:
    with _store(tmp_path) as store:
        before = store.publish([Record("before", b"b" * 50)], submission_id="s0")
        return before, store.publish([Record("a", payload)], submission_id="s1")


@pytest.mark.parametrize(("damage", "expected"), [
    ("offset past the end", InvalidReference),
    ("size past the end", InvalidReference),
    ("truncated inside the extent", CorruptData),
    ("truncated before the extent", CorruptData),
    ("zeroed extent", CorruptData),
    ("deleted", CorruptData),
    ("reclaimed", InvalidReference),
    ("zero record with a flipped byte", CorruptData),
])
def test_sealed_pack_failures_are_immediate(tmp_path, damage, expected):
    payload = bytes(20000) if damage == "zero record with a flipped byte" else b"x" * 500
    before, ref = _sealed_pool(tmp_path, payload)
    pack = tmp_path / ref.path
    data = bytearray(pack.read_bytes())
    bad = ref
    if damage == "offset past the end":
        bad = edited(ref, offset=len(data) + 4096)
    elif damage == "size past the end":
        bad = edited(ref, size=ref.size + 4096)
    elif damage == "truncated inside the extent":
        pack.write_bytes(data[:ref.offset + ref.size // 2])
    elif damage == "truncated before the extent":
        pack.write_bytes(data[:ref.offset])
    elif damage == "zeroed extent":
        data[ref.offset:ref.offset + ref.size] = bytes(ref.size)
        pack.write_bytes(data)
    elif damage == "deleted":
        pack.unlink()
    elif damage == "zero record with a flipped byte":
        with _store(tmp_path) as probe:
            (rec,) = probe.validate(ref)
            at = payload_at(probe, rec)[1]
        data[at + 5] ^= 0x01
        pack.write_bytes(data)
    clock = SleepCounter()
    with _store(tmp_path, clock=clock) as reader:
        if damage == "reclaimed":
            assert reader.release_publications([ref]) == 1
            assert reader.collect_garbage()["reclaimed_files"] == 0  # "before" keeps it
            assert reader.release_publications([before]) == 1
            assert reader.collect_garbage()["tombstoned"] == [ref.path]
        for call in (reader.read, reader.validate):
            with pytest.raises(expected):
                call(bad)
    assert clock.sleeps == [], f"{damage}: a final pack was retried"


# --- (14) names match the whole string --------------------------------------------------

def test_names_with_a_trailing_newline_are_refused(tmp_path):
    for kw in ({"run_id": "run\n"}, {"writer_id": "w\n"}, {"codecs": ("mine.v1\n",)}):
        args = {"run_id": "run", **kw}
        with pytest.raises(ValueError, match="not a valid name"):
            SharedFilesystemStore(str(tmp_path / "p"), **args)  # type: ignore[arg-type]
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
        for name in ("queue_id", "namespace"):
            with pytest.raises(ValueError, match=name):
                Coordinator(store, **{name: "q\n"})  # type: ignore[arg-type]
        for field in ("path", "checksum", "digest"):
            bad = edited(ref, **{field: getattr(ref, field) + "\n"})
            with pytest.raises(InvalidReference, match=field if field != "path" else "pack path"):
                RecordSetRef.from_dict(bad.to_dict())
            with pytest.raises(InvalidReference):
                store.read(bad)
            with pytest.raises(InvalidReference):
                store.retain("app", [bad])


# --- (15) fabricated dependencies and retained references -------------------------------

def _fabrications(sealed: RecordSetRef, open_: RecordSetRef) -> dict[str, RecordSetRef]:
    never = sealed.path.replace("pack-000001", "pack-000099")
    return {
        "checksum": edited(sealed, checksum=_flipped(sealed.checksum)),
        "size": edited(sealed, size=sealed.size + 8),
        "offset of the pack header": edited(sealed, offset=0),
        "offset inside an extent": edited(sealed, offset=sealed.offset + 8),
        "pack never written": edited(sealed, path=never),
        "checksum in an open pack": edited(open_, checksum=_flipped(open_.checksum)),
        "size in an open pack": edited(open_, size=open_.size + 8),
    }


def test_fabricated_dependency_or_retained_reference_is_refused(tmp_path):
    clock = SleepCounter()
    with _store(tmp_path, clock=clock) as store:
        sealed = store.publish([Record("a", b"a" * 100)], submission_id="a")
        store.seal()
        open_ = store.publish([Record("b", b"b" * 100)], submission_id="b")
        for label, bad in _fabrications(sealed, open_).items():
            with pytest.raises(InvalidReference, match=r"dependencies\[0\]"):
                store.publish([Record("c", b"c")], submission_id=f"dep-{label}",
                              dependencies=[bad])
            assert store.lookup_submission(f"dep-{label}") is None, label
            with pytest.raises(InvalidReference, match=r"refs\[1\]"):
                store.retain("app", [sealed, bad])
            assert "app" not in store.owners(), label
            with pytest.raises(InvalidReference):
                with store.pin([bad]):
                    pass
        # the real ones are accepted
        store.publish([Record("c", b"c")], submission_id="dep", dependencies=[sealed, open_])
        store.retain("app", [sealed, open_])
        with store.pin([sealed, open_]):
            pass
    assert clock.sleeps == []


def test_queue_refuses_references_that_name_no_publication(tmp_path):
    clock = SleepCounter()
    with _store(tmp_path, clock=clock) as store:
        good = store.publish([Record("prompt", b"p")], submission_id="in")
        store.seal()
        fabricated = _fabrications(good, store.publish([Record("o", b"o")], submission_id="o"))
        q = Coordinator(store, queue_id="work", lease_seconds=10)
        try:
            for label, bad in fabricated.items():
                with pytest.raises(InvalidReference):
                    q.submit_tasks(f"r-{label}", [TaskSpec(f"t-{label}", input_ref=bad)])
            assert q.pending_tasks() == []
            q.submit_tasks("r", [TaskSpec("t", input_ref=good)])
            (a,) = q.acquire("w0").assignments
            bad = fabricated["pack never written"]
            with pytest.raises(InvalidReference):
                q.yield_tasks([{"lease": a.lease, "input_ref": bad}], request_id="y")
            token = q.open_consumer("training", exclusive_owner="the test")
            with pytest.raises(InvalidReference):
                q.save_consumer_state("training", token=token, request_id="s", state_ref=bad,
                                      fetch_cursor=0, processed_cursor=0)
            with pytest.raises(InvalidReference):
                q.register_checkpoint("c", bad, cursor=0)
            result = store.publish([Record("out", b"r", metadata={
                "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})], submission_id="out")
            with pytest.raises(InvalidReference):
                q.complete_task(a.lease, submission_id="done",
                                result_ref=edited(result, digest=_flipped(
                                    result.digest)))
            q.complete_task(a.lease, submission_id="done", result_ref=result)
            with store.catalog.locked() as st:
                roots = set(st.owners.get(q.owner, ()))
            for label in ("offset of the pack header", "offset inside an extent",
                          "pack never written"):
                assert (fabricated[label].path, fabricated[label].offset) not in roots, label
        finally:
            q.close()
    assert clock.sleeps == []
