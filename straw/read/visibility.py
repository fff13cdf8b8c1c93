"""Visibility lag or loss: what a read that finds bytes missing does (D6).

A mismatch of bytes that are present is ``CorruptData`` at once, never retried.  Bytes
that are *missing* (the file is shorter than the extent, or still reads as zeros, wholly
or on one side of a page boundary, or the file is not visible yet) may be another
client's visibility lag: the read reopens the file, drops the range's cached pages (a
reopen may keep a stale page: see ``Filesystem.drop_cached``) and retries a bounded
number of times, then raises ``StorageUnavailable`` — except a frame header zeroed on
one side of a page boundary, whose bytes are present: if it stays damaged through every
retry it is ``CorruptData``.

When the pack is *final* there is no lag to wait for, so nothing is retried: a pack whose
file ends in a valid SEAL trailer, or that the catalog knows as sealed or reclaimed, or
that the catalog never heard of (a pack is known to the catalog before its file exists),
or that the reading store itself is writing (its own writes are visible to it) — asked
only after a read failed (the store's ``pack_status`` callback), then confirmed by one
more read through a freshly opened descriptor (close-to-open).  A final pack fails at
once: ``InvalidReference`` for a reference that cannot be right (no publication starts at
its offset, its size runs past an intact pack, its pack was reclaimed or never written),
``CorruptData`` for damage (a sealed or own pack truncated or zeroed below a published
extent, a sealed pack deleted outside straw, a checksum mismatch); the store's own pack
missing is ``StorageUnavailable`` (moved outside straw).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..clock import Clock
from ..durable import framing
from ..errors import (
    CorruptData,
    ExtentMismatch,
    InvalidReference,
    StorageUnavailable,
    StrawError,
)
from ..fs import Filesystem
from ..pool.pack import read_sealed_index
from ..pool.refs import RecordSetRef, SegmentRef, check_pack_path
from . import buffers
from .buffers import PAGE
from .cache import PackCache
from .extents import check_frame

_ZERO_HEADER = bytes(framing.HEADER_SIZE)


@dataclass(frozen=True)
class PackStatus:
    """What the pool's catalog knows of a pack: ``state`` is ``"unknown"`` (never
    opened: a pack is known to the catalog before its file is created), ``"open"``,
    ``"sealed"`` or ``"tombstoned"`` (reclaimed); ``offsets`` are the extents of a sealed
    pack.  ``"own"``: the pack the reading store itself is writing, whose bytes went
    through this client (no visibility lag to wait for); ``offsets``: the extents it
    wrote there."""

    state: str
    offsets: frozenset[int] = frozenset()


PackStatusFn = Callable[[str], "PackStatus | None"]  # None: the catalog cannot tell


@dataclass(frozen=True)
class Lag:
    """Bytes not (yet) visible (``kind``: missing, short, zeros, partial): another
    client's visibility lag unless the pack is final."""

    kind: str
    detail: str


@dataclass(frozen=True)
class Final:
    """A pack whose content cannot change any more (D6: no visibility lag to wait for).
    ``kind``: ``complete`` (the file ends in a valid SEAL trailer; ``offsets`` from its
    index), ``sealed`` (the catalog says so; the file may be damaged), ``reclaimed``
    (tombstoned), ``unknown`` (the catalog never heard of it and the file is missing),
    ``own`` (the reading store is its writer: what it wrote is visible to it)."""

    kind: str
    offsets: frozenset[int] = frozenset()


def zero_tail(parts: list[tuple[int, memoryview]], start: int, end: int) -> bool:
    """True if the extent [start, end), read as ``parts`` ((file offset, bytes) pieces),
    ends in zeros from a page boundary on (``_zero_page_tail`` across pieces)."""
    tail = start
    for off, buf in parts:
        arr: Any = np.frombuffer(buf, dtype=np.uint8)
        nz = np.flatnonzero(arr)
        if nz.size:
            tail = max(tail, off + int(nz[-1]) + 1)
    boundary = -(-tail // PAGE) * PAGE
    return tail > start and boundary < end


def _refuse_another_frame(path: str, offset: int, head: memoryview, frame_size: int) -> None:
    """``ExtentMismatch`` if ``head`` is a whole, valid frame header naming a frame size
    other than ``frame_size``: the bytes that are there contradict the reference, so the
    missing ones are no lag to wait for (a pack's size is what was written, and an edited
    size past it would otherwise be waited for).  A header that does not decode may be
    partly visible: the caller's lag rules decide."""
    try:
        header = framing.decode_header(head)
    except CorruptData:
        return
    if header.kind == framing.KIND_EXTENT and header.frame_length != frame_size:
        raise ExtentMismatch(
            f"a reference of {frame_size} bytes at {path} offset {offset} does not match the "
            f"frame there ({header.frame_length} bytes); the reference is edited or stale: "
            "use the reference publish returned")


def _zero_page_tail(buf: memoryview, file_offset: int) -> bool:
    """True if ``buf`` (read at ``file_offset``) ends in zeros from a page boundary on:
    the pattern of another client seeing only the first pages of fresh data (reserved
    space reads as zeros).  Only consulted after a checksum already failed."""
    arr: Any = np.frombuffer(buf, dtype=np.uint8)
    nonzero = np.flatnonzero(arr)
    tail_start = int(nonzero[-1]) + 1 if nonzero.size else 0
    boundary = -(-(file_offset + tail_start) // PAGE) * PAGE - file_offset
    return tail_start > 0 and boundary < len(buf)


def _partial_header(head: memoryview, file_offset: int) -> bool:
    """A header that fails its check and is zeros on one side of a page boundary it
    straddles: another client's partial view of fresh data, either pages from the boundary
    on not visible yet, or the page before it still cached from before the write (it held
    reserved zeros then; the pack's size did not change, so nothing invalidated it)."""
    try:
        framing.decode_header(head)
    except CorruptData:
        cut = -file_offset % PAGE  # where a page boundary cuts the header, if it does
        stale_head = 0 < cut < len(head) and head[:cut] == bytes(cut)
        return stale_head or _zero_page_tail(head, file_offset)
    except Exception:  # torn or unsupported: not this case
        return False
    return False


class Attempts:
    """The bounded wait of one read for another client's visibility lag: after each
    failed attempt ``again`` drops the pack's descriptor and asks whether the pack is
    final; the next attempt goes through a fresh descriptor, at once for a final pack,
    else after a backoff that doubles up to a second, ``retries`` times at most."""

    __slots__ = ("_delay", "_path", "_reads", "attempt", "final")

    def __init__(self, reads: Visibility, path: str) -> None:
        self._reads = reads
        self._path = path
        self._delay = reads.backoff
        self.attempt = 0
        self.final: Final | None = None

    def again(self) -> bool:
        """After a failed attempt: True to try once more, False once the retries are
        spent (the pack is not final and stayed unreadable)."""
        reads = self._reads
        reads.cache.drop(self._path)
        self.final = reads.finality(self._path)
        if self.final is not None:
            return True  # no lag to wait for: one more read through a fresh descriptor
        if self.attempt == reads.retries:
            return False
        reads.clock.sleep(self._delay)
        self._delay = min(self._delay * 2, 1.0)
        self.attempt += 1
        return True


@dataclass(eq=False)
class Visibility:
    """Reads of pack bytes that tell another client's visibility lag from loss: each
    retries what may be lag ``retries`` times at most, after a backoff from ``backoff``
    seconds on, and fails at once on a final pack (the module text).  ``pack_status``
    tells what the pool's catalog knows of a pack."""

    fs: Filesystem
    cache: PackCache
    run_id: str
    clock: Clock
    retries: int
    backoff: float
    pack_status: PackStatusFn | None

    def read_exact(self, path: str, offset: int, size: int, into: Any = None,
                   frame: bool = False, frame_size: int | None = None) -> memoryview:
        """Exactly ``size`` bytes at ``offset``.  Missing bytes (short file, zero header,
        file not visible) are retried a bounded number of times for visibility lag, then
        ``StorageUnavailable`` — unless the pack is final: then one more read through a
        fresh descriptor, and the error at once (``frame``: ``offset`` is where the
        reference says an extent starts; ``frame_size``: the extent's size by the
        reference, so that a file too short for it whose frame header is there and names
        another size is an edited reference at once, ``ExtentMismatch``, not lag)."""
        buf = buffers.alloc(size) if into is None else memoryview(into).cast("B")
        if buf.nbytes != size:
            raise ValueError(f"buffer holds {buf.nbytes} bytes, {size} requested")
        check_pack_path(path, self.run_id)
        lag = self._try_read(path, offset, buf, frame, frame_size=frame_size,
                             give_up=self.retries == 0)
        if lag is None:
            return buf
        return self._retry(path, offset, buf, frame, frame_size, lag)

    def _retry(self, path: str, offset: int, buf: memoryview, frame: bool,
               frame_size: int | None, lag: Lag) -> memoryview:
        """``read_exact`` after its first attempt found ``lag``."""
        tries = Attempts(self, path)
        while True:
            if tries.final is not None:
                self.cache.drop(path)
                raise self._final_error(tries.final, path, offset, lag, frame)
            if not tries.again():
                break
            lag_now = self._try_read(
                path, offset, buf, frame, frame_size=frame_size, refresh=True,
                give_up=tries.final is None and tries.attempt == self.retries)
            if lag_now is None:
                return buf
            lag = lag_now
        if lag.kind == "missing":
            raise InvalidReference(
                f"pack {path} does not exist (reclaimed, or never written) after "
                f"{self.retries} retries"
            )
        raise StorageUnavailable(
            f"{path} offset {offset}: {lag.detail} after {self.retries} retries; the writer's "
            "data is not visible on this client (visibility lag) or was lost. Retry later; if "
            "it persists, check the filesystem"
        )

    def _try_read(self, path: str, offset: int, buf: memoryview, frame: bool, *,
                  give_up: bool, refresh: bool = False,
                  frame_size: int | None = None) -> Lag | None:
        """One attempt: None when ``buf`` holds the bytes, else what is missing.
        ``refresh`` (a retry): the range's cached pages are dropped first, through the
        freshly opened descriptor, since a reopen alone may keep them
        (``Filesystem.drop_cached``)."""
        size = buf.nbytes
        try:
            with self.cache.reading():
                fd = self.cache.fd(path)
                if refresh:
                    self.fs.drop_cached(fd, offset, size)
                n = self.fs.readinto(fd, buf, offset)
        except FileNotFoundError:
            return Lag("missing", "the file does not exist")
        except OSError as e:
            raise StorageUnavailable(f"reading {path}: {e}") from e
        if n < size:
            if frame_size is not None and n >= framing.HEADER_SIZE:
                _refuse_another_frame(path, offset, buf[:framing.HEADER_SIZE], frame_size)
            return Lag("short", f"the file holds {offset + n} bytes, the reference needs "
                                f"{offset + size}")
        # Only a frame start is known to be non-zero: a payload may be zeros.
        if frame and buf[:framing.HEADER_SIZE] == _ZERO_HEADER:
            return Lag("zeros", "the extent still reads as zeros")
        if frame and _partial_header(buf[:framing.HEADER_SIZE], offset) and not give_up:
            # Bytes present that stay wrong through every retry are not lag: once we give
            # up, the caller's header check reports CorruptData (D6).
            return Lag("partial", "the frame header is only partly visible")
        return None

    def fill(self, fd: int, path: str, chunk: memoryview, offset: int) -> None:
        """``chunk`` from ``offset`` of the pack through ``fd``; a short read or an error
        takes the slow path, which reopens and retries (visibility lag)."""
        try:
            complete = self.fs.readinto(fd, chunk, offset) == len(chunk)
        except OSError:
            complete = False
        if not complete:
            self.read_exact(path, offset, len(chunk), into=chunk)

    def read_blocks(self, path: str, offset: int, buf: memoryview, block: int,
                    starts: Iterable[int] | None = None) -> Iterator[tuple[int, int]]:
        """Fill ``buf`` with the ``buf.nbytes`` bytes at ``offset``, ``block`` bytes at a
        time, yielding ``(lo, hi)`` as soon as ``buf[lo:hi]`` holds its bytes, so that
        the caller verifies each block while it is still in the CPU cache (the bytes are
        unchecked: the caller holds their checksums, tensor chunks).  Unlike
        ``read_exact`` per block, the path check and descriptor lookup happen once per
        call; a short or failed read of a block goes through ``read_exact``, which
        retries visibility lag and applies the final-pack rules (D6).  ``starts``: the
        blocks to read, as offsets into ``buf`` (multiples of ``block``; default all of
        them, in order): threads sharing one ``buf`` pass one thread-safe iterator, each
        reading the blocks it takes from it."""
        check_pack_path(path, self.run_id)
        with self.cache.reading():  # the descriptors stay open across the yields
            try:
                fd: int | None = self.cache.fd(path)
            except OSError:
                fd = None  # not visible yet, say: read_exact decides
            for lo in range(0, buf.nbytes, block) if starts is None else starts:
                hi = min(lo + block, buf.nbytes)
                view = buf[lo:hi]
                complete = False
                if fd is not None:
                    try:
                        complete = self.fs.readinto(fd, view, offset + lo) == hi - lo
                    except OSError:
                        pass
                if not complete:
                    self.read_exact(path, offset + lo, hi - lo, into=view)
                    fd = None  # read_exact may have dropped the descriptor: look it up again
                    try:
                        fd = self.cache.fd(path)
                    except OSError:
                        pass
                yield lo, hi

    def finality(self, path: str) -> Final | None:
        """Whether the pack is final (asked only after a read failed): its file ends in a
        valid SEAL trailer, or the catalog knows it sealed, reclaimed, or not at all."""
        with self.cache.reading():
            try:
                fd: int | None = self.cache.fd(path)
            except OSError:  # missing, or not readable now: the catalog may tell
                fd = None
            if fd is not None:
                try:
                    entries = read_sealed_index(self.fs, fd, self.fs.fstat(fd).size)
                except (OSError, StrawError, ValueError, TypeError):
                    entries = None  # unreadable or damaged seal: not final *this* way
                if entries is not None:
                    return Final("complete", frozenset(e.offset for e in entries))
        status = self.pack_status(path) if self.pack_status is not None else None
        if status is None:
            return None
        if status.state == "tombstoned":
            final = Final("reclaimed")
        elif status.state in ("sealed", "own"):
            final = Final(status.state, status.offsets)
        elif status.state == "unknown" and fd is None:
            final = Final("unknown")
        else:
            return None
        # what we read next goes through a descriptor opened after the catalog said so
        self.cache.drop(path)
        return final

    def check_header(self, ref: SegmentRef | RecordSetRef, buf: Any) -> framing.FrameHeader:
        """The frame header at ``ref``'s offset, which must be an extent of its size and
        checksum.  One that fails its own check is ``CorruptData``, or, on a final pack
        where no publication starts at that offset, ``InvalidReference``."""
        try:
            header = framing.decode_header(buf)
        except CorruptData as e:
            final = self.finality(ref.path)
            if final is not None and final.kind in ("complete", "sealed", "own") \
                    and ref.offset not in final.offsets:
                raise InvalidReference(
                    f"{ref!r}: no publication of sealed pack {ref.path} starts at offset "
                    f"{ref.offset} (an edited or fabricated reference)") from None
            # "Invalid segment header": straw-queue's phrase for this failure, which its
            # callers match; the rest names the place and the two possible causes.
            raise CorruptData(f"Invalid segment header at {ref.path} offset {ref.offset}: "
                              f"{e} (data damaged, or the reference does not point at an "
                              "extent)") from None
        check_frame(ref, header)
        return header

    @staticmethod
    def _final_error(final: Final, path: str, offset: int, lag: Lag,
                     frame: bool) -> StrawError:
        """The error for bytes missing from a final pack (no lag: nothing to retry)."""
        where = f"{path} offset {offset}"
        if final.kind == "reclaimed":
            gone = "does not exist any more" if lag.kind == "missing" else "is being removed"
            return InvalidReference(
                f"pack {path} {gone}: it was reclaimed (tombstoned) by garbage collection, so "
                f"{where} is no longer readable. Retain (or pin) the publications you still "
                "need")
        if final.kind == "unknown":
            return InvalidReference(
                f"pack {path} does not exist and was never written (the pool's catalog does "
                "not know it); the reference is fabricated or belongs to another pool")
        if lag.kind == "missing" and final.kind == "own":
            # the writer's own pack: moved or deleted outside straw under a live writer;
            # nothing says it is gone for good (straw-queue's class too)
            return StorageUnavailable(
                f"pack {path}, which this store is writing, is missing: it was moved or "
                "deleted outside straw. Put it back (or check the filesystem), then retry")
        if lag.kind == "missing":
            return CorruptData(
                f"sealed pack {path} is missing: it was deleted outside straw (garbage "
                "collection tombstones a pack first). Restore it from a replica")
        if frame and (offset not in final.offsets
                      or (lag.kind == "short" and final.kind == "complete")):
            return InvalidReference(
                f"{where}: no publication of sealed pack {path} fits there ({lag.detail}); "
                "the reference is edited or stale: use the reference publish returned")
        if final.kind == "own":
            return CorruptData(
                f"{where}: {lag.detail}, but this store wrote pack {path} through this "
                "client (its own writes are visible to it, so this is damage, not "
                "visibility lag): it was truncated or overwritten outside straw")
        return CorruptData(
            f"{where}: {lag.detail}, but pack {path} is sealed (its size is final, so this "
            "is damage, not visibility lag); restore it from a replica")
