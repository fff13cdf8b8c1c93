"""SimFS checked against a tiny model filesystem (issue 4, item 2).

``SimFSModel``: without faults, SimFS behaves like a dict of byte arrays over a small
name space (open/create, write at offset, append, truncate, reserve, rename, unlink,
fsync, fsync_dir, read, stat, listdir, close) -- the first divergence fails the run with
the step sequence.

``SimFSCrash``: the same operations plus power loss of every variant; after each crash,
everything fsync promised is still there (synced data of files whose synced name was
not touched since) and nothing appears that was never written (bytes come from the synced
content, an unsynced write covering them, zero-fill past the synced end, or -- only in
torn-op, only inside an unsynced write's range -- a garbage sector).
"""

from __future__ import annotations

import errno
import itertools
import posixpath
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fault_injection import VARIANTS, SimFS
from fault_injection.simstate import SimState

DIRS = ["/m", "/m/s"]
PATHS = ["/m/a", "/m/b", "/m/c", "/m/s/a", "/m/s/b"]
MAX_HANDLES = 4

paths = st.sampled_from(PATHS)
payloads = st.binary(min_size=0, max_size=700)
offsets = st.integers(min_value=0, max_value=1500)
handle_ix = st.integers(min_value=0, max_value=MAX_HANDLES - 1)

_ids = itertools.count()


class MFile:
    """Model file: current bytes, bytes at the last sync, and data ops since."""

    def __init__(self, data: bytes = b"") -> None:
        self.id = next(_ids)
        self.data = bytearray(data)
        self.synced = bytes(data)
        self.pending: list[tuple[str, int, bytes]] = []  # ("w", off, data) | ("t"|"x", size, b"")

    def write(self, offset: int, data: bytes) -> None:
        if not data:
            return  # POSIX: an empty pwrite never extends the file
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset : offset + len(data)] = data
        self.pending.append(("w", offset, data))

    def truncate(self, size: int) -> None:
        if size < len(self.data):
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))
        self.pending.append(("t", size, b""))

    def reserve(self, end: int) -> None:
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
            self.pending.append(("x", end, b""))

    def sync(self) -> None:
        self.synced = bytes(self.data)
        self.pending = []

    def crash_violation(self, got: bytes, torn_op: bool) -> str | None:
        """Why ``got`` cannot be this file's content after a crash (None: it can)."""
        synced = self.synced
        trunc = [size for kind, size, _ in self.pending if kind == "t"]
        stable = min([len(synced), *trunc])
        limit = max(
            [len(synced)]
            + [off + len(d) for kind, off, d in self.pending if kind == "w"]
            + [size for kind, size, _ in self.pending if kind != "w"]
        )
        if not stable <= len(got) <= limit:
            return f"size {len(got)} outside [{stable}, {limit}]"
        writes = [(off, d) for kind, off, d in self.pending if kind == "w"]
        for p, byte in enumerate(got):
            covered = {d[p - off] for off, d in writes if off <= p < off + len(d)}
            if covered and torn_op:
                continue  # a garbage sector may lie anywhere inside an unsynced write
            if p < stable and not covered:
                if byte != synced[p]:
                    return f"synced byte {p} is {byte}, fsync promised {synced[p]}"
                continue
            allowed = set(covered)
            if p < len(synced):
                allowed.add(synced[p])
            if p >= stable:
                allowed.add(0)
            if byte not in allowed:
                return f"byte {p} is {byte}, never written there (allowed {sorted(allowed)})"
        return None


class SimFSModel(RuleBasedStateMachine):
    """SimFS (no faults) against the model; also tracks what fsync promised."""

    make_sim: Callable[[int], SimFS] = SimFS

    @initialize(seed=st.integers(0, 2**32 - 1))
    def setup(self, seed: int) -> None:
        self.sim = self.make_sim(seed)
        self.sim.makedirs_durable("/m/s")
        self.files: dict[str, MFile] = {}
        self.handles: list[tuple[int, MFile]] = []
        self.stale_fds: list[int] = []
        self.promised: dict[str, MFile] = {}  # durable name -> file, untouched since
        self.promised_absent: set[str] = set(PATHS)  # durably absent, untouched since
        self.candidates: dict[str, list[MFile]] = {p: [] for p in PATHS}

    # --- helpers ------------------------------------------------------------------------
    def _touch(self, path: str) -> None:
        """A namespace op on ``path``: its durable binding is no longer certain."""
        self.promised.pop(path, None)
        self.promised_absent.discard(path)
        if path in self.files:
            self.candidates[path].append(self.files[path])

    def _handle(self, i: int) -> tuple[int, MFile]:
        return self.handles[i % len(self.handles)]

    # --- rules --------------------------------------------------------------------------
    @precondition(lambda self: len(self.handles) < MAX_HANDLES)
    @rule(path=paths, create=st.booleans())
    def open(self, path: str, create: bool) -> None:
        if path not in self.files and not create:
            with pytest.raises(FileNotFoundError):
                self.sim.open(path)
            return
        fd = self.sim.open(path, write=True, create=create)
        if path not in self.files:
            self.files[path] = MFile()
            self._touch(path)
        self.handles.append((fd, self.files[path]))

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix, offset=offsets, data=payloads)
    def write(self, i: int, offset: int, data: bytes) -> None:
        fd, f = self._handle(i)
        assert self.sim.writev(fd, [data[:3], memoryview(data)[3:]], offset) == len(data)
        f.write(offset, data)

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix, data=payloads)
    def append(self, i: int, data: bytes) -> None:
        fd, f = self._handle(i)
        offset = self.sim.fstat(fd).size
        assert offset == len(f.data)
        self.sim.writev(fd, [data], offset)
        f.write(offset, data)

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix, size=st.integers(0, 1500))
    def truncate(self, i: int, size: int) -> None:
        fd, f = self._handle(i)
        self.sim.truncate(fd, size)
        f.truncate(size)

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix, offset=offsets, length=st.integers(1, 1000), keep_size=st.booleans())
    def reserve(self, i: int, offset: int, length: int, keep_size: bool) -> None:
        fd, f = self._handle(i)
        assert self.sim.reserve(fd, offset, length, keep_size=keep_size)
        if not keep_size:  # keep_size allocates space, which the model does not track
            f.reserve(offset + length)

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix, data_only=st.booleans())
    def fsync(self, i: int, data_only: bool) -> None:
        fd, f = self._handle(i)
        (self.sim.fdatasync if data_only else self.sim.fsync)(fd)
        f.sync()

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix)
    def close(self, i: int) -> None:
        fd, _ = self._handle(i)
        self.sim.close(fd)
        self.handles.remove(self._handle(i))
        self.stale_fds.append(fd)

    @rule(d=st.sampled_from(DIRS))
    def fsync_dir(self, d: str) -> None:
        self.sim.fsync_dir(d)
        for p in PATHS:
            if posixpath.dirname(p) == d:
                self.promised.pop(p, None)
                self.promised_absent.discard(p)
                if p in self.files:
                    self.promised[p] = self.files[p]
                else:
                    self.promised_absent.add(p)

    @rule(src=paths, dst=paths)
    def rename(self, src: str, dst: str) -> None:
        if src not in self.files:
            with pytest.raises(FileNotFoundError):
                self.sim.rename(src, dst)
            return
        self.sim.rename(src, dst)
        if src == dst:
            return
        self._touch(src)
        self._touch(dst)
        self.files[dst] = self.files.pop(src)
        self.candidates[dst].append(self.files[dst])

    @rule(path=paths)
    def unlink(self, path: str) -> None:
        if path not in self.files:
            with pytest.raises(FileNotFoundError):
                self.sim.unlink(path)
            return
        self.sim.unlink(path)
        self._touch(path)
        del self.files[path]

    @precondition(lambda self: self.handles)
    @rule(i=handle_ix, offset=st.integers(0, 2000), size=st.integers(0, 2000))
    def read_handle(self, i: int, offset: int, size: int) -> None:
        fd, f = self._handle(i)
        buf = bytearray(size)
        n = self.sim.readinto(fd, buf, offset)
        assert bytes(buf[:n]) == bytes(f.data[offset : offset + size]), "readinto diverged"

    @rule(path=paths)
    def read_path(self, path: str) -> None:
        if path not in self.files:
            with pytest.raises(FileNotFoundError):
                self.sim.read_file(path)
            return
        assert self.sim.read_file(path) == bytes(self.files[path].data), f"{path} diverged"

    @precondition(lambda self: self.stale_fds)
    @rule()
    def stale_fd(self) -> None:
        with pytest.raises(OSError) as e:
            self.sim.fsync(self.stale_fds[-1])
        assert e.value.errno == errno.EBADF

    # --- invariants ---------------------------------------------------------------------
    @invariant()
    def namespace_matches(self) -> None:
        for d in DIRS:
            want = sorted(posixpath.basename(p) for p in self.files if posixpath.dirname(p) == d)
            if d == "/m":
                want = sorted([*want, "s"])
            assert self.sim.listdir(d) == want, f"listdir({d}) diverged"
        for p, f in self.files.items():
            assert self.sim.stat(p).size == len(f.data), f"stat({p}).size diverged"


class SimFSCrash(SimFSModel):
    """The model machine plus power loss: fsync's promises hold, nothing is invented."""

    @rule(variant=st.sampled_from(VARIANTS), seed=st.integers(0, 2**32 - 1))
    def crash(self, variant: str, seed: int) -> None:
        note(self.sim.crash(variant, random.Random(seed)))
        got = self.sim.files()
        torn_op = variant == "torn-op"
        for p, f in self.promised.items():
            assert p in got, f"{p} was fsynced (name and data) but vanished"
            why = f.crash_violation(got[p], torn_op)
            assert why is None, f"{p}: {why}"
        for p in self.promised_absent:
            assert p not in got, f"{p} was durably absent but reappeared"
        for p, content in got.items():
            if not p.startswith("/m/") or p in self.promised:
                continue
            options = [*self.candidates[p], *([self.files[p]] if p in self.files else [])]
            reasons = [f.crash_violation(content, torn_op) for f in options]
            assert options and None in reasons, f"{p} after crash: {reasons or 'never existed'}"
        # after the crash, what survived is durable and is the new model
        for fd, _ in self.handles:
            with pytest.raises(OSError) as e:
                self.sim.close(fd)
            assert e.value.errno == errno.EBADF
        self.handles = []
        self.files = {p: MFile(content) for p, content in got.items() if p.startswith("/m/")}
        self.promised = dict(self.files)
        self.promised_absent = set(PATHS) - set(self.files)
        self.candidates = {p: [] for p in PATHS}
        assert sorted(self.sim.dirs()) == ["/", "/m", "/m/s"]


class _SyncDoesNothing(SimState):
    def sync_file(self, f: Any) -> None:
        f.pending = []
        self.dirty.pop(f.ino, None)


class _FsyncDirDoesNothing(SimState):
    def force_dir(self, d: Any) -> None:
        pass


class _GarbageAnywhere(SimState):
    def _crash_file(self, f: Any, variant: str, r: random.Random, *a: Any) -> tuple[int, int]:
        out = super()._crash_file(f, variant, r, *a)
        if f.durable:
            f.durable[r.randrange(len(f.durable))] ^= 0x5A
        return out


@pytest.mark.parametrize("broken", [_SyncDoesNothing, _FsyncDirDoesNothing, _GarbageAnywhere])
def test_crash_check_catches_broken_simfs(broken: type[SimState]) -> None:
    """Negative controls: the crash check must notice a SimFS that breaks a promise."""

    def make_sim(seed: int) -> SimFS:
        sim = SimFS(seed)
        sim.state = broken()
        return sim

    machine = type("Broken", (SimFSCrash,), {"make_sim": staticmethod(make_sim)})
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=500,
                stateful_step_count=40,
                phases=[Phase.generate],
                database=None,
                derandomize=True,
                print_blob=False,
            ),
        )


TestSimFSModel = SimFSModel.TestCase
TestSimFSModel.settings = settings(stateful_step_count=40)
TestSimFSCrash = SimFSCrash.TestCase
TestSimFSCrash.settings = settings(stateful_step_count=40)
