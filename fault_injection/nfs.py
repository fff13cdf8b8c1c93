"""An NFS client over SimFS: close-to-open consistency plus the attribute, directory and
negative-lookup caches of the Linux NFS client, for ``straw qualify``'s NFS profile.

NFS is not mountable in this sandbox, so this models what its default mount options do
(``nfs(5)``), per client, on the injected clock:

* close-to-open: ``open`` revalidates the file with the server, so bytes flushed by
  another client's ``close``/``fsync`` are read after an ``open`` (SimFS already models
  this: ``flushed_size`` bounds what another client's open sees);
* attribute cache (``acregmin``/``acregmax``, default 3..60 s): ``stat`` may answer from
  attributes up to ``attr_timeout`` old -- also for a name another client removed;
* directory cache (``acdirmin``/``acdirmax``, default 30..60 s): a listing may be up to
  ``dir_timeout`` old;
* ``lookupcache=all`` (the default): a failed lookup is cached until the parent
  directory's attributes expire, so a name another client *created* stays "not found"
  for ``open`` and ``stat`` up to ``negative_timeout`` (= acdirmin).  ``lookupcache=
  positive`` revalidates negative entries (``negative_timeout=0``).

A client's own namespace changes drop its caches (it knows what it did).  Locks, data,
exclusive create and unlink go to the server (the SimFS) unchanged: NFSv4 locks and
O_EXCL are server-side.  Only the minimum of each timeout is modelled (caches of files
that do not change grow towards acregmax: longer, never shorter).

``nfs_client(sim, name, options)`` builds a client from mount-option text, e.g.
``"defaults"`` or ``"actimeo=0,lookupcache=positive"``.
"""

from __future__ import annotations

import errno
import os

from fault_injection.simfs import SimClient, SimFS
from straw.clock import Clock
from straw.fs import FileStat
from straw.fs_delegating import DelegatingFilesystem


def _enoent(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


class NFSClient(DelegatingFilesystem):
    """One NFS client's view of the SimFS ``inner`` (see the module docstring); the
    operations it does not cache go to the server unchanged (``DelegatingFilesystem``)."""

    def __init__(self, inner: SimClient, clock: Clock, *, attr_timeout: float = 3.0,
                 dir_timeout: float = 30.0, negative_timeout: float = 30.0) -> None:
        self.inner = inner
        self.clock = clock
        self.attr_timeout = attr_timeout
        self.dir_timeout = dir_timeout
        self.negative_timeout = negative_timeout
        self._attr: dict[str, tuple[float, FileStat | None]] = {}
        self._dirs: dict[str, tuple[float, list[str]]] = {}
        self._negative: dict[str, float] = {}

    def _fresh(self, t: float, timeout: float) -> bool:
        return self.clock.now() - t < timeout

    def _changed(self) -> None:
        self._attr.clear()
        self._dirs.clear()
        self._negative.clear()

    def _negative_hit(self, path: str) -> bool:
        t = self._negative.get(path)
        return t is not None and self._fresh(t, self.negative_timeout)

    def _missed(self, path: str) -> None:
        if self.negative_timeout > 0:
            self._negative[path] = self.clock.now()

    # --- names: cached -------------------------------------------------------------------
    def open(self, path: str, *, write: bool = False, create: bool = False,
             exclusive: bool = False) -> int:
        if create:
            fd = self.inner.open(path, write=write, create=create, exclusive=exclusive)
            self._changed()
            return fd
        if self._negative_hit(path):
            raise _enoent(path)
        try:
            fd = self.inner.open(path, write=write)  # close-to-open: revalidated
        except FileNotFoundError:
            self._missed(path)
            raise
        self._negative.pop(path, None)
        return fd

    def stat(self, path: str) -> FileStat:
        if self._negative_hit(path):
            raise _enoent(path)
        hit = self._attr.get(path)
        if hit is not None and self._fresh(hit[0], self.attr_timeout):
            if hit[1] is None:
                raise _enoent(path)
            return hit[1]
        try:
            st = self.inner.stat(path)
        except FileNotFoundError:
            self._missed(path)
            raise
        self._attr[path] = (self.clock.now(), st)
        return st

    def listdir(self, path: str) -> list[str]:
        hit = self._dirs.get(path)
        if hit is not None and self._fresh(hit[0], self.dir_timeout):
            return list(hit[1])
        names = self.inner.listdir(path)
        self._dirs[path] = (self.clock.now(), names)
        return list(names)

    # --- namespace changes: to the server, our caches dropped ----------------------------
    def mkdir(self, path: str) -> None:
        self.inner.mkdir(path)
        self._changed()

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)
        self._changed()

    def unlink(self, path: str) -> None:
        self.inner.unlink(path)
        self._changed()

    def unlink_beneath(self, root: str, rel: str) -> None:
        self.inner.unlink_beneath(root, rel)
        self._changed()


def parse_options(options: str) -> dict[str, float]:
    """NFS mount options -> NFSClient timeouts (only what the model knows)."""
    acregmin, acdirmin, lookupcache = 3.0, 30.0, "all"
    for opt in (o.strip() for o in options.split(",") if o.strip()):
        key, _, value = opt.partition("=")
        if key == "noac":
            acregmin = acdirmin = 0.0
        elif key == "actimeo":
            acregmin = acdirmin = float(value)
        elif key == "acregmin":
            acregmin = float(value)
        elif key == "acdirmin":
            acdirmin = float(value)
        elif key == "lookupcache":
            lookupcache = value
        elif key != "defaults":
            raise ValueError(f"NFS option {opt!r} is not modelled")
    negative = acdirmin if lookupcache == "all" else 0.0
    return {"attr_timeout": acregmin, "dir_timeout": acdirmin, "negative_timeout": negative}


def nfs_client(sim: SimFS, name: str, options: str = "defaults") -> NFSClient:
    """Client ``name`` of the NFS server ``sim`` mounted with ``options``."""
    return NFSClient(sim.client(name), sim.clock, **parse_options(options))
