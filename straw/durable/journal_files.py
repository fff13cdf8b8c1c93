"""Reading a queue journal's files for recovery (``straw.durable.recovery``).

* Each segment and snapshot is opened beneath the queue directory
  (``Filesystem.open_beneath``): a symbolic link in place of the file, or of the
  ``journal`` directory itself, is ``CorruptData`` naming the file and is never followed.
  A link into another pool's journal would otherwise make recovery and ``straw inspect``
  load that pool's queue as this one.
* A segment is read up to its *clean end*, never to the end of the file: its frames
  (walked by their headers), then up to the first run of ``CLEAN_RUN`` zero bytes after
  them, or a short read (a size cached by another client may be stale, so the size is
  never trusted).  Reads and memory follow the frames, not the file's size: the reserved
  tail is at most ``segments.DEFAULT_RESERVE`` of zeros, and a segment extended by a sparse
  tail of 64 GiB costs what its frames cost.  The run is looked for only after the frames,
  so zero bytes inside a transaction never end a read.  A frame is walked only if it fits
  in the file's size (asked with ``fstat`` when a frame passes the size last seen): a
  forged length ends the walk there, and the frames' torn-tail rule judges it.
  Blind spot (``straw.catalog`` has the same): damage that zeroes ``CLEAN_RUN`` or more
  bytes right where the frames stop, followed by frames of a later write group, reads as
  the clean end instead of ``CorruptData`` (in a rotated segment the next segment's
  sequence number still tells).
"""

from __future__ import annotations

import errno
import os
from typing import Any

from ..errors import CorruptData, StrawError, storage_error
from ..fs import Filesystem, NotBeneath
from . import framing

CLEAN_RUN = 1 << 20  # zero bytes after a segment's frames that end the read
_CHUNK = 1 << 20  # one read of a segment
_FIRST_READ = 1 << 20  # first read of a snapshot file: header, metadata, often all of it


def _frame_length(data: bytes | bytearray) -> int:
    """Length of the frame starting ``data`` by its header; 0 if the header does not
    decode (whoever decodes the frame reports why)."""
    try:
        return framing.decode_header(data).frame_length
    except (framing.TornFrame, StrawError):
        return 0


def read_to_clean_end(fs: Filesystem, fd: int) -> bytes:
    """The file of frames open as ``fd``, from its start up to its clean end (module
    docstring)."""
    out = bytearray()
    walked, walking = 0, True  # the end of the frames walked so far; whether it goes on
    zeros = 0  # how many zero bytes end what was read
    size = 0  # the file's size when last asked: a frame must fit in it to be walked
    while True:
        chunk = bytearray(_CHUNK)
        n = fs.readinto(fd, chunk, len(out))
        out += memoryview(chunk)[:n]
        if n < _CHUNK:
            return bytes(out)
        data = len(chunk.rstrip(b"\0"))
        zeros = zeros + n if data == 0 else n - data
        while walking and walked + framing.HEADER_SIZE <= len(out):
            length = _frame_length(out[walked:walked + framing.HEADER_SIZE])
            if walked + length > max(size, len(out)):
                size = fs.fstat(fd).size  # asked again only when a frame passes it
            walking = 0 < length and walked + length <= max(size, len(out))
            walked += length if walking else 0
        if not walking and min(zeros, len(out) - walked) >= CLEAN_RUN:
            return bytes(out)


class Reader:
    """File reads for recovery, counted in ``stats``; ``directory`` is the journal
    directory (``<queue>/journal``)."""

    def __init__(self, fs: Filesystem, directory: str, stats: dict[str, Any]) -> None:
        self.fs = fs
        self.dir = directory
        self.stats = stats
        self._queue_dir, self._journal = os.path.split(os.path.abspath(directory))

    def _open(self, name: str) -> int | None:
        """The journal file ``name`` open for reading, or None if it does not exist."""
        path = os.path.join(self.dir, name)
        try:
            return self.fs.open_beneath(self._queue_dir, f"{self._journal}/{name}")
        except FileNotFoundError:
            return None
        except NotBeneath as e:
            if e.errno in (errno.EINVAL, errno.ENXIO):  # no link: a FIFO, a directory ...
                self._not_a_file(path)
            raise CorruptData(f"{path}: not a regular file of the journal directory "
                              f"({e.strerror}); a journal file is never read through a "
                              "symbolic link (it could be another queue's)") from None
        except OSError as e:
            raise storage_error(e, f"cannot open journal file {path}") from e

    def _not_a_file(self, path: str) -> None:
        """Raise the error naming what ``path`` is instead of a file: ``open`` says which
        special file (it never blocks on one); a directory is ``CorruptData``."""
        try:
            fd = self.fs.open(path)
        except OSError as e:
            raise storage_error(e, f"cannot open journal file {path}") from e
        self._close(fd)
        raise CorruptData(f"{path}: not a regular file of the journal directory")

    def _close(self, fd: int) -> None:
        try:
            self.fs.close(fd)
        except OSError:
            pass

    def read(self, name: str, limit: int | None = None, *, sync: bool = False
             ) -> bytes | None:
        """The file's bytes up to ``limit``, or else up to its clean end (module
        docstring); read until a short read; None if it does not exist.  ``sync``: fsync
        the file after reading (what we act on is durable)."""
        fd = self._open(name)
        if fd is None:
            return None
        try:
            data = read_to_clean_end(self.fs, fd) if limit is None \
                else self.fs.read_to_end(fd, 0, limit)
            if sync:
                self.fs.fsync(fd)
                self.stats["fsyncs"] += 1
        except OSError as e:
            raise storage_error(e, f"cannot read journal file {self.dir}/{name}") from e
        finally:
            self._close(fd)
        self.stats["files_read"] += 1
        self.stats["bytes_read"] += len(data)
        return data

    def read_one_frame(self, name: str) -> memoryview | None:
        """``read`` for a file that holds one frame (a snapshot, tens of MiB), into ONE
        buffer and without copying it: the first read shows the frame header, whose length
        sizes the buffer for the rest, plus one byte to notice anything after the frame.
        Still read until a short read (if the header does not decode, or more follows, the
        buffer doubles); the caller checks the frame.  None if the file does not exist."""
        fd = self._open(name)
        if fd is None:
            return None
        try:
            buf = bytearray(_FIRST_READ)
            n = self.fs.readinto(fd, buf, 0)
            while n == len(buf):  # not the end yet
                want = _frame_length(buf) + 1
                if want > 2 * len(buf) and want > self.fs.fstat(fd).size + 1:
                    want = 0  # a length the file cannot hold: never allocated
                bigger = bytearray(max(want, 2 * len(buf)))
                bigger[:n] = buf
                buf = bigger
                n += self.fs.readinto(fd, memoryview(buf)[n:], n)
        except OSError as e:
            raise storage_error(e, f"cannot read journal file {self.dir}/{name}") from e
        finally:
            self._close(fd)
        self.stats["files_read"] += 1
        self.stats["bytes_read"] += n
        return memoryview(buf)[:n].toreadonly()

    def exists(self, name: str) -> bool:
        """Probe by ``open`` (a fresh lookup; a listing or stat may be cached)."""
        path = os.path.join(self.dir, name)
        try:
            return self.fs.probe(path)
        except OSError as e:
            raise storage_error(e, f"cannot open journal file {path}") from e
