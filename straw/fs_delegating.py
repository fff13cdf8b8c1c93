"""``DelegatingFilesystem``: a ``Filesystem`` that forwards every call to another, for
wrappers that change one thing (a backend's sync observer, qualify's negative controls,
the NFS client model).  Every call is forwarded explicitly, the safe ones included
(``open_beneath``, ``unlink_beneath``): a wrapper never falls back to a path-following
default of ``Filesystem``."""

from __future__ import annotations

from collections.abc import Sequence

from .fs import Buffer, FileStat, Filesystem


class DelegatingFilesystem(Filesystem):
    """A ``Filesystem`` that forwards everything to ``inner``; a subclass overrides what it
    changes: a backend's sync observer (``straw.backend``), qualify's negative controls (they
    break one operation), the NFS client model (it caches)."""

    def __init__(self, inner: Filesystem) -> None:
        self.inner = inner

    def open(self, path: str, *, write: bool = False, create: bool = False,
             exclusive: bool = False) -> int:
        return self.inner.open(path, write=write, create=create, exclusive=exclusive)

    def open_beneath(self, root: str, rel: str) -> int:
        return self.inner.open_beneath(root, rel)

    def close(self, fd: int) -> None:
        self.inner.close(fd)

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        return self.inner.writev(fd, buffers, offset)

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        return self.inner.readinto(fd, buffer, offset)

    def fsync(self, fd: int) -> None:
        self.inner.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self.inner.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        self.inner.truncate(fd, size)

    def fstat(self, fd: int) -> FileStat:
        return self.inner.fstat(fd)

    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        return self.inner.reserve(fd, offset, length, keep_size=keep_size)

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        self.inner.drop_cached(fd, offset, length)

    def lock(self, fd: int, *, blocking: bool = True) -> bool:
        return self.inner.lock(fd, blocking=blocking)

    def unlock(self, fd: int) -> None:
        self.inner.unlock(fd)

    def fsync_dir(self, path: str) -> None:
        self.inner.fsync_dir(path)

    def mkdir(self, path: str) -> None:
        self.inner.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self.inner.unlink(path)

    def unlink_beneath(self, root: str, rel: str) -> None:
        self.inner.unlink_beneath(root, rel)

    def stat(self, path: str) -> FileStat:
        return self.inner.stat(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def realpath(self, path: str) -> str:
        return self.inner.realpath(path)
