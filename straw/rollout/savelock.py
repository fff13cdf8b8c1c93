"""One controller per save directory: ``L/rollout/LOCK``, flocked for the controller's
life (``straw.holder``'s pattern, through the ``Filesystem``).  Its text names the holder
(host, pid, since), so a second controller's ``SaveDirLocked`` says who holds it; the
kernel drops a flock when its process dies, so a SIGKILLed controller never leaves the
directory locked (nothing to clean up, no stale-lock guess)."""

from __future__ import annotations

import os

from straw import holder
from straw.clock import Clock, SystemClock
from straw.fs import Filesystem, PosixFS

from .checkpoint_errors import SaveDirLocked
from .checkpoint_files import ROLLOUT

LOCK = "LOCK"


class SaveLock:
    """The save directory ``root``'s lock, taken at construction (``SaveDirLocked``
    naming the holder if another controller has it), released by ``close`` or by the
    holder's death."""

    def __init__(self, root: str, *, fs: Filesystem | None = None,
                 clock: Clock | None = None) -> None:
        self.fs = fs or PosixFS()
        self.root = os.path.abspath(root)
        self.path = os.path.join(self.root, ROLLOUT, LOCK)
        self.fs.makedirs_durable(os.path.dirname(self.path))
        fd, held_by = holder.take(self.fs, self.path, clock or SystemClock(),
                                  purpose="rollout controller of this save directory")
        if fd is None:
            raise SaveDirLocked(f"save directory {self.root} is in use by {held_by}: one "
                                "controller per save directory; stop that job, or save "
                                "elsewhere")
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        holder.release(self.fs, self._fd)
        self._fd = None

    def __enter__(self) -> SaveLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SaveLock", "LOCK"]
