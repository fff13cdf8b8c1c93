"""Bad input and faults: every rejection names the field; corruption fails closed (D6);
a torn publication is never returned; visibility lag is retried a bounded number of times;
nothing outside the pool is ever opened."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest
import xxhash

from straw import (
    CorruptData,
    InvalidReference,
    Publication,
    Record,
    RecordSetRef,
    SharedFilesystemStore,
    StorageUnavailable,
    UnsupportedSchema,
)
from straw.clock import ManualClock
from straw.fs import PosixFS
from tests.refedit import edited, payload_at


def _store(root, **kw) -> SharedFilesystemStore:
    kw.setdefault("reserve_bytes", 1 << 20)
    kw.setdefault("writer_id", "w")  # a named writer: these tests restart it
    return SharedFilesystemStore(str(root), "run", **kw)


# --- bad input --------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("records", "exc", "match"),
    [
        ([Record("a", 123)], TypeError, r"records\[0\]\.payload must be a bytes-like"),
        ([Record("a", "text")], TypeError, r"records\[0\]\.payload is a str"),
        ([Record("a", [1, 2])], TypeError, r"payload must be a bytes-like"),
        ([Record(7, b"x")], TypeError, r"records\[0\]\.record_id must be a str"),  # type: ignore[arg-type]
        ([Record("", b"x")], ValueError, r"record_id must be a non-empty"),
        ([Record("a", b"x"), Record("a", b"y")], ValueError, r"records\[1\]\.record_id 'a' is a duplicate"),
        ([Record("a", b"x", codec="nope.v1")], ValueError, r"codec 'nope.v1' is not registered"),
        ([Record("a", b"x", codec=3)], TypeError, r"codec must be a str"),  # type: ignore[arg-type]
        ([Record("a", b"x", metadata={"v": float("nan")})], ValueError, r"metadata\['v'\].*finite"),
        ([Record("a", b"x", metadata={"v": [1, float("inf")]})], ValueError, r"finite"),
        ([Record("a", b"x", metadata={"v": {1, 2}})], TypeError, r"metadata\['v'\] is a set"),
        ([Record("a", b"x", metadata={"v": b"raw"})], TypeError, r"is a bytes"),
        ([Record("a", b"x", metadata={1: "int key"})], TypeError, r"keys must be str"),
        ([Record("a", b"x", metadata=["not", "a", "dict"])], TypeError, r"metadata must be a dict"),  # type: ignore[arg-type]
        ([Record("a", b"x", tokens=-1)], ValueError, r"tokens must be a 64-bit int in 0\.\.2\*\*64-1"),
        ([Record("a", np.arange(10)[::2])], ValueError, r"not C-contiguous"),
        (["not a record"], TypeError, r"records\[0\] must be a straw.Record"),
        ("abc", TypeError, r"records must be a list"),
    ],
)
def test_bad_records_are_rejected_naming_the_field(tmp_path, records, exc, match):
    with _store(tmp_path) as store:
        with pytest.raises(exc, match=match):
            store.publish(records, submission_id="s")
        # nothing was written: the rejected call created no pack
        assert store.disk_usage()["pack_files"] == 0


def test_bad_ids_and_dependencies(tmp_path):
    with _store(tmp_path) as store:
        with pytest.raises(TypeError, match="submission_id must be a str"):
            store.publish([Record("a", b"x")], submission_id=5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="submission_id must be a non-empty"):
            store.publish([Record("a", b"x")], submission_id="")
        with pytest.raises(ValueError, match=r"dependencies\[0\] = 0 must index an earlier"):
            store.publish_many([Publication([Record("a", b"x")], dependencies=[0])],
                               submission_id="s")
        with pytest.raises(ValueError, match="index dependencies only exist inside"):
            store.publish([Record("a", b"x")], submission_id="s", dependencies=[0])  # type: ignore[list-item]
        with pytest.raises(TypeError, match=r"dependencies\[0\] must be a RecordSetRef"):
            store.publish([Record("a", b"x")], submission_id="s", dependencies=["x"])  # type: ignore[list-item]
        ref = store.publish([Record("a", b"x")], submission_id="ok")
        other_run = edited(ref, run_id="other",
                                        path=ref.path.replace("runs/run/", "runs/other/"))
        with pytest.raises(InvalidReference, match="run 'other'"):
            store.publish([Record("b", b"y")], submission_id="s2", dependencies=[other_run])
    with pytest.raises(ValueError, match="run_id"):
        SharedFilesystemStore(str(tmp_path), "../escape")
    with pytest.raises(ValueError, match="writer_id"):
        SharedFilesystemStore(str(tmp_path), "run", writer_id="a/b")
    with pytest.raises(ValueError, match="segment_target_bytes"):  # (0: a pack per write)
        SharedFilesystemStore(str(tmp_path), "run", segment_target_bytes=-1)


def test_registered_codec_and_numpy_without_cast(tmp_path):
    with _store(tmp_path, codecs=("document.v1",)) as store:
        arr = np.arange(12, dtype=np.float64).reshape(3, 4)
        ref = store.publish([Record("d", arr, codec="document.v1")], submission_id="s")
        (rec,) = store.read(ref)
        assert rec.codec == "document.v1"
        assert np.array_equal(np.frombuffer(rec.payload, np.float64).reshape(3, 4), arr)


# --- references that leave the pool -----------------------------------------------------

class RecordingFS(PosixFS):
    """PosixFS that remembers every path it opened (``open_beneath``: once opened)."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    def open(self, path, **kw):  # type: ignore[no-untyped-def]
        self.opened.append(path)
        return super().open(path, **kw)

    def open_beneath(self, root, rel):  # type: ignore[no-untyped-def]
        fd = super().open_beneath(root, rel)
        self.opened.append(os.path.join(root, rel))
        return fd


def test_references_outside_the_pool_are_refused_without_opening(tmp_path):
    pool = tmp_path / "pool"
    outside = tmp_path / "outside"
    outside.mkdir()
    fs = RecordingFS()
    with _store(pool, fs=fs) as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
        # a real file outside the pool, shaped like a pack
        shutil.copy(pool / ref.path, outside / "secret.pack")
        inc_dir = os.path.dirname(ref.path)
        bad_paths = [
            "/etc/passwd",
            str(outside / "secret.pack"),
            "runs/run/../../outside/secret.pack",
            f"{inc_dir}/../../../../../outside/secret.pack",
            "runs/run/writers/default/i000001/../pack-000001.pack",
            "runs/run/writers/default/i000001/pack-1.bin",
            "",
        ]
        for p in bad_paths:
            bad = edited(ref, path=p)
            with pytest.raises(InvalidReference):
                store.read(bad)
            with pytest.raises(InvalidReference):
                RecordSetRef.from_dict(bad.to_dict())
        # another run id
        with pytest.raises(InvalidReference, match="run"):
            store.read(edited(
                ref, run_id="other", path=ref.path.replace("runs/run/", "runs/other/")))
        # a symlink inside the pool that leaves it
        link_dir = pool / "runs" / "run" / "writers" / "evil" / "i000001"
        link_dir.mkdir(parents=True)
        os.symlink(outside / "secret.pack", link_dir / "pack-000001.pack")
        evil = edited(ref, path="runs/run/writers/evil/i000001/pack-000001.pack")
        with pytest.raises(InvalidReference, match="outside the pool"):
            store.read(evil)
        # a symlinked directory leaving the pool
        os.symlink(outside, pool / "runs" / "run" / "writers" / "evil2")
        evil2 = edited(ref, path="runs/run/writers/evil2/i000001/pack-000001.pack")
        with pytest.raises(InvalidReference, match="outside the pool"):
            store.read(evil2)
    root = os.path.realpath(pool)
    assert all(os.path.realpath(p).startswith(root + os.sep) for p in fs.opened), fs.opened


# --- corruption (D6) --------------------------------------------------------------------

def test_flipped_byte_anywhere_in_an_extent_is_corrupt_at_once(tmp_path):
    clock = ManualClock()
    with _store(tmp_path, clock=clock) as store:
        before = store.publish([Record("before", b"b" * 50)], submission_id="s0")
        ref = store.publish([Record("a", b"A" * 40, metadata={"m": 1}), Record("b", b"B" * 30)],
                            submission_id="s1")
        after = store.publish([Record("after", b"c" * 50)], submission_id="s2")
    pack = tmp_path / ref.path
    original = pack.read_bytes()
    for i in range(ref.offset, ref.offset + ref.size):
        data = bytearray(original)
        data[i] ^= 0x01
        pack.write_bytes(data)
        t0 = clock.now()
        with _store(tmp_path, clock=clock) as store:
            with pytest.raises(CorruptData):
                store.read(ref)
            with pytest.raises(CorruptData):
                store.validate(ref)
            # other extents of the same pack still read
            assert bytes(next(store.read(before)).payload) == b"b" * 50
            assert bytes(next(store.read(after)).payload) == b"c" * 50
        assert clock.now() == t0, "corruption must not be retried"
    pack.write_bytes(original)


def test_read_record_checks_only_what_it_reads(tmp_path):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"A" * 1000), Record("b", b"B" * 1000)],
                            submission_id="s")
        a, b = store.validate(ref)
        b_at = payload_at(store, b)[1]
    pack = tmp_path / ref.path
    data = bytearray(pack.read_bytes())
    data[b_at + 10] ^= 0xFF
    pack.write_bytes(data)
    with _store(tmp_path) as store:
        assert bytes(store.read_record(a).payload) == b"A" * 1000
        with pytest.raises(CorruptData, match="'b'"):
            store.read_record(b)
        with pytest.raises(CorruptData):
            store.read(ref)


# --- torn publications ------------------------------------------------------------------

def test_pack_cut_inside_an_unacknowledged_publication(tmp_path):
    src = tmp_path / "src"
    with _store(src) as store:
        acked = [store.publish([Record(f"r{i}", bytes([i]) * (100 + i))], submission_id=f"s{i}")
                 for i in range(3)]
        torn = store.publish([Record("torn", b"T" * 300)], submission_id="torn")
        pack_rel = torn.path
        # the pack as it was when the writer died: before its seal at close()
        snapshot = (src / pack_rel).read_bytes()[: torn.offset + torn.size]
    cuts = list(range(torn.offset, torn.offset + torn.size))
    for cut in cuts:
        work = tmp_path / f"cut{cut}"
        shutil.copytree(src, work)
        damaged = bytearray(snapshot[:cut])
        if cut % 2:  # also a torn sector of garbage after the cut
            damaged += bytes((cut * 7 + k) % 251 for k in range(64))
        (work / pack_rel).write_bytes(damaged)
        with _store(work, clock=ManualClock()) as store:
            for i, ref in enumerate(acked):
                assert bytes(next(store.read(ref)).payload) == bytes([i]) * (100 + i)
            assert store.lookup_submission("torn") is None
            assert store.lookup_submission("s2") == (acked[2],)
            with pytest.raises((CorruptData, StorageUnavailable, InvalidReference)):
                store.read(torn)
            # the next writer starts cleanly and republishes under the same id
            again = store.publish([Record("torn", b"T" * 300)], submission_id="torn")
            assert again.path != pack_rel
            assert bytes(next(store.read(again)).payload) == b"T" * 300
        shutil.rmtree(work)


def test_torn_batch_counts_only_when_complete(tmp_path):
    with _store(tmp_path) as store:
        refs = store.publish_many([Publication([Record("a", b"1" * 100)]),
                                   Publication([Record("b", b"2" * 100)])],
                                  submission_id="batch")
        pack = tmp_path / refs[0].path
        data = pack.read_bytes()[: refs[1].offset + refs[1].size - 5]
    pack.write_bytes(data)
    with _store(tmp_path) as store:
        assert store.lookup_submission("batch") is None


# --- format versions --------------------------------------------------------------------

def _rewrite_header(data: bytearray, offset: int, version: int) -> None:
    fields = list(struct.unpack_from("<4sHHQQ16s16s", data, offset))
    fields[1] = version
    first = struct.pack("<4sHHQQ16s", *fields[:6])
    data[offset:offset + 56] = first + xxhash.xxh3_128_digest(first)


def test_unknown_versions_are_unsupported_schema(tmp_path):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x")], submission_id="s")
    pack = tmp_path / ref.path
    data = bytearray(pack.read_bytes())
    _rewrite_header(data, ref.offset, 2)
    pack.write_bytes(data)
    with _store(tmp_path) as store:
        with pytest.raises(UnsupportedSchema, match="version 2"):
            store.read(ref)
    (tmp_path / "POOL").write_text('{"format": "straw-pool", "version": 99}')
    with pytest.raises(UnsupportedSchema, match="format version 99"):
        _store(tmp_path)


# --- visibility lag ---------------------------------------------------------------------
# Lag is only possible while a pack is not final: these writers keep their packs open.

class SleepCounter(ManualClock):
    """A ManualClock that records every sleep (the visibility retries)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)


class LaggingFS(PosixFS):
    """Reads of packs come back short for the first ``lag`` attempts (another client's
    view)."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.reads = 0
        self.packs: set[int] = set()

    def open_beneath(self, root, rel):  # type: ignore[no-untyped-def]
        fd = super().open_beneath(root, rel)
        self.packs.add(fd)
        return fd

    def close(self, fd):  # type: ignore[no-untyped-def]
        self.packs.discard(fd)
        super().close(fd)

    def readinto(self, fd, buffer, offset):  # type: ignore[no-untyped-def]
        if fd in self.packs:
            self.reads += 1
            if self.reads <= self.lag:
                return 0
        return super().readinto(fd, buffer, offset)


def test_short_file_is_retried_a_bounded_number_of_times(tmp_path):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x" * 500)], submission_id="s")
        clock = SleepCounter()
        # lag that resolves: the read succeeds after reopening
        fs = LaggingFS(0)
        with _store(tmp_path, fs=fs, clock=clock) as reader:
            fs.lag = fs.reads + 3
            assert bytes(next(reader.read(ref)).payload) == b"x" * 500
        # lag that never resolves: StorageUnavailable after exactly the configured retries
        fs = LaggingFS(0)
        with _store(tmp_path, fs=fs, clock=clock, visibility_retries=4) as reader:
            fs.lag, before = 10**9, len(clock.sleeps)
            with pytest.raises(StorageUnavailable, match="after 4 retries"):
                reader.read(ref)
            assert len(clock.sleeps) - before == 4
        # a real short file (the writer's data not there yet) behaves the same
        pack = tmp_path / ref.path
        pack.write_bytes(pack.read_bytes()[: ref.offset + ref.size // 2])
        with _store(tmp_path, clock=clock, visibility_retries=2) as reader:
            with pytest.raises(StorageUnavailable, match="holds"):
                reader.read(ref)


def test_reserved_zeros_are_lag_not_corruption(tmp_path):
    with _store(tmp_path) as store:
        ref = store.publish([Record("a", b"x" * 500)], submission_id="s")
        pack = tmp_path / ref.path
        data = bytearray(pack.read_bytes())
        data[ref.offset:ref.offset + ref.size] = bytes(ref.size)
        pack.write_bytes(data)
        with _store(tmp_path, clock=ManualClock(), visibility_retries=2) as reader:
            with pytest.raises(StorageUnavailable, match="zeros"):
                reader.read(ref)


class PartlyVisibleFS(PosixFS):
    """Another client's view of fresh data: pages from ``boundary`` on still read as zeros
    for the first ``lag`` reads (found on JuiceFS by the queue fuzz); with ``stale_head``
    the page *before* ``boundary`` does instead (that client cached it, reserved zeros,
    while reading the previous extent; found on JuiceFS by the queue fuzz, seed 505)."""

    def __init__(self, boundary: int, lag: int, stale_head: bool = False) -> None:
        self.boundary = boundary
        self.lag = lag
        self.stale_head = stale_head

    def readinto(self, fd, buffer, offset):  # type: ignore[no-untyped-def]
        n = super().readinto(fd, buffer, offset)
        if self.lag > 0 and offset < self.boundary < offset + n:
            self.lag -= 1
            cut = self.boundary - offset
            view = memoryview(buffer).cast("B")
            if self.stale_head:
                view[:cut] = bytes(cut)
            else:
                view[cut:n] = bytes(n - cut)
        return n


class StalePageFS(PosixFS):
    """Another client's page cache: the page holding ``boundary`` was cached while it
    still held reserved zeros from ``boundary`` on, and survives every reopen (the file's
    size did not change) until this client drops it (``drop_cached``)."""

    def __init__(self, boundary: int) -> None:
        self.boundary = boundary
        self.page = boundary - boundary % 4096
        self.cached = False
        self.drops: list[tuple[int, int]] = []

    def drop_cached(self, fd, offset, length):  # type: ignore[no-untyped-def]
        self.drops.append((offset, length))
        if offset < self.page + 4096 and offset + length > self.page:
            self.cached = False  # PosixFS widens the range to whole pages
        super().drop_cached(fd, offset, length)

    def readinto(self, fd, buffer, offset):  # type: ignore[no-untyped-def]
        n = super().readinto(fd, buffer, offset)
        lo, hi = max(offset, self.boundary), min(offset + n, self.page + 4096)
        if self.cached and lo < hi:
            memoryview(buffer).cast("B")[lo - offset:hi - offset] = bytes(hi - lo)
        return n


def test_a_stale_cached_page_is_dropped_by_the_visibility_retry(tmp_path):
    """A page cached before another client wrote into it (reserved space: same size) can
    survive reopening; the retry drops the range's cached pages, so the read succeeds
    instead of ending in StorageUnavailable (seen once on JuiceFS in CI: an extent at
    offset 3766 of a fresh pack read as zeros through 8 reopening retries)."""
    with _store(tmp_path) as store:
        first = store.publish([Record("a", b"x" * 100)], submission_id="a")
        ref = store.publish([Record("b", b"y" * 200)], submission_id="b")
        assert ref.offset // 4096 == first.offset // 4096  # same page
        fs = StalePageFS(ref.offset)
        with _store(tmp_path, fs=fs, clock=ManualClock()) as reader:
            fs.cached = True
            assert bytes(next(reader.read(ref)).payload) == b"y" * 200
            assert not fs.cached and fs.drops
            lo, length = fs.drops[0]
            assert lo <= ref.offset and lo + length >= ref.offset + 56  # its header
            fs.drops.clear()
            assert bytes(next(reader.read(first)).payload) == b"x" * 100
            assert fs.drops == []  # a read that finds its bytes drops nothing


def test_drop_cached_is_harmless_on_a_real_file(tmp_path):
    fs = PosixFS()
    path = str(tmp_path / "f")
    fd = fs.open(path, write=True, create=True)
    try:
        fs.writev(fd, [b"z" * 10000], 0)
        fs.drop_cached(fd, 5, 7000)
        fs.drop_cached(fd, 0, 0)
        buf = bytearray(10000)
        assert fs.readinto(fd, buf, 0) == 10000 and bytes(buf) == b"z" * 10000
    finally:
        fs.close(fd)


@pytest.mark.parametrize("where", ["header", "header-stale-head", "body"])
def test_partly_visible_fresh_data_is_lag_not_corruption(tmp_path, where):
    with _store(tmp_path / "probe") as probe:  # learn the pad extent's overhead
        trial = probe.publish([Record("pad", b"p" * 100)], submission_id="pad")
    overhead = trial.size - 100
    with _store(tmp_path) as store:  # the next extent starts 30 bytes before a page end
        pad = store.publish([Record("pad", b"p" * (4096 - 30 - trial.offset - overhead))],
                            submission_id="pad")
        ref = store.publish([Record("a", b"x" * 9000)], submission_id="s")
        boundary = (ref.offset // 4096 + 1) * 4096
        if where.startswith("header"):
            assert ref.offset % 4096 > 4096 - 56, "the header must straddle a page boundary"
        else:
            boundary += 4096
        clock = ManualClock()
        fs = PartlyVisibleFS(boundary, lag=0, stale_head=where == "header-stale-head")
        with _store(tmp_path, fs=fs, clock=clock) as reader:
            fs.lag = 2
            assert bytes(next(reader.read(ref)).payload) == b"x" * 9000
            assert clock.now() > 1_000_000.0  # it waited for the data instead of failing
            fs.lag = 10**9  # the zeros never go away: corruption after the bounded retries
            with pytest.raises(CorruptData):
                with reader.read_session() as s:
                    s.read(ref)
    del pad
