"""Framing: every durable byte straw writes is inside a self-checking frame.

Byte layout of one frame (all integers little-endian)::

    offset  size  field
    0       4     magic  b"STRW"
    4       2     format version (FORMAT_VERSION = 1)
    6       2     kind   (PACK_HEADER=1, EXTENT=2, SEAL=3, LOG=4, CATALOG=5,
                         JOURNAL=6, SNAPSHOT=7)
    8       8     body length in bytes
    16      8     group start: file offset of the first frame of the durable write group
                  this frame belongs to (frames written together and covered by ONE sync
                  share it; a frame written alone has its own offset)
    24      16    xxh3-128 of the body
    40      16    xxh3-128 of bytes 0..40 of this header
    56      n     body

Telling a torn tail from corruption (D6).  ``decode_frame`` on one buffer is exact:
fewer bytes than the header claims -> ``TornFrame``; all bytes present but a checksum
fails -> ``CorruptData``.  A *file* of frames is harder: a power loss may keep any subset
of the sectors of the last, unsynced write group, including a garbage sector, so a
complete-looking final frame can fail its checksum without any corruption of
acknowledged data.  ``scan_frames`` therefore decides by write groups: writers start a
new group only after the previous group's sync returned, so

* a bad position X followed (anywhere later) by a valid frame of a *later* group
  (group start > X) means X was synced and then damaged -> ``CorruptData``;
* otherwise X lies in the final, unsynced group -> a torn tail that recovery cuts off.

Reserved space (``posix_fallocate``) reads as zeros; an all-zero header is the clean end
of the written data.  Reads through a reference never use the tail rule: a reference
names offset, size and checksum, so any mismatch there is ``CorruptData`` (or, when the
bytes are missing or still zero, visibility lag; see ``straw.pack``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from ..errors import CorruptData, UnsupportedSchema

MAGIC = b"STRW"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sHHQQ16s16s")
HEADER_SIZE = HEADER.size  # 56
_HASHED = 40  # bytes of the header covered by the header checksum

KIND_PACK_HEADER = 1
KIND_EXTENT = 2
KIND_SEAL = 3
KIND_LOG = 4  # one entry of a small append-only log (acknowledgement logs)
KIND_CATALOG = 5  # one transaction of the ownership catalog
KIND_JOURNAL = 6  # one record of a queue journal segment (straw.journal)
KIND_SNAPSHOT = 7  # the single frame of a queue journal snapshot (straw.journal)
KIND_HISTORY = 8  # a block or the index of a queue history segment (straw.history)
KNOWN_KINDS = frozenset({KIND_PACK_HEADER, KIND_EXTENT, KIND_SEAL, KIND_LOG, KIND_CATALOG,
                         KIND_JOURNAL, KIND_SNAPSHOT, KIND_HISTORY})


class TornFrame(Exception):
    """The buffer ends before the frame does (an incomplete write, or a short read)."""


class DamagedFrame(CorruptData):
    """``scan_frames``: the frame at ``offset`` is damaged and a valid frame of a later
    write group follows (synced data was corrupted, D6).  ``later`` lists every valid frame
    after ``offset`` (of any group), for tools that keep the damaged bytes aside and
    repair around them (``straw.catalog``); ``resume`` is the offset of the first later
    frame that starts its own write group (None if there is none): a caller that keeps
    what it can trust (a writer recovering its packs, ``straw.recovery``) may resume
    there."""

    def __init__(self, message: str, offset: int, later: list[ScannedFrame]) -> None:
        super().__init__(message)
        self.offset = offset
        self.later = later
        self.resume = next((g.offset for g in later if g.header.group_start == g.offset),
                           None)


@dataclass(frozen=True)
class FrameHeader:
    kind: int
    body_length: int
    group_start: int
    body_hash: bytes

    @property
    def frame_length(self) -> int:
        return HEADER_SIZE + self.body_length


def hash_buffers(buffers: Sequence[Any]) -> bytes:
    """xxh3-128 over several buffers back to back, without concatenating them."""
    if len(buffers) == 1:
        return xxhash.xxh3_128_digest(buffers[0])
    h = xxhash.xxh3_128()
    for b in buffers:
        h.update(b)
    return h.digest()


def encode_header(kind: int, body: Sequence[Any], *, group_start: int) -> bytes:
    """The 56-byte header for a body given as a list of buffers (zero-copy: the body is
    hashed in place and written after the header with ``writev``)."""
    length = sum(memoryview(b).nbytes for b in body)
    first = struct.pack("<4sHHQQ16s", MAGIC, FORMAT_VERSION, kind, length, group_start,
                        hash_buffers(body))
    return first + xxhash.xxh3_128_digest(first)


def encode_frame(kind: int, body: bytes, *, group_start: int) -> bytes:
    """A whole frame as one ``bytes`` (for small frames: pack headers, seals, catalog)."""
    return encode_header(kind, [body], group_start=group_start) + body


def is_zero(buf: Any) -> bool:
    mv = memoryview(buf).cast("B")
    return mv.nbytes == 0 or (mv[0] == 0 and mv.tobytes().count(0) == mv.nbytes)


def decode_header(buf: Any) -> FrameHeader:
    """Parse and check a header.  ``TornFrame`` if shorter than a header; ``CorruptData``
    if the magic or the header checksum is wrong; ``UnsupportedSchema`` for a valid header
    of an unknown version or kind."""
    mv = memoryview(buf).cast("B")
    if mv.nbytes < HEADER_SIZE:
        raise TornFrame(f"{mv.nbytes} bytes, a frame header needs {HEADER_SIZE}")
    magic, version, kind, length, group_start, body_hash, header_hash = HEADER.unpack_from(mv)
    if magic != MAGIC or xxhash.xxh3_128_digest(mv[:_HASHED]) != header_hash:
        raise CorruptData("frame header checksum mismatch (not a straw frame, or damaged)")
    if version != FORMAT_VERSION:
        raise UnsupportedSchema(
            f"frame format version {version}; this straw reads version {FORMAT_VERSION}. "
            "Upgrade straw to read this pool."
        )
    if kind not in KNOWN_KINDS:
        raise UnsupportedSchema(f"frame kind {kind} is unknown to this straw; upgrade straw")
    return FrameHeader(kind, length, group_start, body_hash)


def decode_frame(buf: Any) -> tuple[FrameHeader, memoryview]:
    """Check one frame at the start of ``buf``; returns its header and a view of its body."""
    mv = memoryview(buf).cast("B")
    header = decode_header(mv)
    end = header.frame_length
    if mv.nbytes < end:
        raise TornFrame(f"frame needs {end} bytes, only {mv.nbytes} present")
    body = mv[HEADER_SIZE:end]
    if xxhash.xxh3_128_digest(body) != header.body_hash:
        raise CorruptData("frame body checksum mismatch")
    return header, body


# --- scanning a file of frames --------------------------------------------------------

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> bytes (short at end of file)


def read_at_fn(fs: Any, fd: int) -> ReadAt:
    """A ``ReadAt`` over an open handle of a ``straw.fs.Filesystem``."""

    def read_at(offset: int, length: int) -> bytes:
        buf = bytearray(length)
        n = fs.readinto(fd, buf, offset)
        return bytes(buf[:n])

    return read_at


@dataclass
class ScannedFrame:
    offset: int
    header: FrameHeader
    body: bytes


@dataclass
class ScanResult:
    frames: list[ScannedFrame]
    end: int  # offset just after the last valid frame before any damage
    torn: bool  # True if an unsynced, damaged final write group was cut off
    sealed: bool  # a SEAL frame ended the scan


def _within(read_at: ReadAt, size: int) -> ReadAt:
    """``read_at`` that never reads past ``size``: a header claiming a body longer than
    the file can hold (a forged length) is then a short frame, and no buffer is allocated
    for the length it claims."""

    def read(offset: int, length: int) -> bytes:
        return read_at(offset, max(0, min(length, size - offset)))

    return read


def _try_frame(read_at: ReadAt, pos: int) -> ScannedFrame | None:
    head = read_at(pos, HEADER_SIZE)
    try:
        header = decode_header(head)
    except (TornFrame, CorruptData):
        return None
    if header.group_start > pos:
        return None
    body = read_at(pos + HEADER_SIZE, header.body_length)
    if len(body) < header.body_length or xxhash.xxh3_128_digest(body) != header.body_hash:
        return None
    return ScannedFrame(pos, header, body)


_SEARCH_CHUNK = 1 << 22


def _later_valid_frames(read_at: ReadAt, start: int, size: int) -> list[ScannedFrame]:
    """Every valid frame that begins after ``start`` (found by searching for the magic)."""
    found: list[ScannedFrame] = []
    read_at = _within(read_at, size + len(MAGIC) - 1)  # a chunk reads past size a little
    pos = start + 1
    while pos < size:
        chunk = read_at(pos, min(_SEARCH_CHUNK, size - pos) + len(MAGIC) - 1)
        if not chunk:
            break
        i = chunk.find(MAGIC)
        if i < 0:
            pos += max(1, len(chunk) - len(MAGIC) + 1)
            continue
        frame = _try_frame(read_at, pos + i)
        if frame is not None:
            found.append(frame)
            pos = frame.offset + frame.header.frame_length
        else:
            pos += i + 1
    return found


def scan_frames(read_at: ReadAt, size: int, *, start: int = 0) -> ScanResult:
    """Walk the frames of a file of ``size`` bytes from ``start``.

    Stops at a SEAL frame, at the clean end (EOF or reserved zeros), or at the first bad
    position; a bad position is a torn tail or ``CorruptData`` by the write-group rule of
    the module docstring.  Nothing past ``size`` is read: a header whose length runs past
    it is a bad position, whatever length it claims."""
    frames: list[ScannedFrame] = []
    read_at = _within(read_at, size)
    pos = start
    while pos < size:
        frame = _try_frame(read_at, pos)
        if frame is not None:
            frames.append(frame)
            pos += frame.header.frame_length
            if frame.header.kind == KIND_SEAL:
                return ScanResult(frames, pos, torn=False, sealed=True)
            continue
        head = read_at(pos, HEADER_SIZE)
        later = _later_valid_frames(read_at, pos, size)
        if is_zero(head) and not later:
            return ScanResult(frames, pos, torn=False, sealed=False)
        for f in later:
            if f.header.group_start > pos:
                raise DamagedFrame(
                    f"damaged frame at offset {pos} is followed by a valid frame of a later "
                    f"write group at offset {f.offset}: synced data was corrupted", pos, later
                )
        return ScanResult(frames, pos, torn=True, sealed=False)
    return ScanResult(frames, pos, torn=False, sealed=False)
