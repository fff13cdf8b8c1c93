"""Checked byte ranges of one record, for ``ReadSession.read_range`` and
``ReadSession.read_tensor_range`` (the store's calls of the same names go through its
read session): one implementation of both.

A range is checked against chunk checksums: every chunk it touches is read and hashed
whole, in bounded pieces (a small range of a huge chunk allocates no more than a piece),
so bytes outside the range but inside a touched chunk are verified too (D6).  The
checksums are the caller's (``read_range``: SHA-256 hex, straw-queue's, or xxh3-128 hex,
ours, told by their length) or, for a tensor record, the ones its authenticated manifest
entry carries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import xxhash

from ..checks import check_count
from ..errors import CorruptData, InvalidRange, NotATensorRecord
from ..pool.records import RecordInfo
from ..pool.refs import RecordRef
from ..tensors import format as tensor_format


class RecordSource(Protocol):
    """What a range read needs of a read session (``straw.read.ReadSession``): where a
    record's payload lies, checked, and its bytes, read exactly."""

    def payload_location(self, record_ref: RecordRef) -> tuple[RecordInfo, str, int]: ...

    def _read_exact(self, path: str, offset: int, size: int, into: Any = None,
                    frame: bool = False, frame_size: int | None = None) -> memoryview: ...

PIECE = 1 << 20  # a chunk is read and hashed this much at a time


def checked_span(length: int, start: int, stop: int, chunk_bytes: int) -> int:
    """Bytes ``read_range`` reads and checks for [start, stop): every chunk it touches,
    whole (what a trace reports as ``checked_bytes``)."""
    if stop <= start:
        return 0
    return min(length, -(-stop // chunk_bytes) * chunk_bytes) - start // chunk_bytes * chunk_bytes


def read_range(session: RecordSource, record_ref: RecordRef, start: int, stop: int, *,
               chunk_bytes: int, checksums: Sequence[str]) -> bytearray:
    """Bytes [start, stop) of a record: ``checksums[k]`` is the hex hash of payload bytes
    [k*chunk_bytes, (k+1)*chunk_bytes); a mismatch is ``CorruptData`` ("chunk
    checksum")."""
    check_count("chunk_bytes", chunk_bytes, minimum=1)
    info, path, base = session.payload_location(record_ref)
    check_count("start", start)
    check_count("stop", stop)
    if not start <= stop <= info.length:
        raise InvalidRange(f"range [{start}, {stop}) outside record {info.record_id!r} of "
                           f"{info.length} bytes; pass 0 <= start <= stop <= "
                           f"{info.length}")
    if isinstance(checksums, (str, bytes)) or not isinstance(checksums, Sequence):
        raise TypeError("checksums must be a list of hex digests, one per chunk")
    chunks = -(-info.length // chunk_bytes)
    if len(checksums) != chunks:
        raise InvalidRange(f"record {info.record_id!r} of {info.length} bytes has {chunks} "
                           f"chunks of {chunk_bytes} bytes; {len(checksums)} checksums "
                           "given: pass one per chunk")
    out = bytearray(stop - start)
    if stop == start:
        return out
    piece = memoryview(bytearray(min(chunk_bytes, PIECE)))
    for k in range(start // chunk_bytes, (stop - 1) // chunk_bytes + 1):
        want = checksums[k]
        hasher = _chunk_hasher(want, k)
        c0, c1 = k * chunk_bytes, min((k + 1) * chunk_bytes, info.length)
        pos = c0
        while pos < c1:
            n = min(piece.nbytes, c1 - pos)
            view = piece[:n]
            session._read_exact(path, base + pos, n, into=view)
            hasher.update(view)
            a, b = max(start, pos), min(stop, pos + n)
            if a < b:
                out[a - start:b - start] = view[a - pos:b - pos]
            pos += n
        if hasher.hexdigest() != want.lower():
            raise CorruptData(
                f"record {info.record_id!r} at {path} offset {base}: chunk {k} (bytes "
                f"{c0}..{c1}) fails its chunk checksum; the stored data is damaged or the "
                "checksums are not this record's")
    return out


def tensor_chunks(info: RecordInfo, expected: Mapping[str, Any] | None
                  ) -> tuple[int, list[str]]:
    """``(chunk_bytes, checksums)`` of a ``tensor.v1`` record's checked manifest entry,
    after ``expected`` (``{"dtype", "shape", "length"}``, any subset) matched it (else
    ``CorruptData``, before any payload is read)."""
    where = f"record {info.record_id!r}"
    if info.codec != tensor_format.CODEC:
        raise NotATensorRecord(f"{where} has codec {info.codec!r}, not "
                               f"{tensor_format.CODEC}; read it with read_record or "
                               "read_range")
    dtype, shape, _, chunk_bytes, chunks = tensor_format._check_meta(
        info.metadata, info.length, where)
    tensor_format.check_expected(dtype, shape, info.length, expected, where)
    h = tensor_format._HEX
    return chunk_bytes, [chunks[i:i + h] for i in range(0, len(chunks), h)]


def _chunk_hasher(want: object, k: int) -> Any:
    """The hash of a caller's chunk checksum, told by its length: SHA-256 (64 hex digits,
    straw-queue's) or xxh3-128 (32, straw's)."""
    if not isinstance(want, str):
        raise TypeError(f"checksums[{k}] must be a hex str, got {type(want).__name__}")
    if len(want) == 64:
        return hashlib.sha256()
    if len(want) == 32:
        return xxhash.xxh3_128()
    raise ValueError(f"checksums[{k}] {want[:80]!r} is neither a SHA-256 (64 hex digits) nor "
                     "an xxh3-128 (32 hex digits) digest")


__all__ = ["read_range", "tensor_chunks", "PIECE"]
