"""A read session's cache of open packs: their descriptors and their checked manifests.

Descriptors are shared by the session's threads: one dropped (evicted, reopened after
visibility lag, reclaimed) while another thread reads through it is retired, not closed,
until no read is in flight (``reading``): closing it under a reader fails its read with
EBADF, or worse, its number is reused by another file.

Reclaimed means freed: a cached descriptor keeps an unlinked pack's bytes allocated, so

* a collection in this process makes every session of this process on that pool drop its
  descriptors and manifests of the packs it reclaimed before it returns (``forget``,
  through ``straw.read.session.drop_reclaimed``);
* a session of another process cannot be reached: when it next uses its cache, at most
  every ``SWEEP_SECONDS``, it checks its cached descriptors (one ``fstat`` each) and drops
  those whose file has no link any more (or cannot be checked, e.g. ESTALE on NFS).  A
  session that is never used again holds its descriptors until it is closed.

The hot read path gains no syscall: one clock read per cache use.  A cache is not an
ownership pin: what guarantees a read is a durable owner or pin, never a descriptor that
happens to be open.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator

from ..clock import Clock
from ..errors import Closed, InvalidReference
from ..fs import Filesystem, NotBeneath
from ..pool.refs import SegmentRef
from ..process import close_quietly
from .extents import ExtentInfo

FD_CACHE = 64  # open packs per session
EXTENT_CACHE = 256  # checked manifests per session
SWEEP_SECONDS = 5.0  # how often a session looks for cached packs another client reclaimed


class PackCache:
    """Open descriptors by pack path and checked manifests by extent, least recently
    used first, under one lock.  ``extents`` may be read without the lock (a lookup);
    every change takes it."""

    def __init__(self, fs: Filesystem, real_root: str, clock: Clock) -> None:
        self.fs = fs
        self.real_root = real_root
        self.clock = clock
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.extents: OrderedDict[SegmentRef, ExtentInfo] = OrderedDict()
        self.lock = threading.Lock()
        self.inflight = 0  # reads in flight through cached descriptors
        self.retired: list[int] = []  # dropped descriptors, closed once no read is in flight
        self.closed = False
        self._next_sweep = clock.now() + SWEEP_SECONDS

    def fd(self, path: str) -> int:
        """The descriptor of the pack at ``path`` beneath the pool root, opened on a miss
        (``InvalidReference`` for anything but a regular file reached without a symbolic
        link; ``Closed`` once the session closed)."""
        if self.clock.now() >= self._next_sweep:
            self.sweep_unlinked()
        with self.lock:
            if self.closed:
                raise Closed("read session is closed; open a new one (store.read_session())")
            fd = self.fds.get(path)
            if fd is not None:
                self.fds.move_to_end(path)
                return fd
        try:
            fd = self.fs.open_beneath(self.real_root, path)
        except NotBeneath as e:
            raise InvalidReference(
                f"reference path {path!r} is not a pack of this pool: {e.strerror}. straw "
                "opens references only as regular files beneath the pool root, never through "
                "a symbolic link (it could lead outside the pool)") from None
        with self.lock:
            if self.closed:  # closed while this thread opened: nothing will close it
                close_quietly(self.fs, fd)
                raise Closed("read session is closed; open a new one (store.read_session())")
            cached = self.fds.get(path)
            if cached is not None:
                # another thread missed the cache for this pack at the same time and got
                # there first: use its descriptor, close ours (replacing it in the cache
                # would leak the other one, still in use by that thread)
                close_quietly(self.fs, fd)
                self.fds.move_to_end(path)
                return cached
            self.fds[path] = fd
            if len(self.fds) > FD_CACHE:
                _, old = self.fds.popitem(last=False)
                self._retire(old)
        return fd

    def _retire(self, fd: int) -> None:
        """Close ``fd`` now if no read is in flight, else once the last one ends (caller
        holds ``self.lock``)."""
        if self.inflight:
            self.retired.append(fd)
        else:
            close_quietly(self.fs, fd)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """The scope of a read through cached descriptors: none is closed under it."""
        with self.lock:
            self.inflight += 1
        try:
            yield
        finally:
            with self.lock:
                self.inflight -= 1
                retired: list[int] = []
                if not self.inflight:
                    retired, self.retired = self.retired, []
            for fd in retired:
                close_quietly(self.fs, fd)

    def sweep_unlinked(self) -> None:
        """Drop cached descriptors of packs that have no link any more (reclaimed by
        another client): they would keep the reclaimed bytes allocated."""
        self._next_sweep = self.clock.now() + SWEEP_SECONDS
        gone = set()
        with self.reading():  # none of the listed descriptors is closed meanwhile
            with self.lock:
                cached = list(self.fds.items())
            for path, fd in cached:
                try:
                    if self.fs.fstat(fd).nlink > 0:
                        continue
                except OSError:
                    pass  # cannot tell (ESTALE, ...): reopening is cheap and safe
                gone.add(path)
        if gone:
            self.forget(gone)

    def forget(self, paths: set[str]) -> None:
        """Close the cached descriptors of ``paths`` and forget their manifests."""
        with self.lock:
            for seg in [r for r in self.extents if r.path in paths]:
                del self.extents[seg]
        for path in paths:
            self.drop(path)

    def drop(self, path: str) -> None:
        """Close the descriptor of ``path`` (once no read is in flight): the next read
        opens the pack afresh (close-to-open)."""
        with self.lock:
            fd = self.fds.pop(path, None)
            if fd is not None:
                self._retire(fd)

    def remember(self, seg: SegmentRef, ext: ExtentInfo) -> None:
        """Cache the checked manifest of ``seg``."""
        with self.lock:
            self.extents[seg] = ext
            if len(self.extents) > EXTENT_CACHE:
                self.extents.popitem(last=False)

    def close(self) -> None:
        """Close every descriptor (once no read is in flight) and refuse further use."""
        with self.lock:
            for fd in self.fds.values():
                self._retire(fd)
            self.fds.clear()
            self.extents.clear()
            self.closed = True

    def drop_inherited(self) -> None:
        """In a forked child: close the child's copies of the descriptors, taking no lock
        (another thread of the parent may have held it at the fork)."""
        fds = list(self.fds.values())
        self.fds.clear()
        self.extents.clear()
        for fd in fds:
            close_quietly(self.fs, fd)
