"""Negative controls for ``straw qualify``: for every clause a filesystem that breaks
exactly that clause, which qualify must fail (``tests/test_qualify.py``).  A control that
qualify passes means the clause has lost its power to find that defect.

Each control builds an ``Env`` (two clients of one directory, a ManualClock so waits are
instant and deterministic) from a SimFS, a wrapped SimFS, an NFS-cached SimFS client
(``fault_injection.nfs``), or a wrapper over a real directory (``large_offsets`` and
``full_filesystem`` need real sparse files and a real full filesystem):

=======================  ===============================================================
clause                   control
=======================  ===============================================================
exclusive_create         ``NoExclusive``: O_EXCL ignored (both clients "create" a name)
lock_exclusion           ``SimFS(broken_locks=True)``: every lock granted
lock_release_on_death    a holder whose death leaves its lock held (a lock server that
                         never notices a dead client)
close_to_open            ``NoCloseToOpen``: an open serves the size cached at the first
                         open (JuiceFS --open-cache without revalidation)
rename_atomic            ``CopyRename``: rename copies the bytes into the old inode in
                         place, then unlinks the source
unlink_race              ``StaleUnlink``: unlinking a missing name fails with ESTALE
attribute_staleness      NFS client, attribute cache 60 s
entry_staleness          NFS client, negative lookups cached 60 s
listing_staleness        NFS client, directory cache 60 s
space_reservation        ``FakeReserve``: reserve says yes and does nothing
large_offsets            ``Offsets32``: write offsets truncated to 32 bits (real dir)
full_filesystem          ``SwallowENOSPC``: ENOSPC from a write reported as success (on a
                         real small tmpfs; the test supplies it)
mount_options            a JuiceFS mount with --writeback --open-cache (tests, JuiceFS)
=======================  ===============================================================
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence

from fault_injection.nfs import NFSClient
from fault_injection.simfs import SimFS
from straw.clock import ManualClock
from straw.fs import Buffer, Filesystem
from straw.fs_delegating import DelegatingFilesystem
from straw.qualify.clauses import Client, Env

DIR = "/pool"


class NoExclusive(DelegatingFilesystem):
    def open(self, path: str, *, write: bool = False, create: bool = False,
             exclusive: bool = False) -> int:
        return self.inner.open(path, write=write, create=create)


class NoCloseToOpen(DelegatingFilesystem):
    """Reads are clipped to the size the file had when this client first opened it."""

    def __init__(self, inner: Filesystem) -> None:
        super().__init__(inner)
        self._first: dict[str, int] = {}
        self._fd_path: dict[int, str] = {}

    def open(self, path: str, *, write: bool = False, create: bool = False,
             exclusive: bool = False) -> int:
        fd = self.inner.open(path, write=write, create=create, exclusive=exclusive)
        self._first.setdefault(path, self.inner.fstat(fd).size)
        self._fd_path[fd] = path
        return fd

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        limit = self._first.get(self._fd_path.get(fd, ""), 1 << 62)
        mv = memoryview(buffer).cast("B")
        if offset >= limit:
            return 0
        return self.inner.readinto(fd, mv[:max(0, limit - offset)], offset)


class CopyRename(DelegatingFilesystem):
    """rename(src, dst) as: copy src's bytes into dst in place (no truncate), unlink src."""

    def rename(self, src: str, dst: str) -> None:
        data = self.inner.read_file(src)
        fd = self.inner.open(dst, write=True, create=True)
        try:
            self.inner.writev(fd, [data], 0)
            self.inner.fsync(fd)
        finally:
            self.inner.close(fd)
        self.inner.unlink(src)


class StaleUnlink(DelegatingFilesystem):
    def unlink(self, path: str) -> None:
        try:
            self.inner.unlink(path)
        except FileNotFoundError:
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), path) from None


class FakeReserve(DelegatingFilesystem):
    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        return True


class Offsets32(DelegatingFilesystem):
    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        return self.inner.writev(fd, buffers, offset & 0xFFFFFFFF)


class SwallowENOSPC(DelegatingFilesystem):
    """A write that hits a full filesystem is reported as complete."""

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        try:
            return self.inner.writev(fd, buffers, offset)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            return sum(memoryview(b).nbytes for b in buffers)


class SimHolder:
    """A lock holder that is a SimFS client; ``kill`` is SIGKILL (``kill_client``), or,
    with ``release_on_death=False``, a death the lock server never notices."""

    count = 0

    def __init__(self, sim: SimFS, path: str, *, release_on_death: bool = True) -> None:
        SimHolder.count += 1
        self.sim, self.name = sim, f"holder-{SimHolder.count}"
        self.release_on_death = release_on_death
        c = sim.client(self.name)
        self.fd = c.open(path, write=True)
        if not c.lock(self.fd, blocking=False):
            raise RuntimeError(f"holder could not lock {path}")

    def kill(self) -> None:
        if self.release_on_death:
            self.sim.kill_client(self.name)

    def close(self) -> None:
        pass


def sim_env(*, a: Filesystem | None = None, b: Filesystem | None = None,
            sim: SimFS | None = None, release_on_death: bool = True,
            rounds: int = 4, deadline: float = 5.0) -> tuple[Env, SimFS]:
    """Two clients of one SimFS directory (optionally wrapped), with a SimFS holder."""
    sim = sim or SimFS(0, clock=ManualClock(0.0))
    if not sim.exists(DIR):
        sim.mkdir(DIR)
    env = Env(a=Client(a or sim.client("a"), DIR), b=Client(b or sim.client("b"), DIR),
              clock=sim.clock, token="q", rounds=rounds, deadline=deadline, poll=0.1,
              holder=lambda path: SimHolder(sim, path, release_on_death=release_on_death))
    return env, sim


def _nfs(**timeouts: float) -> Env:
    sim = SimFS(0, clock=ManualClock(0.0))
    base = {"attr_timeout": 0.0, "dir_timeout": 0.0, "negative_timeout": 0.0}
    base.update(timeouts)
    env, _ = sim_env(sim=sim, b=NFSClient(sim.client("b"), sim.clock, **base))
    return env


def _wrapped(which: str, wrap: Callable[[Filesystem], Filesystem]) -> Env:
    sim = SimFS(0, clock=ManualClock(0.0))
    a = wrap(sim.client("a")) if which in ("a", "both") else None
    b = wrap(sim.client("b")) if which in ("b", "both") else None
    return sim_env(sim=sim, a=a, b=b)[0]


# clause -> builder of an Env on which that clause must fail (SimFS-based ones; the real
# directory ones, large_offsets and full_filesystem, are built by the tests)
CONTROLS: dict[str, Callable[[], Env]] = {
    "exclusive_create": lambda: _wrapped("both", NoExclusive),
    "lock_exclusion": lambda: sim_env(sim=SimFS(0, clock=ManualClock(0.0),
                                                broken_locks=True))[0],
    "lock_release_on_death": lambda: sim_env(release_on_death=False)[0],
    "close_to_open": lambda: _wrapped("b", NoCloseToOpen),
    "rename_atomic": lambda: _wrapped("a", CopyRename),
    "unlink_race": lambda: _wrapped("both", StaleUnlink),
    "attribute_staleness": lambda: _nfs(attr_timeout=60.0),
    "entry_staleness": lambda: _nfs(negative_timeout=60.0),
    "listing_staleness": lambda: _nfs(dir_timeout=60.0),
    "space_reservation": lambda: _wrapped("a", FakeReserve),
}
