"""Writer recovery and collection that really frees (issue 11, findings 4, 5, 7, 8).

* (4) a corrupt synced extent in a pack a crash left open is reported and sealed around; the
  writer id keeps publishing;
* (5) space reservation fits a nearly full disk, and failures on a full disk leave no packs
  behind (a real small tmpfs);
* (7) collection frees what it reports: cached descriptors of reclaimed packs are dropped;
* (8) packs of a dead writer (its lock is free), and packs a live writer abandoned after an
  I/O error, are sealed on its behalf and collected.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from fault_injection.faultyfs import FaultyFS
from straw import QuotaExceeded, Record, SharedFilesystemStore, StorageUnavailable
from straw.clock import ManualClock
from straw.fs import PosixFS
from straw.read.cache import SWEEP_SECONDS
from straw.refs import RecordSetRef
from tests.tmpfs_fixture import free_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A writer process that publishes, prints its references and is SIGKILLed (no close, no
# seal: its pack stays "open" in the catalog and its lock dies with it).
_KILLED_WRITER = textwrap.dedent("""
    import json, os, signal, sys
    from straw import Record, SharedFilesystemStore
    root, writer_id, subs = sys.argv[1], sys.argv[2], sys.argv[3:]
    store = SharedFilesystemStore(root, "run", writer_id=writer_id, reserve_bytes=1 << 20)
    refs = {s: store.publish([Record(s, s.encode() * 400)], submission_id=s).to_dict()
            for s in subs}
    print(json.dumps(refs), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _killed_writer(root, writer_id: str, *subs: str) -> dict[str, RecordSetRef]:
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(root), writer_id, *subs],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == -9, proc.stderr
    return {s: RecordSetRef.from_dict(d) for s, d in json.loads(proc.stdout).items()}


def _pack_state(store: SharedFilesystemStore, path: str) -> str:
    with store.catalog.locked() as st:
        return st.packs[path].state


def _open_packs(store: SharedFilesystemStore) -> list[str]:
    with store.catalog.locked() as st:
        return sorted(p for p, i in st.packs.items() if i.state == "open" and not i.tombstoned)


def _pack_files(root) -> list[str]:
    out = []
    for d, _, names in os.walk(os.path.join(root, "runs")):
        out += [os.path.join(d, n) for n in names if n.endswith(".pack")]
    return sorted(out)


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


# --- (4) a corrupt extent in an unsealed pack -------------------------------------------

def test_unsealed_pack_with_corrupt_extent_is_sealed_and_reported(tmp_path, caplog):
    refs = _killed_writer(tmp_path, "w", "s1", "s2", "s3")
    pack = refs["s1"].path
    _flip(tmp_path / pack, refs["s2"].offset + refs["s2"].size - 10)  # synced, not last
    caplog.set_level(logging.WARNING, logger="straw")
    again = None
    for restart in range(2):  # every restart, not only the first
        with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
            assert store.lookup_submission("s1") == (refs["s1"],)  # before the damage
            # damaged: not indexed (then found where its retry published it)
            assert store.lookup_submission("s2") == (None if again is None else (again,))
            assert store.lookup_submission("s3") == (refs["s3"],)  # resumed at its group
            damaged = store.writer_info()["damaged"]
            assert [(d["pack"], d["offset"]) for d in damaged] == [(pack, refs["s2"].offset)]
            assert "synced extent damaged" in damaged[0]["reason"]
            assert _pack_state(store, pack) == "sealed"
            with store.catalog.locked() as st:
                assert st.packs[pack].offsets == {refs["s1"].offset, refs["s3"].offset}
            # the writer continues in a new pack; a retry of s2 publishes it again
            again = store.publish([Record("s2", b"s2" * 400)], submission_id="s2")
            assert again.path != pack
            assert bytes(next(store.read(again)).payload) == b"s2" * 400
            assert bytes(next(store.read(refs["s3"])).payload) == b"s3" * 400
            fresh = store.publish([Record("x", b"x")], submission_id=f"x{restart}")
            assert fresh.path != pack
    assert any("synced extent damaged" in r.getMessage() for r in caplog.records)


def test_damaged_final_group_is_reported_not_indexed(tmp_path, caplog):
    refs = _killed_writer(tmp_path, "w", "s1", "s2")
    pack = refs["s2"].path
    _flip(tmp_path / pack, refs["s2"].offset + refs["s2"].size - 10)  # complete, last group
    caplog.set_level(logging.WARNING, logger="straw")
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        assert store.lookup_submission("s1") == (refs["s1"],)
        assert store.lookup_submission("s2") is None
        damaged = store.writer_info()["damaged"]
        assert [(d["pack"], d["offset"]) for d in damaged] == [(pack, refs["s2"].offset)]
        assert "final write group damaged or torn" in damaged[0]["reason"]
    assert any("final write group" in r.getMessage() for r in caplog.records)


def test_plain_torn_tail_is_not_reported(tmp_path, caplog):
    refs = _killed_writer(tmp_path, "w", "s1", "s2")
    s2 = refs["s2"]
    with open(tmp_path / s2.path, "r+b") as f:  # the last write cut short: zeros after it
        f.seek(s2.offset + 100)
        f.write(bytes(s2.size - 100))
    caplog.set_level(logging.WARNING, logger="straw")
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        assert store.lookup_submission("s2") is None
        assert store.writer_info()["damaged"] == []
    assert not caplog.records


# --- (5) a nearly full disk -------------------------------------------------------------

def _fill(root, name: str = "filler") -> str:
    """Fill the filesystem of ``root`` with a plain file until ENOSPC."""
    path = os.path.join(root, name)
    chunk = b"f" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return path


def test_small_publication_fits_nearly_full_disk_with_default_reserve(small_tmpfs):
    assert free_bytes(small_tmpfs) < 64 << 20  # less than the default reservation
    with SharedFilesystemStore(small_tmpfs, "run") as store:
        ref = store.publish([Record("a", b"0123456789")], submission_id="s")
        assert bytes(next(store.read(ref)).payload) == b"0123456789"
        big = store.publish([Record("b", b"b" * (1 << 20))], submission_id="big")
        assert bytes(next(store.read(big)).payload) == b"b" * (1 << 20)


def test_full_disk_publication_failures_leak_no_packs(small_tmpfs):
    root = os.path.join(small_tmpfs, "pool")
    with SharedFilesystemStore(root, "run", writer_id="w") as store:
        first = store.publish([Record("a", b"a" * 100)], submission_id="first")
        filler = _fill(small_tmpfs)
        published = [first]
        payload = b"p" * (256 << 10)
        for i in range(64):  # use up what the open pack reserved
            try:
                published.append(store.publish([Record("p", payload)], submission_id=f"p{i}"))
            except QuotaExceeded:
                break
        else:
            pytest.fail("the disk never filled up")
        for i in range(20):
            with pytest.raises(QuotaExceeded):
                store.publish([Record("p", payload)], submission_id=f"fail{i}")
        store.collect_garbage()  # works on a full disk: nothing to write
        assert len(_pack_files(root)) == 1
        assert _open_packs(store) == [first.path]
        os.unlink(filler)
        after = store.publish([Record("p", payload)], submission_id="after")
        for ref in published + [after]:
            assert store.read(ref)
    with SharedFilesystemStore(root, "run", writer_id="w") as store:
        assert store.lookup_submission("after") == (after,)
        assert store.lookup_submission("fail0") is None


def test_full_disk_pack_creation_failures_leave_nothing_after_collection(small_tmpfs):
    root = os.path.join(small_tmpfs, "pool")
    with SharedFilesystemStore(root, "run", writer_id="other") as other:
        other.publish([Record("a", b"a")], submission_id="a")  # the catalog exists
    filler = _fill(small_tmpfs)
    with SharedFilesystemStore(root, "run", writer_id="w") as store:
        for i in range(20):
            with pytest.raises(QuotaExceeded):
                store.publish([Record("p", b"p" * 100)], submission_id=f"fail{i}")
        os.unlink(filler)
        store.collect_garbage()
        assert [f for f in _pack_files(root) if "/w/" in f] == []
        assert [p for p in _open_packs(store) if "/w/" in p] == []
        ref = store.publish([Record("p", b"p" * 100)], submission_id="ok")
        assert bytes(next(store.read(ref)).payload) == b"p" * 100


# --- (7) collection frees what it reports -----------------------------------------------

def _fds_to(path: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(path):
            out.append(target)
    return out


@pytest.mark.parametrize("small_tmpfs", [16 << 20], indirect=True)
def test_collection_frees_reclaimed_packs_held_by_read_sessions(small_tmpfs):
    with SharedFilesystemStore(small_tmpfs, "run", reserve_bytes=0) as store:
        ref = store.publish([Record("big", b"x" * (4 << 20))], submission_id="big")
        store.seal()
        assert store.read(ref)  # the store's own session caches the pack
        session = store.read_session()
        assert session.read(ref)
        store.release_publications([ref])
        before = free_bytes(small_tmpfs)
        result = store.collect_garbage()
        assert result["tombstoned"] == [ref.path]
        assert result["reclaimed_bytes"] >= 4 << 20
        assert free_bytes(small_tmpfs) - before >= 4 << 20  # reclaimed means freed
        assert [t for t in _fds_to(small_tmpfs) if t.endswith(".pack")] == []
        session.close()


_COLLECTOR = textwrap.dedent("""
    import sys
    from straw import SharedFilesystemStore
    with SharedFilesystemStore(sys.argv[1], "run", writer_id="collector") as store:
        print(store.collect_garbage()["tombstoned"])
""")


def test_session_drops_descriptors_of_packs_another_process_reclaimed(tmp_path):
    clock = ManualClock()
    with SharedFilesystemStore(str(tmp_path), "run", clock=clock, reserve_bytes=0) as store:
        gone = store.publish([Record("a", b"a" * 1000)], submission_id="a")
        store.seal()
        kept = store.publish([Record("b", b"b" * 1000)], submission_id="b")
        assert store.read(gone) and store.read(kept)
        store.release_publications([gone])
        proc = subprocess.run([sys.executable, "-c", _COLLECTOR, str(tmp_path)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        assert gone.path in proc.stdout, proc.stderr
        full = str(tmp_path / gone.path)
        assert [t for t in _fds_to(str(tmp_path)) if t.startswith(full)]  # still held
        clock.advance(SWEEP_SECONDS + 1)
        assert store.read(kept)  # the next use of the cache sweeps it
        assert [t for t in _fds_to(str(tmp_path)) if t.startswith(full)] == []


# --- (8) dead writers' open packs, abandoned packs --------------------------------------

def test_dead_writer_open_pack_is_sealed_and_collected(tmp_path):
    dead = _killed_writer(tmp_path, "dead", "d1", "d2")
    kept = _killed_writer(tmp_path, "kept", "k1", "k2")
    root = str(tmp_path)
    with SharedFilesystemStore(root, "run", writer_id="alive") as alive, \
            SharedFilesystemStore(root, "run", writer_id="gc") as gc:
        live = alive.publish([Record("l", b"l")], submission_id="l")
        gc.release_publications([dead["d1"], dead["d2"], kept["k1"], kept["k2"], live])
        gc.retain("keep", [kept["k2"]])
        result = gc.collect_garbage()
        assert sorted(result["sealed_for_dead_writers"]) == sorted(
            {dead["d1"].path, kept["k1"].path})
        assert result["tombstoned"] == [dead["d1"].path]  # released: reclaimed
        assert not (tmp_path / dead["d1"].path).exists()
        assert _pack_state(gc, kept["k1"].path) == "sealed"  # retained: kept
        assert _pack_state(gc, live.path) == "open"  # a live writer keeps its open pack
        assert (tmp_path / live.path).exists()
        assert bytes(next(alive.read(live)).payload) == b"l"
    # the killed writer id restarts and still finds what was not reclaimed (D7)
    with SharedFilesystemStore(root, "run", writer_id="kept") as kept_again:
        assert kept_again.lookup_submission("k1") == (kept["k1"],)
        assert kept_again.lookup_submission("k2") == (kept["k2"],)
        kept_again.release("keep")
        assert kept["k1"].path in kept_again.collect_garbage()["tombstoned"]
    with SharedFilesystemStore(root, "run", writer_id="dead") as dead_again:
        assert dead_again.lookup_submission("d1") is None  # reclaimed: not handed out


def test_pack_abandoned_after_failed_sync_is_sealed_and_collected(tmp_path):
    fs = FaultyFS(PosixFS())
    with SharedFilesystemStore(str(tmp_path), "run", fs=fs, reserve_bytes=0, writer_id="w") as store:
        ok = store.publish([Record("a", b"a")], submission_id="a")
        fs.plan.fail("fdatasync", errno.EIO, path=r"\.pack$")
        with pytest.raises(StorageUnavailable):
            store.publish([Record("b", b"b")], submission_id="b")
        with store.catalog.locked() as st:  # sealed at once, acknowledged extents only
            assert st.packs[ok.path].state == "sealed"
            assert st.packs[ok.path].offsets == {ok.offset}
        again = store.publish([Record("b", b"b")], submission_id="b")
        assert again.path != ok.path
        store.release_publications([ok])
        assert store.collect_garbage()["tombstoned"] == [ok.path]
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        assert store.lookup_submission("b") == (again,)


def test_starting_writer_waits_for_a_collection_holding_its_lock(tmp_path):
    from straw import holder

    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        store.publish([Record("a", b"a")], submission_id="a")
    fs = PosixFS()
    lock = str(tmp_path / "runs/run/writers/w/LOCK")
    fd, _ = holder.take(fs, lock, ManualClock(), purpose=holder.COLLECTING)
    assert fd is not None

    class ReleasingClock(ManualClock):
        def sleep(self, seconds: float) -> None:  # the collection finishes meanwhile
            super().sleep(seconds)
            holder.release(fs, fd)

    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w",
                               clock=ReleasingClock()) as store:
        assert store.lookup_submission("a") is not None


def test_simfs_fstat_counts_links(tmp_path):
    from fault_injection.simfs import SimFS

    sim = SimFS(0)
    sim.mkdir("/d")
    fd = sim.open("/d/f", write=True, create=True)
    assert sim.fstat(fd).nlink == 1
    sim.rename("/d/f", "/d/g")
    assert sim.fstat(fd).nlink == 1
    sim.unlink("/d/g")
    assert sim.fstat(fd).nlink == 0


@pytest.mark.juicefs
def test_dead_writer_on_one_mount_is_sealed_and_collected_from_the_other(juicefs_dirs):
    dead = _killed_writer(juicefs_dirs.a, "dead", "d1", "d2")
    with SharedFilesystemStore(juicefs_dirs.b, "run", writer_id="gc") as gc:
        assert gc.read(dead["d2"])  # visible on the other client
        gc.release_publications(list(dead.values()))
        result = gc.collect_garbage()
        assert result["sealed_for_dead_writers"] == [dead["d1"].path]
        assert result["tombstoned"] == [dead["d1"].path]
    with SharedFilesystemStore(juicefs_dirs.a, "run", writer_id="dead") as again:
        assert again.lookup_submission("d1") is None
        again.publish([Record("n", b"n")], submission_id="n")


def test_writer_that_lost_its_lock_writes_nothing_into_a_pack_sealed_on_its_behalf(tmp_path):
    from straw import UnsafeRecovery, holder

    clock = ManualClock()
    root = str(tmp_path)
    with SharedFilesystemStore(root, "run", writer_id="w", clock=clock) as store:
        first = store.publish([Record("a", b"a")], submission_id="a")
        # a shared filesystem expires the partitioned writer's lock ...
        holder.release(store.fs, store._writer._lock_fd)
        with SharedFilesystemStore(root, "run", writer_id="gc") as gc:
            # ... so a collection takes it for dead and seals its open pack
            assert gc.collect_garbage()["sealed_for_dead_writers"] == [first.path]
        clock.advance(2)  # the writer resumes
        with pytest.raises(UnsafeRecovery, match="lost its lock"):
            store.publish([Record("b", b"b")], submission_id="b")
        size = os.path.getsize(tmp_path / first.path)
    assert os.path.getsize(tmp_path / first.path) == size  # no seal written on close either
    with SharedFilesystemStore(root, "run", writer_id="w") as again:
        assert again.lookup_submission("a") == (first,)
        assert again.lookup_submission("b") is None
