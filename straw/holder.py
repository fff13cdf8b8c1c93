"""Exclusive holder locks: a ``LOCK`` file whose ``flock`` says who holds a role (a writer
id, a queue's coordinator) and whose text names the holder for the error message another
process gets ("in use by host H pid P since T").  The lock dies with its process."""

from __future__ import annotations

import json
import os
import socket

from .clock import Clock
from .fs import Filesystem
from .pack import storage_error


def take(fs: Filesystem, path: str, clock: Clock) -> tuple[int | None, str]:
    """Try to take the lock at ``path`` without waiting.  Returns ``(fd, "")`` when taken
    (the file then names us), or ``(None, description of the holder)``."""
    try:
        fd = fs.open(path, write=True, create=True)
    except OSError as e:
        raise storage_error(e, f"cannot open lock file {path}") from e
    if not fs.lock(fd, blocking=False):
        holder = describe(fs, fd)
        fs.close(fd)
        return None, holder
    info = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "since": clock.now()}).encode()
    fs.truncate(fd, 0)
    fs.writev(fd, [info], 0)
    return fd, ""


def describe(fs: Filesystem, fd: int) -> str:
    try:
        buf = bytearray(fs.fstat(fd).size)
        fs.readinto(fd, buf, 0)
        info = json.loads(bytes(buf) or b"{}")
        return f"host {info.get('host')} pid {info.get('pid')} since {info.get('since')}"
    except (OSError, ValueError):
        return "an unknown holder"


def release(fs: Filesystem, fd: int | None) -> None:
    if fd is not None:
        try:
            fs.unlock(fd)
            fs.close(fd)
        except OSError:
            pass
