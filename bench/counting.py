"""``CountingFS``: a ``Filesystem`` that counts calls per method and delegates everything.

Wraps any ``straw.fs.Filesystem`` (``PosixFS``, SimFS, FaultyFS).  The benchmark uses it to
count data and directory syncs per publication; ``snapshot()``/``delta()`` give the calls
made inside a window.  Methods the interface does not define are delegated untouched (and
not counted) through ``__getattr__``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from straw.fs import Buffer, FileStat, Filesystem

SYNC_METHODS = ("fsync", "fdatasync", "fsync_dir")


class CountingFS(Filesystem):
    """Counts every primitive call by method name in ``calls``; delegates to ``inner``."""

    def __init__(self, inner: Filesystem) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes this class does not define
        return getattr(self.inner, name)

    # --- counting -----------------------------------------------------------------
    def snapshot(self) -> dict[str, int]:
        return dict(self.calls)

    def delta(self, before: Mapping[str, int]) -> dict[str, int]:
        """Calls made since ``before`` (a ``snapshot()``), zero counts left out."""
        out = {k: v - before.get(k, 0) for k, v in self.calls.items()}
        return {k: v for k, v in sorted(out.items()) if v}

    @staticmethod
    def syncs(calls: Mapping[str, int]) -> int:
        """fsync + fdatasync + directory fsync calls in ``calls``."""
        return sum(calls.get(m, 0) for m in SYNC_METHODS)

    def reset(self) -> None:
        self.calls.clear()

    # --- handles ------------------------------------------------------------------
    def open(
        self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False
    ) -> int:
        self.calls["open"] += 1
        return self.inner.open(path, write=write, create=create, exclusive=exclusive)

    def open_beneath(self, root: str, rel: str) -> int:
        self.calls["open_beneath"] += 1
        return self.inner.open_beneath(root, rel)

    def close(self, fd: int) -> None:
        self.calls["close"] += 1
        self.inner.close(fd)

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        self.calls["writev"] += 1
        return self.inner.writev(fd, buffers, offset)

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        self.calls["readinto"] += 1
        return self.inner.readinto(fd, buffer, offset)

    def fsync(self, fd: int) -> None:
        self.calls["fsync"] += 1
        self.inner.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self.calls["fdatasync"] += 1
        self.inner.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        self.calls["truncate"] += 1
        self.inner.truncate(fd, size)

    def fstat(self, fd: int) -> FileStat:
        self.calls["fstat"] += 1
        return self.inner.fstat(fd)

    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        self.calls["reserve"] += 1
        return self.inner.reserve(fd, offset, length, keep_size=keep_size)

    # --- locks --------------------------------------------------------------------
    def lock(self, fd: int, *, blocking: bool = True) -> bool:
        self.calls["lock"] += 1
        return self.inner.lock(fd, blocking=blocking)

    def unlock(self, fd: int) -> None:
        self.calls["unlock"] += 1
        self.inner.unlock(fd)

    # --- names --------------------------------------------------------------------
    def fsync_dir(self, path: str) -> None:
        self.calls["fsync_dir"] += 1
        self.inner.fsync_dir(path)

    def mkdir(self, path: str) -> None:
        self.calls["mkdir"] += 1
        self.inner.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        self.calls["rename"] += 1
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self.calls["unlink"] += 1
        self.inner.unlink(path)

    def stat(self, path: str) -> FileStat:
        self.calls["stat"] += 1
        return self.inner.stat(path)

    def listdir(self, path: str) -> list[str]:
        self.calls["listdir"] += 1
        return self.inner.listdir(path)

    def realpath(self, path: str) -> str:
        self.calls["realpath"] += 1
        return self.inner.realpath(path)
