"""FaultyFS: the errno rules and crash points of ``fault_injection.rules`` over a real
directory, wrapping ``PosixFS`` (or any other ``Filesystem``).

Role: exercise the engine's error paths on a real filesystem (a tmp dir, JuiceFS) with
the same rule objects SimFS uses.  Effects of an injected failure:

* ``writev``: a random prefix (possibly empty) of the data is really written, then the
  error is raised (like a short write followed by ENOSPC);
* ``close``: the descriptor is really closed, then the error is raised;
* every other op (including ``fsync``/``fdatasync``, which are then *not* called, so
  the data is at best as durable as the page cache makes it): nothing is done.

It cannot lose the page cache: power loss is SimFS's job.  A crash point raises
``SimulatedCrash`` and marks the client dead (later calls raise too) until
``plan.revive()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fault_injection.rules import FaultPlan, raise_errno
from straw.fs import Buffer, FileStat, Filesystem, PosixFS


class FaultyFS(Filesystem):
    """``Filesystem`` that consults a ``FaultPlan`` before delegating to ``inner``."""

    def __init__(
        self,
        inner: Filesystem | None = None,
        *,
        plan: FaultPlan | None = None,
        seed: int = 0,
        client: str = "main",
    ) -> None:
        self.inner: Filesystem = inner if inner is not None else PosixFS()
        self.plan = plan if plan is not None else FaultPlan(seed)
        self.name = client
        self._paths: dict[int, str] = {}

    def describe(self) -> str:
        return "FaultyFS " + self.plan.describe()

    def _fd_paths(self, fd: int) -> tuple[str, ...]:
        return (self._paths.get(fd, f"<fd {fd}>"),)

    # --- handles ----------------------------------------------------------------------
    def open(
        self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False
    ) -> int:
        rule, after = self.plan.begin(self.name, "open", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            fd = self.inner.open(path, write=write, create=create, exclusive=exclusive)
            self._paths[fd] = path
            return fd
        finally:
            self.plan.end(after, self.name, "open", (path,))

    def open_beneath(self, root: str, rel: str) -> int:
        path = f"{root.rstrip('/')}/{rel}"
        rule, after = self.plan.begin(self.name, "open_beneath", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            fd = self.inner.open_beneath(root, rel)
            self._paths[fd] = path
            return fd
        finally:
            self.plan.end(after, self.name, "open_beneath", (path,))

    def close(self, fd: int) -> None:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "close", paths)
        try:
            self._paths.pop(fd, None)
            self.inner.close(fd)
            if rule is not None:
                raise_errno(rule.errno, paths[0])
        finally:
            self.plan.end(after, self.name, "close", paths)

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "writev", paths)
        try:
            if rule is not None:
                data = b"".join(memoryview(b).cast("B") for b in buffers)
                part = self.plan.rng.randrange(len(data)) if data else 0
                if part:
                    self.inner.writev(fd, [memoryview(data)[:part]], offset)
                self.plan.record(
                    "partial write",
                    f"{part}/{len(data)} bytes written before the error",
                    client=self.name,
                    op="writev",
                    paths=paths,
                )
                raise_errno(rule.errno, paths[0])
            return self.inner.writev(fd, buffers, offset)
        finally:
            self.plan.end(after, self.name, "writev", paths)

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "readinto", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            return self.inner.readinto(fd, buffer, offset)
        finally:
            self.plan.end(after, self.name, "readinto", paths)

    def fsync(self, fd: int) -> None:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "fsync", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            self.inner.fsync(fd)
        finally:
            self.plan.end(after, self.name, "fsync", paths)

    def fdatasync(self, fd: int) -> None:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "fdatasync", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            self.inner.fdatasync(fd)
        finally:
            self.plan.end(after, self.name, "fdatasync", paths)

    def truncate(self, fd: int, size: int) -> None:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "truncate", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            self.inner.truncate(fd, size)
        finally:
            self.plan.end(after, self.name, "truncate", paths)

    def fstat(self, fd: int) -> FileStat:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "fstat", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            return self.inner.fstat(fd)
        finally:
            self.plan.end(after, self.name, "fstat", paths)

    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "reserve", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            return self.inner.reserve(fd, offset, length, keep_size=keep_size)
        finally:
            self.plan.end(after, self.name, "reserve", paths)

    # --- locks ------------------------------------------------------------------------
    def lock(self, fd: int, *, blocking: bool = True) -> bool:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "lock", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            return self.inner.lock(fd, blocking=blocking)
        finally:
            self.plan.end(after, self.name, "lock", paths)

    def unlock(self, fd: int) -> None:
        paths = self._fd_paths(fd)
        rule, after = self.plan.begin(self.name, "unlock", paths)
        try:
            if rule is not None:
                raise_errno(rule.errno, paths[0])
            self.inner.unlock(fd)
        finally:
            self.plan.end(after, self.name, "unlock", paths)

    # --- names ------------------------------------------------------------------------
    def fsync_dir(self, path: str) -> None:
        rule, after = self.plan.begin(self.name, "fsync_dir", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            self.inner.fsync_dir(path)
        finally:
            self.plan.end(after, self.name, "fsync_dir", (path,))

    def mkdir(self, path: str) -> None:
        rule, after = self.plan.begin(self.name, "mkdir", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            self.inner.mkdir(path)
        finally:
            self.plan.end(after, self.name, "mkdir", (path,))

    def rename(self, src: str, dst: str) -> None:
        rule, after = self.plan.begin(self.name, "rename", (src, dst))
        try:
            if rule is not None:
                raise_errno(rule.errno, src)
            self.inner.rename(src, dst)
        finally:
            self.plan.end(after, self.name, "rename", (src, dst))

    def unlink(self, path: str) -> None:
        rule, after = self.plan.begin(self.name, "unlink", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            self.inner.unlink(path)
        finally:
            self.plan.end(after, self.name, "unlink", (path,))

    def stat(self, path: str) -> FileStat:
        rule, after = self.plan.begin(self.name, "stat", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            return self.inner.stat(path)
        finally:
            self.plan.end(after, self.name, "stat", (path,))

    def listdir(self, path: str) -> list[str]:
        rule, after = self.plan.begin(self.name, "listdir", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            return self.inner.listdir(path)
        finally:
            self.plan.end(after, self.name, "listdir", (path,))

    def realpath(self, path: str) -> str:
        rule, after = self.plan.begin(self.name, "realpath", (path,))
        try:
            if rule is not None:
                raise_errno(rule.errno, path)
            return self.inner.realpath(path)
        finally:
            self.plan.end(after, self.name, "realpath", (path,))
