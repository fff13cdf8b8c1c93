"""The JuiceFS fixture really gives two clients of one filesystem.

Each test checks a property through client A against client B: distinct clients, close-to-open
visibility after fsync, flock/fcntl exclusion (also after the holder is SIGKILLed), rename.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import juicefs_fixture
from tests.juicefs_fixture import JuiceFSMounts, session_count

# pytest finds fixtures by name in the test module. Bound by assignment rather than imported
# by name, so that test parameters of the same name are not flagged as redefinitions (F811).
juicefs_mounts = juicefs_fixture.juicefs_mounts
juicefs_dirs = juicefs_fixture.juicefs_dirs

pytestmark = pytest.mark.juicefs

# JuiceFS caches entries and attributes for 1 s (the defaults the fixture keeps); a stale view
# must end well within this bound. A limit on polling, not a timing assertion.
CACHE_BOUND = 5.0


def write_durable(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def try_flock(fd: int, op: int) -> bool:
    """Non-blocking flock; False if another holder excludes us."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def test_two_distinct_clients(juicefs_mounts: JuiceFSMounts) -> None:
    m = juicefs_mounts
    assert os.path.ismount(m.a) and os.path.ismount(m.b)
    assert os.stat(m.a).st_dev != os.stat(m.b).st_dev  # two FUSE connections
    assert session_count(m) == 2  # two sessions in the shared metadata engine
    assert m.volume_dir == os.path.dirname(m.a) == os.path.dirname(m.b)


def test_juicefs_dirs_is_one_fresh_directory_seen_twice(juicefs_dirs: JuiceFSMounts) -> None:
    d = juicefs_dirs
    assert os.listdir(d.a) == [] and os.listdir(d.b) == []
    assert os.stat(d.a).st_ino == os.stat(d.b).st_ino


def test_fsync_on_a_close_to_open_on_b(juicefs_dirs: JuiceFSMounts) -> None:
    pa, pb = juicefs_dirs.pair("data")
    payload = os.urandom(3 * 1024 * 1024 + 17)  # spans JuiceFS slices/pages, odd size
    write_durable(pa, payload)
    fsync_dir(juicefs_dirs.a)
    assert read(pb) == payload

    # B has the file's attributes cached now; A rewrites it (new length). Close-to-open:
    # B's next open() reads the new bytes although B's attr cache may still hold the old size.
    replacement = os.urandom(5 * 1024 * 1024 + 3)
    write_durable(pa, replacement)
    assert read(pb) == replacement

    # Appends made durable on A are visible to a fresh open() on B.
    fd = os.open(pa, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"tail")
        os.fsync(fd)
    finally:
        os.close(fd)
    assert read(pb) == replacement + b"tail"


def test_flock_excludes_across_clients(juicefs_dirs: JuiceFSMounts) -> None:
    pa, pb = juicefs_dirs.pair("lock")
    write_durable(pa, b"")
    fa = os.open(pa, os.O_RDWR)
    fb = os.open(pb, os.O_RDWR)
    try:
        assert try_flock(fa, fcntl.LOCK_EX)
        assert not try_flock(fb, fcntl.LOCK_EX)  # A holds it: B is excluded
        assert not try_flock(fb, fcntl.LOCK_SH)
        fcntl.flock(fa, fcntl.LOCK_UN)
        assert try_flock(fb, fcntl.LOCK_EX)  # released on A: B gets it at once
        assert not try_flock(fa, fcntl.LOCK_EX)  # and now A is excluded
        fcntl.flock(fb, fcntl.LOCK_UN)
        assert try_flock(fa, fcntl.LOCK_SH) and try_flock(fb, fcntl.LOCK_SH)  # shared: both
        assert not try_flock(fa, fcntl.LOCK_EX)  # B's shared lock blocks A's upgrade
    finally:
        os.close(fa)
        os.close(fb)
    # close() released both: A can take it exclusively again.  FUSE delivers the release of
    # a closed file's flock asynchronously, so poll for it with a bounded deadline (straw
    # itself always unlocks explicitly before closing).
    fa = os.open(pa, os.O_RDWR)
    try:
        deadline = time.monotonic() + 10
        while not try_flock(fa, fcntl.LOCK_EX):
            assert time.monotonic() < deadline, "close() never released the other locks"
            time.sleep(0.01)
    finally:
        os.close(fa)


def test_fcntl_record_locks_exclude_across_clients(juicefs_dirs: JuiceFSMounts) -> None:
    pa, pb = juicefs_dirs.pair("plock")
    write_durable(pa, b"")
    fa = os.open(pa, os.O_RDWR)
    fb = os.open(pb, os.O_RDWR)
    try:
        fcntl.lockf(fa, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OSError) as excinfo:
            fcntl.lockf(fb, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert excinfo.value.errno in (errno.EAGAIN, errno.EACCES)
        fcntl.lockf(fa, fcntl.LOCK_UN)
        fcntl.lockf(fb, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fa)
        os.close(fb)


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # hold until killed
"""


def test_flock_of_a_killed_holder_is_released(juicefs_dirs: JuiceFSMounts) -> None:
    pa, pb = juicefs_dirs.pair("coordinator.lock")
    write_durable(pa, b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, pa],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    fb = os.open(pb, os.O_RDWR)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert not try_flock(fb, fcntl.LOCK_EX)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        # The kernel releases the dead holder's lock through client A asynchronously.
        deadline = time.monotonic() + CACHE_BOUND
        while not try_flock(fb, fcntl.LOCK_EX):
            assert time.monotonic() < deadline, "lock of a SIGKILLed holder never released"
            time.sleep(0.01)
    finally:
        os.close(fb)
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


def test_rename_to_a_new_name_is_visible_at_once(juicefs_dirs: JuiceFSMounts) -> None:
    d = juicefs_dirs
    tmp_a, tmp_b = d.pair("extent.tmp")
    final_a, final_b = d.pair("extent")
    assert not os.path.exists(final_b)  # B looked the name up (negative entries not cached)
    write_durable(tmp_a, b"published")
    os.rename(tmp_a, final_a)
    fsync_dir(d.a)
    assert read(final_b) == b"published"
    assert not os.path.exists(tmp_b)
    assert sorted(os.listdir(d.b)) == ["extent"]


def test_rename_over_an_existing_name_converges(juicefs_dirs: JuiceFSMounts) -> None:
    """B resolved the name just before A replaced it: for up to the 1 s entry cache B may
    still get the old file, or -- with trash off, the old inode being gone -- ENOENT. Never
    anything else, and it converges to the new content."""
    d = juicefs_dirs
    final_a, final_b = d.pair("snapshot")
    tmp_a, _ = d.pair("snapshot.tmp")
    write_durable(final_a, b"old snapshot")
    assert read(final_b) == b"old snapshot"
    write_durable(tmp_a, b"new snapshot")
    os.rename(tmp_a, final_a)
    fsync_dir(d.a)
    assert read(final_a) == b"new snapshot"

    seen: list[bytes | str] = []
    deadline = time.monotonic() + CACHE_BOUND
    while True:
        try:
            got: bytes | str = read(final_b)
        except FileNotFoundError:
            got = "ENOENT"
        if not seen or seen[-1] != got:
            seen.append(got)
        if got == b"new snapshot":
            break
        assert time.monotonic() < deadline, f"B never saw the rename; saw {seen}"
        time.sleep(0.01)
    assert set(seen) <= {b"old snapshot", "ENOENT", b"new snapshot"}, seen
    assert sorted(os.listdir(d.b)) == ["snapshot"]
