"""Exclusive holder locks: a ``LOCK`` file whose ``flock`` says who holds a role (a writer
id, a queue's coordinator) and whose text names the holder for the error message another
process gets ("in use by host H pid P since T").  The lock dies with its process."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator

from ..clock import Clock
from ..fs import Filesystem
from .pack import storage_error

# The purpose a collection names while it holds a dead writer's lock for a moment (to seal
# that writer's open packs on its behalf): a writer starting meanwhile waits instead of failing.
COLLECTING = "collection sealing the packs of a dead writer"


def take(fs: Filesystem, path: str, clock: Clock, *, purpose: str = "") -> tuple[int | None, str]:
    """Try to take the lock at ``path`` without waiting.  Returns ``(fd, "")`` when taken
    (the file then names us, and ``purpose`` if given), or ``(None, description of the
    holder)``."""
    try:
        fd = fs.open(path, write=True, create=True)
    except OSError as e:
        raise storage_error(e, f"cannot open lock file {path}") from e
    if not fs.lock(fd, blocking=False):
        holder = describe(fs, fd)
        fs.close(fd)
        return None, holder
    note: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid(),
                               "since": clock.now()}
    if purpose:
        note["purpose"] = purpose
    try:
        fs.truncate(fd, 0)
        fs.writev(fd, [json.dumps(note).encode()], 0)
    except OSError:
        pass  # the text only informs other processes (a full disk must not stop us)
    return fd, ""


def describe(fs: Filesystem, fd: int) -> str:
    try:
        buf = bytearray(fs.fstat(fd).size)
        fs.readinto(fd, buf, 0)
        info = json.loads(bytes(buf) or b"{}")
        purpose = f" ({info['purpose']})" if info.get("purpose") else ""
        return f"host {info.get('host')} pid {info.get('pid')} since {info.get('since')}{purpose}"
    except (OSError, ValueError):
        return "an unknown holder"


def release(fs: Filesystem, fd: int | None) -> None:
    if fd is not None:
        try:
            fs.unlock(fd)
            fs.close(fd)
        except OSError:
            pass


@contextlib.contextmanager
def if_dead(fs: Filesystem, writer_dir: str, clock: Clock) -> Iterator[bool]:
    """Hold the ``LOCK`` of the writer at ``writer_dir`` for the block if it is free (the
    writer is dead: a live one holds it from start to close), naming ``COLLECTING`` so
    that the writer id starting meanwhile waits; yields whether it is held (False: the
    writer is alive, or another collection holds it right now)."""
    fd, _ = take(fs, os.path.join(writer_dir, "LOCK"), clock, purpose=COLLECTING)
    try:
        yield fd is not None
    finally:
        release(fs, fd)
