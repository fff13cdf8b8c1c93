"""SimFS unit tests: POSIX errors and inode semantics, durability and crash variants,
crash points, errno rules (incl. fsync failure dropping data), several clients
(close-to-open, staleness, locks) and determinism from the seed."""

from __future__ import annotations

import errno
import random
import threading

import numpy as np
import pytest

from fault_injection import MUTATING_OPS, VARIANTS, SimDeadlock, SimFS, SimulatedCrash
from straw.clock import ManualClock
from straw.fs import Filesystem


def _new(sim: Filesystem, path: str, data: bytes = b"", *, sync: bool = False) -> int:
    fd = sim.open(path, write=True, create=True)
    if data:
        sim.writev(fd, [data], 0)
    if sync:
        sim.fsync(fd)
    return fd


def _errno(exc: pytest.ExceptionInfo[OSError]) -> int:
    return exc.value.errno or 0


# --- POSIX behaviour -----------------------------------------------------------------


def test_errors_are_real_oserrors() -> None:
    sim = SimFS()
    sim.makedirs("/p/d")
    sim.close(_new(sim, "/p/f", b"x"))
    with pytest.raises(FileNotFoundError):
        sim.open("/p/missing")
    with pytest.raises(FileNotFoundError):
        sim.open("/nope/f", create=True)
    with pytest.raises(FileExistsError):
        sim.open("/p/f", create=True, exclusive=True)
    with pytest.raises(FileExistsError):
        sim.mkdir("/p/d")
    with pytest.raises(NotADirectoryError):
        sim.open("/p/f/x", create=True)
    with pytest.raises(NotADirectoryError):
        sim.listdir("/p/f")
    with pytest.raises(IsADirectoryError):
        sim.open("/p/d", write=True)
    with pytest.raises(IsADirectoryError):
        sim.unlink("/p/d")
    with pytest.raises(IsADirectoryError):
        sim.rename("/p/f", "/p/d")
    with pytest.raises(FileNotFoundError):
        sim.unlink("/p/missing")
    with pytest.raises(FileNotFoundError):
        sim.rename("/p/missing", "/p/g")
    with pytest.raises(OSError) as e:
        sim.fsync(12345)
    assert _errno(e) == errno.EBADF
    ro = sim.open("/p/f")
    with pytest.raises(OSError) as e:
        sim.writev(ro, [b"y"], 0)
    assert _errno(e) == errno.EBADF
    sim.close(ro)
    with pytest.raises(OSError) as e:
        sim.close(ro)
    assert _errno(e) == errno.EBADF
    assert sim.stat("/p/d").is_dir and not sim.stat("/p/f").is_dir
    assert sim.listdir("/p") == ["d", "f"]
    assert sim.realpath("/p/./d/../f") == "/p/f"


def test_handles_survive_rename_and_unlink() -> None:
    sim = SimFS()
    sim.makedirs("/p")
    fd = _new(sim, "/p/a", b"hello")
    sim.rename("/p/a", "/p/b")
    sim.writev(fd, [b" world"], 5)
    assert sim.read_file("/p/b") == b"hello world"
    sim.unlink("/p/b")
    sim.writev(fd, [b"!"], 11)
    buf = bytearray(20)
    assert sim.readinto(fd, buf, 0) == 12 and bytes(buf[:12]) == b"hello world!"
    assert sim.listdir("/p") == []
    fd2 = _new(sim, "/p/b")
    assert fd2 != fd and sim.fstat(fd2).inode != sim.fstat(fd).inode


def test_positional_io_buffers_reserve_and_truncate() -> None:
    sim = SimFS()
    sim.makedirs("/p")
    fd = _new(sim, "/p/a")
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert sim.writev(fd, [b"ab", memoryview(b"cd"), arr], 4) == 16
    data = sim.read_file("/p/a")
    assert data == b"\0" * 4 + b"abcd" + arr.tobytes()
    # keep_size (FALLOC_FL_KEEP_SIZE): nothing a read sees changes
    assert sim.reserve(fd, 0, 100, keep_size=True) and sim.fstat(fd).size == len(data) == 20
    assert sim.read_file("/p/a") == data
    assert sim.reserve(fd, 0, 100) and sim.fstat(fd).size == 100
    assert sim.read_file("/p/a")[20:] == bytes(80)
    sim.truncate(fd, 3)
    assert sim.read_file("/p/a") == b"\0" * 3
    out = np.zeros(3, dtype=np.uint8)
    assert sim.readinto(fd, out, 1) == 2


def test_reserve_unsupported_returns_false() -> None:
    sim = SimFS(supports_reserve=False)
    sim.makedirs("/p")
    fd = _new(sim, "/p/a")
    assert sim.reserve(fd, 0, 10) is False
    assert sim.fstat(fd).size == 0


def test_write_file_durable_and_makedirs_durable_survive_power_loss() -> None:
    for variant in VARIANTS:
        sim = SimFS(seed=3)
        sim.makedirs_durable("/pool/run/packs")
        sim.write_file_durable("/pool/run/meta", b"v1")
        sim.write_file_durable("/pool/run/meta", b"v2")
        sim.crash(variant)
        assert sim.dirs() == ["/", "/pool", "/pool/run", "/pool/run/packs"]
        assert sim.files() == {"/pool/run/meta": b"v2"}


# --- durability and crash variants ---------------------------------------------------


def test_clear_cache_keeps_exactly_what_was_synced() -> None:
    sim = SimFS()
    sim.makedirs_durable("/p")
    fd = _new(sim, "/p/a", b"synced", sync=True)
    sim.fsync_dir("/p")
    sim.writev(fd, [b"-unsynced"], 6)
    sim.close(_new(sim, "/p/b", b"data", sync=True))  # data synced, name not
    sim.crash("clear-cache")
    assert sim.files() == {"/p/a": b"synced"}
    with pytest.raises(OSError) as e:
        sim.writev(fd, [b"x"], 0)
    assert _errno(e) == errno.EBADF


def test_fdatasync_makes_size_durable() -> None:
    sim = SimFS()
    sim.makedirs_durable("/p")
    fd = _new(sim, "/p/a")
    sim.fsync_dir("/p")
    sim.reserve(fd, 0, 4096)
    sim.writev(fd, [b"rec"], 0)
    sim.fdatasync(fd)
    sim.crash("torn-op")
    assert sim.files()["/p/a"] == b"rec" + bytes(4093)


def test_fsync_dir_forces_only_its_names_and_their_dependencies() -> None:
    sim = SimFS()
    sim.makedirs("/a/b")  # not durable yet
    sim.mkdir("/other")
    sim.close(_new(sim, "/a/b/f", b"x", sync=True))
    sim.fsync_dir("/a/b")  # needs mkdir /a/b and /a, not /other
    sim.crash("clear-cache")
    assert sim.files() == {"/a/b/f": b"x"}
    assert sim.dirs() == ["/", "/a", "/a/b"]


def test_unsynced_rename_is_atomic_either_way() -> None:
    outcomes = set()
    for seed in range(40):
        sim = SimFS(seed)
        sim.makedirs_durable("/p")
        sim.write_file_durable("/p/old", b"1")
        sim.write_file_durable("/p/cur", b"2")
        sim.rename("/p/old", "/p/cur")
        sim.crash(VARIANTS[seed % 3])
        files = sim.files()
        assert files in ({"/p/old": b"1", "/p/cur": b"2"}, {"/p/cur": b"1"}), files
        outcomes.add(tuple(files))
    assert len(outcomes) == 2  # both "happened" and "did not happen" occur


def test_torn_seq_keeps_a_prefix_in_issue_order() -> None:
    seen = set()
    for seed in range(60):
        sim = SimFS(seed)
        sim.makedirs_durable("/p")
        fd = _new(sim, "/p/log", sync=True)
        sim.fsync_dir("/p")
        chunks = [bytes([65 + i]) * 700 for i in range(4)]
        for i, c in enumerate(chunks):
            sim.writev(fd, [c], 700 * i)
        sim.crash("torn-seq")
        got = sim.files()["/p/log"]
        assert b"".join(chunks).startswith(got), "torn-seq must keep a prefix"
        # whole writes, or the write at the cut torn at a sector boundary
        assert len(got) % 700 == 0 or len(got) % 512 == 0
        seen.add(len(got))
    assert 0 in seen and 2800 in seen and len(seen) > 4


def test_torn_op_tears_sectors_and_writes_garbage_only_in_unsynced_ranges() -> None:
    garbage_seen = subsets_seen = False
    base = bytes(range(256)) * 8  # 2048 synced bytes
    for seed in range(60):
        sim = SimFS(seed)
        sim.makedirs_durable("/p")
        fd = _new(sim, "/p/f", base, sync=True)
        sim.fsync_dir("/p")
        sim.writev(fd, [b"\xee" * 1000], 700)  # touches sectors 1..3
        sim.crash("torn-op")
        got = sim.files()["/p/f"]
        assert got[:700] == base[:700] and got[1700:] == base[1700:]
        mid = got[700:1700]
        if any(b not in (0xEE, base[700 + i]) for i, b in enumerate(mid)):
            garbage_seen = True
        elif 0 < mid.count(0xEE) < 1000:
            subsets_seen = True
    assert garbage_seen and subsets_seen


def test_unlinked_open_file_is_gone_after_crash() -> None:
    sim = SimFS()
    sim.makedirs_durable("/p")
    fd = _new(sim, "/p/a", b"x", sync=True)
    sim.fsync_dir("/p")
    sim.unlink("/p/a")
    sim.fsync_dir("/p")
    sim.writev(fd, [b"y"], 1)
    sim.fsync(fd)
    sim.crash("torn-op")
    assert sim.files() == {}


# --- crash points ----------------------------------------------------------------------


def test_crash_point_before_nth_matching_call() -> None:
    sim = SimFS(seed=7)
    sim.makedirs_durable("/p")
    sim.crash_at(2, ops="fsync", path=r"\.pack$")
    fd = _new(sim, "/p/a.pack", b"one", sync=True)
    sim.writev(fd, [b"two"], 3)
    sim.fsync(_new(sim, "/p/other"))  # does not match the path
    with pytest.raises(SimulatedCrash):
        try:
            sim.fsync(fd)
        except Exception:  # an engine's handler cannot swallow it
            pytest.fail("SimulatedCrash caught by except Exception")
    with pytest.raises(SimulatedCrash):  # the process is dead: nothing more happens
        sim.close(fd)
    sim.crash("clear-cache")
    assert sim.files() == {}  # the name was never fsync_dir'ed
    assert "crash before call #2 of fsync" in sim.describe()
    sim.makedirs("/q")  # alive again after the power loss


def test_crash_point_after_call() -> None:
    sim = SimFS()
    sim.makedirs_durable("/p")
    fd = _new(sim, "/p/a", b"x")
    sim.crash_at(1, ops=["fsync", "fdatasync"], when="after")
    with pytest.raises(SimulatedCrash):
        sim.fdatasync(fd)
    sim.crash("clear-cache")
    assert sim.files() == {}  # the data sync happened, but the name was never durable
    sim2 = SimFS()
    sim2.makedirs_durable("/p")
    fd = _new(sim2, "/p/a", b"x")
    sim2.fsync_dir("/p")
    sim2.crash_at(1, ops="fsync", when="after")
    with pytest.raises(SimulatedCrash):
        sim2.fsync(fd)
    sim2.crash("clear-cache")
    assert sim2.files() == {"/p/a": b"x"}


def _workload(fs: SimFS) -> None:
    fs.makedirs_durable("/pool")
    fs.write_file_durable("/pool/a", b"A" * 600)
    fd = fs.open("/pool/log", write=True, create=True)
    fs.fsync_dir("/pool")
    for i in range(3):
        fs.writev(fd, [b"%d" % i * 300], 300 * i)
        fs.fdatasync(fd)
    fs.rename("/pool/a", "/pool/b")
    fs.fsync_dir("/pool")
    fs.close(fd)


def test_enumerate_every_crash_point_of_a_workload() -> None:
    probe = SimFS()
    _workload(probe)
    mutating = [e for e in probe.trace if e.op in MUTATING_OPS]
    assert probe.op_count == len(probe.trace) and len(mutating) > 10
    # crash point i (1-based) runs mutating[: i - 1]; after this many, /pool/a is durable
    first_rename = next(k for k, e in enumerate(mutating) if e.op == "rename")
    a_durable = 1 + next(
        k for k, e in enumerate(mutating) if e.op == "fsync_dir" and k > first_rename
    )
    log_data = b"".join(b"%d" % k * 300 for k in range(3))
    states = set()
    for i in range(1, len(mutating) + 1):
        for variant in VARIANTS:
            sim = SimFS(seed=i)
            sim.crash_at(i, ops=MUTATING_OPS)
            with pytest.raises(SimulatedCrash) as e:
                _workload(sim)
            assert e.value.op_index == mutating[i - 1].index
            sim.crash(variant)
            files = sim.files()
            synced = 300 * sum(
                1 for e in mutating[: i - 1] if e.op == "fdatasync" and "log" in e.paths[0]
            )
            assert files.get("/pool/log", b"")[:synced] == log_data[:synced]
            if i > a_durable:  # a is durable; its rename to b is atomic
                assert [files.get("/pool/a"), files.get("/pool/b")].count(b"A" * 600) == 1
            states.add(tuple(sorted(files.items())))
    assert len(states) >= 8


# --- errno rules -----------------------------------------------------------------------


def test_enospc_on_nth_write_writes_a_prefix_then_persists() -> None:
    sim = SimFS(seed=1)
    sim.makedirs("/p")
    sim.fail("writev", errno.ENOSPC, nth=2, count=None)
    fd = _new(sim, "/p/a", b"first")
    with pytest.raises(OSError) as e:
        sim.writev(fd, [b"0123456789"], 5)
    assert _errno(e) == errno.ENOSPC
    data = sim.read_file("/p/a")
    assert data.startswith(b"first") and b"0123456789".startswith(data[5:])
    with pytest.raises(OSError):
        sim.writev(fd, [b"x"], 0)  # the disk stays full
    assert "ENOSPC" in sim.describe() and "partial write" in sim.describe()


@pytest.mark.parametrize("op", ["open", "rename", "unlink", "mkdir", "fsync_dir", "stat"])
def test_failed_namespace_ops_have_no_effect(op: str) -> None:
    sim = SimFS()
    sim.makedirs("/p")
    sim.close(_new(sim, "/p/a", b"x"))
    sim.fail(op, errno.EIO, path="^/p")
    before = sim.files()
    call = {
        "open": lambda: sim.open("/p/new", create=True),
        "rename": lambda: sim.rename("/p/a", "/p/b"),
        "unlink": lambda: sim.unlink("/p/a"),
        "mkdir": lambda: sim.mkdir("/p/d"),
        "fsync_dir": lambda: sim.fsync_dir("/p"),
        "stat": lambda: sim.stat("/p/a"),
    }[op]
    with pytest.raises(OSError) as e:
        call()
    assert _errno(e) == errno.EIO
    assert sim.files() == before and sim.dirs() == ["/", "/p"]
    call()  # count=1: the next call succeeds


def test_edquot_by_probability_is_deterministic_from_the_seed() -> None:
    def run(seed: int) -> list[bool]:
        sim = SimFS(seed)
        sim.makedirs("/p")
        sim.fail("writev", errno.EDQUOT, probability=0.3, count=None)
        fd = _new(sim, "/p/a")
        out = []
        for i in range(40):
            try:
                sim.writev(fd, [b"x"], i)
                out.append(True)
            except OSError as e:
                assert e.errno == errno.EDQUOT
                out.append(False)
        return out

    assert run(5) == run(5)
    assert run(5) != run(6)
    assert 0 < run(5).count(False) < 40


def test_failed_fsync_never_makes_data_durable() -> None:
    choices = set()
    for seed in range(30):
        sim = SimFS(seed)
        sim.makedirs_durable("/p")
        fd = _new(sim, "/p/a", b"old", sync=True)
        sim.fsync_dir("/p")
        sim.writev(fd, [b"NEW"], 0)
        sim.fail(["fsync", "fdatasync"], errno.EIO)
        with pytest.raises(OSError):
            sim.fsync(fd)
        choice = sim.schedule[-1].detail
        choices.add(choice)
        cache = sim.read_file("/p/a")
        assert cache == (b"old" if choice == "revert" else b"NEW")
        sim.fsync(fd)  # a retry "succeeds" ...
        sim.crash("clear-cache")
        durable = sim.files()["/p/a"]
        # ... but only data still pending ("keep") reaches the disk
        assert durable == (b"NEW" if choice == "keep" else b"old"), (choice, durable)
    assert choices == {"keep", "forget", "revert"}


def test_failed_close_closes_and_may_drop_data() -> None:
    sim = SimFS(seed=2)
    sim.makedirs("/p")
    sim.fail("close", errno.EIO)
    fd = _new(sim, "/p/a", b"x")
    with pytest.raises(OSError):
        sim.close(fd)
    with pytest.raises(OSError) as e:
        sim.close(fd)
    assert _errno(e) == errno.EBADF
    assert "failed sync" in sim.describe()


# --- several clients -------------------------------------------------------------------


def test_close_to_open_visibility() -> None:
    sim = SimFS()
    w, r = sim.client("writer"), sim.client("reader")
    w.makedirs("/p")
    fd = _new(w, "/p/a", b"v1")
    w.close(fd)
    fd = w.open("/p/a", write=True)
    w.writev(fd, [b"-more"], 2)
    assert w.read_file("/p/a") == b"v1-more"  # a client sees its own writes
    assert r.read_file("/p/a") == b"v1"  # not flushed yet
    early = r.open("/p/a")
    w.fsync(fd)
    assert r.read_file("/p/a") == b"v1-more"  # opened after the fsync
    buf = bytearray(10)
    assert r.readinto(early, buf, 0) == 2  # opened before: keeps its view until reopen
    assert r.fstat(early).size == 2
    assert sim.client("writer") is w and sim.client("main") is sim


def test_staleness_window_uses_the_injected_clock() -> None:
    clock = ManualClock(0.0)
    sim = SimFS(clock=clock, staleness=1.0)
    a, b = sim.client("a"), sim.client("b")
    a.makedirs("/p")
    assert b.listdir("/p") == []
    with pytest.raises(FileNotFoundError):
        b.stat("/p/f")
    a.close(_new(a, "/p/f", b"abc"))
    assert a.listdir("/p") == ["f"]  # own change: fresh
    assert b.listdir("/p") == []  # stale entry cache
    with pytest.raises(FileNotFoundError):
        b.stat("/p/f")  # stale negative attribute cache
    assert b.read_file("/p/f") == b"abc"  # open always looks up
    clock.advance(1.0)
    assert b.listdir("/p") == ["f"] and b.stat("/p/f").size == 3
    a.unlink("/p/f")
    assert b.stat("/p/f").size == 3  # stale again
    with pytest.raises(FileNotFoundError):
        b.unlink("/p/f")  # unlink of an already-deleted file


def test_locks_are_exclusive_across_clients() -> None:
    sim = SimFS()
    a, b = sim.client("a"), sim.client("b")
    a.makedirs("/p")
    fa = a.open("/p/lock", write=True, create=True)
    fb = b.open("/p/lock", write=True)
    assert a.lock(fa, blocking=False)
    assert a.lock(fa, blocking=False)  # re-locking one's own handle is fine
    assert not b.lock(fb, blocking=False)
    fa2 = a.open("/p/lock", write=True)
    assert not a.lock(fa2, blocking=False)  # flock: per open handle, even in one client
    a.unlock(fa)
    assert b.lock(fb, blocking=False)
    b.close(fb)  # closing releases
    assert a.lock(fa2, blocking=False)
    sim.kill_client("a")  # a dies: its locks go
    fb = b.open("/p/lock", write=True)
    assert b.lock(fb, blocking=False)
    sim.crash("clear-cache")
    with pytest.raises(OSError):
        b.unlock(fb)  # handles died with the power loss


def test_crash_and_kill_release_locks_and_broken_locks_grant_all() -> None:
    sim = SimFS()
    sim.makedirs_durable("/p")
    sim.write_file_durable("/p/lock", b"")
    fd = sim.open("/p/lock", write=True)
    assert sim.lock(fd)
    sim.crash("torn-op")
    c = sim.client("c")
    assert c.lock(c.open("/p/lock", write=True), blocking=False)

    broken = SimFS(broken_locks=True)
    x, y = broken.client("x"), broken.client("y")
    x.makedirs("/p")
    fx = x.open("/p/lock", write=True, create=True)
    fy = y.open("/p/lock", write=True)
    assert x.lock(fx, blocking=False) and y.lock(fy, blocking=False)


def test_blocking_lock_waits_for_release_and_detects_deadlock() -> None:
    sim = SimFS(lock_timeout=5.0)
    a, b = sim.client("a"), sim.client("b")
    a.makedirs("/p")
    fa = a.open("/p/lock", write=True, create=True)
    fb = b.open("/p/lock", write=True)
    assert a.lock(fa)
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.lock(fb)))
    t.start()
    a.close(fa)
    t.join(10)
    assert got == [True]
    quick = SimFS(lock_timeout=0.01)
    quick.makedirs("/p")
    f1 = quick.open("/p/l", write=True, create=True)
    f2 = quick.open("/p/l", write=True)
    quick.lock(f1)
    with pytest.raises(SimDeadlock):
        quick.lock(f2)


def test_kill_client_flushes_and_revives() -> None:
    sim = SimFS()
    w, r = sim.client("w"), sim.client("r")
    w.makedirs("/p")
    fd = _new(w, "/p/a", b"data")
    sim.crash_at(1, ops="writev", client="w")
    with pytest.raises(SimulatedCrash):
        w.writev(fd, [b"more"], 4)
    with pytest.raises(SimulatedCrash):
        w.stat("/p/a")
    r.stat("/p/a")  # other clients live on
    sim.kill_client("w")
    assert r.read_file("/p/a") == b"data"  # the kernel flushed the dead process's writes
    assert w.read_file("/p/a") == b"data"  # a restarted process


# --- determinism -------------------------------------------------------------------------


def test_same_seed_same_crash_outcome_and_schedule() -> None:
    def run(seed: int) -> tuple[dict[str, bytes], str]:
        sim = SimFS(seed)
        sim.makedirs_durable("/p")
        rng = random.Random(seed)
        fds = [_new(sim, f"/p/f{i}") for i in range(3)]
        for _ in range(30):
            fd = rng.choice(fds)
            sim.writev(fd, [rng.randbytes(rng.randrange(1, 900))], rng.randrange(3000))
        sim.fail("fsync", errno.EIO, probability=0.5, count=None)
        for fd in fds:
            try:
                sim.fsync(fd)
            except OSError:
                pass
        sim.crash("torn-op")
        return sim.files(), sim.describe()

    assert run(11) == run(11)
    assert run(11) != run(12)
    assert "seed=11" in run(11)[1]
