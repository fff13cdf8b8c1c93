"""One client's view of a SimFS (``SimClient``): every ``straw.fs.Filesystem`` call,
checked against the fault plan, applied to the shared state under the world's lock, with
this client's attribute and entry caches.  The model it implements is described in
``fault_injection.simfs``; ``SimFS`` is the world, and itself the client ``"main"``."""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Sequence
from typing import Any, Protocol

from fault_injection.rules import (
    FaultPlan,
    raise_errno,
)
from fault_injection.simstate import (
    EXTEND,
    TRUNC,
    DirNode,
    FileNode,
    SimState,
    norm_path,
)
from straw.clock import Clock
from straw.fs import Buffer, FileStat, Filesystem, NotBeneath, beneath_parts


class SimDeadlock(RuntimeError):
    """A blocking ``lock`` waited ``lock_timeout`` seconds with no release in sight."""


class _Handle:
    __slots__ = ("fd", "client", "inode", "path", "writable", "frozen_size")

    def __init__(
        self, fd: int, client: str, inode: FileNode, path: str, writable: bool, frozen_size: int
    ) -> None:
        self.fd = fd
        self.client = client
        self.inode = inode
        self.path = path
        self.writable = writable
        self.frozen_size = frozen_size


def _join(buffers: Sequence[Buffer]) -> bytes:
    views = []
    for b in buffers:
        mv = b if isinstance(b, memoryview) else memoryview(b)
        if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
            mv = mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
        views.append(mv)
    return b"".join(views)


class SimClient(Filesystem):
    """One client's view of a SimFS (a process, or a machine on a shared filesystem)."""

    def __init__(self, sim: World, name: str) -> None:
        self._sim = sim
        self.name = name
        self._attr_cache: dict[str, tuple[float, FileStat | None]] = {}
        self._dir_cache: dict[str, tuple[float, list[str] | None]] = {}

    # --- helpers ----------------------------------------------------------------------
    def _path_of(self, fd: int) -> tuple[str, ...]:
        h = self._sim._handles.get(fd)
        return (h.path,) if h is not None else (f"<fd {fd}>",)

    def _handle(self, fd: int) -> _Handle:
        h = self._sim._handles.get(fd)
        if h is None or h.client != self.name:
            raise_errno(errno.EBADF, f"<fd {fd}>")
        assert h is not None
        return h

    def _visible_size(self, h: _Handle) -> int:
        f = h.inode
        if f.last_writer == self.name:
            return len(f.data)
        return min(h.frozen_size, len(f.data))

    def _changed(self) -> None:
        """This client changed something: it sees its own changes at once."""
        if self._attr_cache:
            self._attr_cache.clear()
        if self._dir_cache:
            self._dir_cache.clear()

    # --- handles ----------------------------------------------------------------------
    def open(
        self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False
    ) -> int:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "open", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                parent, name, node = sim.state.lookup(path)
                if node is None:
                    if not create:
                        raise_errno(errno.ENOENT, path)
                    node = sim.state.new_file(sim._now_ns())
                    parent.entries[name] = node
                    parent.mtime_ns = node.mtime_ns
                    sim.state.record_ns(node, None, (parent, name))
                    self._changed()
                elif create and exclusive:
                    raise_errno(errno.EEXIST, path)
                if isinstance(node, DirNode):
                    raise_errno(errno.EISDIR, path)
                assert isinstance(node, FileNode)
                return self._new_handle(node, path, write or create)
            finally:
                sim.plan.end(after, self.name, "open", (path,))

    def _new_handle(self, node: FileNode, path: str, writable: bool) -> int:
        """A handle of ``node`` (with ``sim._mu`` held) that sees what close-to-open lets
        this client see now."""
        sim = self._sim
        if node.last_writer == self.name:
            frozen = len(node.data)
        else:
            frozen = min(node.flushed_size, len(node.data))
        fd = sim._next_fd
        sim._next_fd += 1
        sim._handles[fd] = _Handle(fd, self.name, node, norm_path(path), writable, frozen)
        return fd

    def open_beneath(self, root: str, rel: str) -> int:
        # SimFS has no symlinks and no special files: walking the namespace is enough;
        # a file where a directory belongs, or a directory as the file, is refused.
        sim = self._sim
        path = posixpath.join(root, *beneath_parts(rel))
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "open_beneath", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                try:
                    _, _, node = sim.state.lookup(path)
                except NotADirectoryError:
                    raise NotBeneath(errno.ENOTDIR, "a component is not a directory",
                                     rel) from None
                if node is None:
                    raise_errno(errno.ENOENT, path)
                if not isinstance(node, FileNode):
                    raise NotBeneath(errno.EINVAL, "it is not a regular file (a directory)",
                                     rel)
                return self._new_handle(node, path, False)
            finally:
                sim.plan.end(after, self.name, "open_beneath", (path,))

    def close(self, fd: int) -> None:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "close", paths)
            try:
                h = self._handle(fd)
                del sim._handles[fd]
                f = h.inode
                if f.lock_owner is h:
                    f.lock_owner = None
                    sim._cond.notify_all()
                if rule is not None:
                    if f.pending:
                        sim._sync_failed(f, self.name, "close", h.path)
                    raise_errno(rule.errno, h.path)
                if h.writable:
                    f.flushed_size = len(f.data)
            finally:
                sim.plan.end(after, self.name, "close", paths)

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "writev", paths)
            try:
                h = self._handle(fd)
                if not h.writable:
                    raise_errno(errno.EBADF, h.path)
                if offset < 0:
                    raise_errno(errno.EINVAL, h.path)
                data = _join(buffers)
                if rule is not None:
                    part = sim.plan.rng.randrange(len(data)) if data else 0
                    if part:
                        sim.state.write(h.inode, offset, data[:part], self.name, sim._now_ns())
                    sim.plan.record(
                        "partial write",
                        f"{part}/{len(data)} bytes written before the error",
                        client=self.name,
                        op="writev",
                        paths=paths,
                    )
                    raise_errno(rule.errno, h.path)
                if data:
                    sim.state.write(h.inode, offset, data, self.name, sim._now_ns())
                self._changed()
                return len(data)
            finally:
                sim.plan.end(after, self.name, "writev", paths)

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "readinto", paths)
            try:
                h = self._handle(fd)
                if rule is not None:
                    raise_errno(rule.errno, h.path)
                if offset < 0:
                    raise_errno(errno.EINVAL, h.path)
                mv = memoryview(buffer).cast("B")
                n = max(0, min(len(mv), self._visible_size(h) - offset))
                if n:
                    with memoryview(h.inode.data) as src:
                        mv[:n] = src[offset : offset + n]
                return n
            finally:
                sim.plan.end(after, self.name, "readinto", paths)

    def _sync(self, fd: int, op: str) -> None:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, op, paths)
            try:
                h = self._handle(fd)
                if rule is not None:
                    if h.inode.pending:
                        sim._sync_failed(h.inode, self.name, op, h.path)
                    raise_errno(rule.errno, h.path)
                sim.state.sync_file(h.inode)
            finally:
                sim.plan.end(after, self.name, op, paths)

    def fsync(self, fd: int) -> None:
        self._sync(fd, "fsync")

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, "fdatasync")

    def truncate(self, fd: int, size: int) -> None:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "truncate", paths)
            try:
                h = self._handle(fd)
                if not h.writable or size < 0:
                    raise_errno(errno.EINVAL, h.path)
                if rule is not None:
                    raise_errno(rule.errno, h.path)
                sim.state.size_op(h.inode, TRUNC, size, self.name, sim._now_ns())
                self._changed()
            finally:
                sim.plan.end(after, self.name, "truncate", paths)

    def fstat(self, fd: int) -> FileStat:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "fstat", paths)
            try:
                h = self._handle(fd)
                if rule is not None:
                    raise_errno(rule.errno, h.path)
                f = h.inode
                return FileStat(self._visible_size(h), f.ino, False, False, f.mtime_ns,
                                self._nlink(h))
            finally:
                sim.plan.end(after, self.name, "fstat", paths)

    def _nlink(self, h: _Handle) -> int:
        """1 while the handle's inode has a name (no hard links in SimFS), else 0."""
        try:
            _, _, node = self._sim.state.lookup(h.path)
        except OSError:
            node = None
        if node is h.inode or any(n is h.inode for _, n in self._sim.state.walk()):
            return 1
        return 0

    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "reserve", paths)
            try:
                h = self._handle(fd)
                if not h.writable:
                    raise_errno(errno.EBADF, h.path)
                if offset < 0 or length <= 0:
                    raise_errno(errno.EINVAL, h.path)
                if not sim.supports_reserve:
                    return False
                if rule is not None:
                    raise_errno(rule.errno, h.path)
                if keep_size:
                    # FALLOC_FL_KEEP_SIZE: blocks are allocated and nothing a read sees
                    # changes (SimFS models contents, not space; a full disk is a rule)
                    return True
                if offset + length > len(h.inode.data):
                    sim.state.size_op(h.inode, EXTEND, offset + length, self.name, sim._now_ns())
                    self._changed()
                return True
            finally:
                sim.plan.end(after, self.name, "reserve", paths)

    # --- locks ------------------------------------------------------------------------
    def lock(self, fd: int, *, blocking: bool = True) -> bool:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "lock", paths)
            try:
                h = self._handle(fd)
                if rule is not None:
                    raise_errno(rule.errno, h.path)
                if sim.broken_locks:
                    return True
                f = h.inode
                while f.lock_owner is not None and f.lock_owner is not h:
                    if not blocking:
                        return False
                    if not sim._cond.wait(timeout=sim.lock_timeout):
                        raise SimDeadlock(
                            f"lock({h.path}) by client {self.name!r} waited {sim.lock_timeout}s:"
                            f" held by a handle of client {f.lock_owner.client!r}"
                        )
                    if sim._handles.get(fd) is not h:  # crashed or closed meanwhile
                        raise_errno(errno.EBADF, h.path)
                f.lock_owner = h
                return True
            finally:
                sim.plan.end(after, self.name, "lock", paths)

    def unlock(self, fd: int) -> None:
        sim = self._sim
        with sim._mu:
            paths = self._path_of(fd)
            rule, after = sim.plan.begin(self.name, "unlock", paths)
            try:
                h = self._handle(fd)
                if rule is not None:
                    raise_errno(rule.errno, h.path)
                if h.inode.lock_owner is h:
                    h.inode.lock_owner = None
                    sim._cond.notify_all()
            finally:
                sim.plan.end(after, self.name, "unlock", paths)

    # --- names ------------------------------------------------------------------------
    def fsync_dir(self, path: str) -> None:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "fsync_dir", (path,))
            try:
                _, _, node = sim.state.lookup(path)
                if node is None:
                    raise_errno(errno.ENOENT, path)
                if not isinstance(node, DirNode):
                    raise_errno(errno.ENOTDIR, path)
                assert isinstance(node, DirNode)
                if rule is not None:
                    raise_errno(rule.errno, path)
                sim.state.force_dir(node)
            finally:
                sim.plan.end(after, self.name, "fsync_dir", (path,))

    def mkdir(self, path: str) -> None:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "mkdir", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                parent, name, node = sim.state.lookup(path)
                if node is not None:
                    raise_errno(errno.EEXIST, path)
                d = sim.state.new_dir(sim._now_ns())
                parent.entries[name] = d
                parent.mtime_ns = d.mtime_ns
                sim.state.record_ns(d, None, (parent, name))
                self._changed()
            finally:
                sim.plan.end(after, self.name, "mkdir", (path,))

    def rename(self, src: str, dst: str) -> None:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "rename", (src, dst))
            try:
                if rule is not None:
                    raise_errno(rule.errno, src)
                sparent, sname, node = sim.state.lookup(src)
                if node is None:
                    raise_errno(errno.ENOENT, src)
                assert node is not None
                chain: list[DirNode] = []
                dparent, dname, old = sim.state.lookup(dst, chain)
                if old is node:
                    return
                if sname == "" or dname == "":
                    raise_errno(errno.EBUSY, src)
                if isinstance(node, DirNode):
                    if any(d is node for d in chain):
                        raise_errno(errno.EINVAL, dst)
                    if isinstance(old, FileNode):
                        raise_errno(errno.ENOTDIR, dst)
                    if isinstance(old, DirNode) and old.entries:
                        raise_errno(errno.ENOTEMPTY, dst)
                elif isinstance(old, DirNode):
                    raise_errno(errno.EISDIR, dst)
                del sparent.entries[sname]
                dparent.entries[dname] = node
                sparent.mtime_ns = dparent.mtime_ns = sim._now_ns()
                sim.state.record_ns(node, (sparent, sname), (dparent, dname))
                self._changed()
            finally:
                sim.plan.end(after, self.name, "rename", (src, dst))

    def unlink(self, path: str) -> None:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "unlink", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                parent, name, node = sim.state.lookup(path)
                if node is None:
                    raise_errno(errno.ENOENT, path)
                assert node is not None
                if isinstance(node, DirNode):
                    raise_errno(errno.EISDIR, path)
                del parent.entries[name]
                parent.mtime_ns = sim._now_ns()
                sim.state.record_ns(node, (parent, name), None)
                self._changed()
            finally:
                sim.plan.end(after, self.name, "unlink", (path,))

    def stat(self, path: str) -> FileStat:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "stat", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                if sim.staleness > 0:
                    now = sim.clock.now()
                    hit = self._attr_cache.get(path)
                    if hit is not None and now - hit[0] < sim.staleness:
                        if hit[1] is None:
                            raise_errno(errno.ENOENT, path)
                        assert hit[1] is not None
                        return hit[1]
                    try:
                        st = self._stat_now(path)
                    except FileNotFoundError:
                        self._attr_cache[path] = (now, None)
                        raise
                    self._attr_cache[path] = (now, st)
                    return st
                return self._stat_now(path)
            finally:
                sim.plan.end(after, self.name, "stat", (path,))

    def _stat_now(self, path: str) -> FileStat:
        _, _, node = self._sim.state.lookup(path)
        if node is None:
            raise_errno(errno.ENOENT, path)
        if isinstance(node, DirNode):
            return FileStat(0, node.ino, True, False, node.mtime_ns)
        assert isinstance(node, FileNode)
        size = len(node.data)
        if node.last_writer != self.name:
            size = min(node.flushed_size, size)
        return FileStat(size, node.ino, False, False, node.mtime_ns)

    def listdir(self, path: str) -> list[str]:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "listdir", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                if sim.staleness > 0:
                    now = sim.clock.now()
                    hit = self._dir_cache.get(path)
                    if hit is not None and now - hit[0] < sim.staleness:
                        if hit[1] is None:
                            raise_errno(errno.ENOENT, path)
                        return list(hit[1] or ())
                    try:
                        names = self._listdir_now(path)
                    except FileNotFoundError:
                        self._dir_cache[path] = (now, None)
                        raise
                    self._dir_cache[path] = (now, names)
                    return list(names)
                return self._listdir_now(path)
            finally:
                sim.plan.end(after, self.name, "listdir", (path,))

    def _listdir_now(self, path: str) -> list[str]:
        _, _, node = self._sim.state.lookup(path)
        if node is None:
            raise_errno(errno.ENOENT, path)
        if not isinstance(node, DirNode):
            raise_errno(errno.ENOTDIR, path)
        assert isinstance(node, DirNode)
        return sorted(node.entries)

    def realpath(self, path: str) -> str:
        sim = self._sim
        with sim._mu:
            rule, after = sim.plan.begin(self.name, "realpath", (path,))
            try:
                if rule is not None:
                    raise_errno(rule.errno, path)
                return norm_path(path)  # SimFS has no symlinks
            finally:
                sim.plan.end(after, self.name, "realpath", (path,))


class World(Protocol):
    """What a client needs of the simulated filesystem it is a view of (``SimFS``): the
    shared state and fault plan, the settings, the handle table and its lock."""

    plan: FaultPlan
    state: SimState
    clock: Clock
    staleness: float
    broken_locks: bool
    supports_reserve: bool
    lock_timeout: float
    _mu: Any
    _cond: Any
    _handles: dict[int, _Handle]
    _next_fd: int

    def client(self, name: str) -> SimClient: ...

    def _now_ns(self) -> int: ...

    def _sync_failed(self, f: FileNode, client: str, op: str, path: str) -> None: ...
