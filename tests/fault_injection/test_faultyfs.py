"""FaultyFS: the shared errno rules and crash points over a real directory (PosixFS)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fault_injection import FaultPlan, FaultyFS, SimulatedCrash


def test_passes_through_without_rules(tmp_path: Path) -> None:
    fs = FaultyFS()
    root = str(tmp_path)
    fs.makedirs_durable(f"{root}/a/b")
    fs.write_file_durable(f"{root}/a/b/f", b"hello")
    assert fs.read_file(f"{root}/a/b/f") == b"hello"
    fd = fs.open(f"{root}/a/b/f", write=True)
    assert fs.lock(fd, blocking=False)
    fs.unlock(fd)
    fs.close(fd)
    fs.rename(f"{root}/a/b/f", f"{root}/a/g")
    assert fs.listdir(f"{root}/a") == ["b", "g"]
    fs.unlink(f"{root}/a/g")
    with pytest.raises(FileNotFoundError):
        fs.stat(f"{root}/a/g")
    assert [e.op for e in fs.plan.trace][:2] == ["stat", "stat"]
    assert fs.plan.events == []


def test_enospc_writes_a_prefix_then_fails(tmp_path: Path) -> None:
    fs = FaultyFS(seed=4)
    path = str(tmp_path / "f")
    fs.plan.fail("writev", errno.ENOSPC, path=r"/f$", nth=2)
    fd = fs.open(path, write=True, create=True)
    fs.writev(fd, [b"first"], 0)
    with pytest.raises(OSError) as e:
        fs.writev(fd, [b"0123456789"], 5)
    assert e.value.errno == errno.ENOSPC
    fs.writev(fd, [b"!"], 100)  # count=1: only one failure
    fs.close(fd)
    data = (tmp_path / "f").read_bytes()
    written = data[5:].rstrip(b"\0!")
    assert data.startswith(b"first") and b"0123456789".startswith(written)
    assert "seed=4" in fs.describe() and "ENOSPC" in fs.describe()


@pytest.mark.parametrize("op", ["fsync", "fdatasync", "open", "rename", "unlink"])
def test_eio_rules(tmp_path: Path, op: str) -> None:
    fs = FaultyFS()
    path = str(tmp_path / "f")
    fs.write_file_durable(path, b"x")
    fs.plan.fail(op, errno.EIO)
    with pytest.raises(OSError) as e:
        if op in ("fsync", "fdatasync"):
            fd = fs.open(path)
            try:
                getattr(fs, op)(fd)
            finally:
                fs.close(fd)
        elif op == "open":
            fs.open(path)
        elif op == "rename":
            fs.rename(path, path + "2")
        else:
            fs.unlink(path)
    assert e.value.errno == errno.EIO
    assert os.listdir(tmp_path) == ["f"]  # failed name ops did nothing


def test_failed_close_really_closes(tmp_path: Path) -> None:
    fs = FaultyFS()
    fs.plan.fail("close", errno.EIO)
    fd = fs.open(str(tmp_path / "f"), write=True, create=True)
    with pytest.raises(OSError):
        fs.close(fd)
    with pytest.raises(OSError) as e:
        os.fstat(fd)
    assert e.value.errno == errno.EBADF


def test_crash_point_and_shared_plan(tmp_path: Path) -> None:
    plan = FaultPlan(seed=9)
    a, b = FaultyFS(plan=plan, client="a"), FaultyFS(plan=plan, client="b")
    plan.crash_at(1, ops="rename", client="a", when="after")
    fd = a.open(str(tmp_path / "t"), write=True, create=True)
    a.close(fd)
    with pytest.raises(SimulatedCrash):
        a.rename(str(tmp_path / "t"), str(tmp_path / "u"))
    assert os.listdir(tmp_path) == ["u"]  # crashed after the rename happened
    with pytest.raises(SimulatedCrash):
        a.stat(str(tmp_path / "u"))  # the dead client does nothing more
    assert b.stat(str(tmp_path / "u")).size == 0
    plan.revive("a")
    a.unlink(str(tmp_path / "u"))
    assert [e.client for e in plan.trace] == ["a", "a", "a", "b", "a"]
