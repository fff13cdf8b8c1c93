"""The queue journal's files and records: names, the record format, ``Recovered``.

The journal (``straw.durable.journal``) is an append-only, framed log of opaque
transactions; ``straw.durable.recovery`` reads it back.

Files in the journal directory (all written through ``straw.fs.Filesystem``)::

    j-<epoch:06d>-<seg:06d>.log                  segment: frames of kind JOURNAL
    s-<epoch:06d>-<seg:06d>-<offset:012d>.snap   snapshot: ONE frame of kind SNAPSHOT
    s-....snap.tmp-<pid>-<random>                a snapshot being written (ignored)

Segment records (the body of each JOURNAL frame starts with a tag byte)::

    0x10 segment header  msgpack {v, epoch, seg, seq, cutoffs: [[epoch, seg, offset]...],
                         t}.  The first frame of every segment.  ``seq`` is the sequence
                         number of the last transaction before the segment; ``cutoffs``
                         are the epoch's cutoffs (below), repeated in every segment of
                         the epoch, so they survive the deletion of its first segment.
                         The header of an epoch's first segment is its *epoch-start
                         record*.
    0x01 transaction     the transaction's bytes
    0x02 batch           u32 n, n x u32 lengths, the n transactions back to back:
                         ``commit_many``, atomic (one frame: all or nothing)
    0x03 confirm         no transactions: written right after a durable write group,
                         before anyone is told (see "Torn versus corrupt")
    0x11 rotated         u64 s+1: the last record of segment s once segment s+1 is
                         durable (see "Segments rotate")

Snapshot body: u32 length M, msgpack {v, epoch, seg, offset, seq, t} (M bytes), the
state bytes.  The snapshot covers every transaction before position (epoch, seg, offset)
in journal order (below); ``seq`` is how many transactions that is.

Journal order and sequence numbers.  Positions (epoch, seg, offset) order the journal
lexicographically.  Every transaction gets a sequence number, 1, 2, 3, ... in journal
order over the whole history (snapshots carry the count, so numbers continue across
snapshots and epochs); ``commit`` returns it.  A number returned by ``commit`` is stable
forever; a number of a transaction that was never acknowledged (fenced) may be reused.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import CorruptData, UnsupportedSchema
from ..fs import Buffer
from . import framing

# 2: publication references in transactions and snapshots have nine fields
# (straw.refs.ref_to_tuple); version-1 segments (six-field references) are read as before,
# and a straw that reads only version 1 refuses these instead of misreading them.
# 3: a queue snapshot may name history segments (straw.history) that hold the completed
# history it no longer carries; a straw that reads only version 2 would open such a queue
# without its history, so it refuses these.  Versions 1 and 2 are read as before.
JOURNAL_VERSION = 3
DEFAULT_SEGMENT_TARGET = 64 << 20
DEFAULT_RESERVE = 1 << 20  # reserved ahead of the writes; at most this much zero tail to scan

REC_TXN = 0x01
REC_BATCH = 0x02
REC_CONFIRM = 0x03
REC_SEGMENT = 0x10
REC_ROTATED = 0x11
TAG_TXN = bytes([REC_TXN])
TAG_BATCH = bytes([REC_BATCH])
TAG_CONFIRM = bytes([REC_CONFIRM])
TAG_SEGMENT = bytes([REC_SEGMENT])
TAG_ROTATED = bytes([REC_ROTATED])
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
CONFIRM_LEN = framing.HEADER_SIZE + 1
ROTATED_LEN = framing.HEADER_SIZE + 1 + U64.size
TAIL_LEN = CONFIRM_LEN + ROTATED_LEN  # reserved beyond every group: its tail records fit

SEG_RE = re.compile(r"^j-(\d{6,})-(\d{6,})\.log\Z")
SNAP_RE = re.compile(r"^s-(\d{6,})-(\d{6,})-(\d{12,})\.snap\Z")
TMP_MARK = ".snap.tmp-"

Position = tuple[int, int, int]  # (epoch, segment, offset)
Cutoff = tuple[int, int]  # (last segment, end offset) of an older epoch


def segment_name(epoch: int, seg: int) -> str:
    return f"j-{epoch:06d}-{seg:06d}.log"


def snapshot_name(epoch: int, seg: int, offset: int) -> str:
    return f"s-{epoch:06d}-{seg:06d}-{offset:012d}.snap"


@dataclass
class Recovered:
    """What ``recover`` found; pass it to ``Journal`` to start the next epoch."""

    # state bytes of the newest valid snapshot: a read-only view into the file as read
    # (tens of MiB are not copied); msgpack and bytes() take it as it is
    snapshot: bytes | memoryview | None
    transactions: list[bytes]  # committed transactions after it, in order
    last_epoch: int  # highest epoch with any file (0 if none): the next must be higher
    cutoffs: dict[int, Cutoff]  # what the next epoch's start record will say
    stats: dict[str, Any] = field(default_factory=dict)
    snapshot_seq: int = 0  # transactions covered by the snapshot
    snapshot_position: Position | None = None

    @property
    def seq(self) -> int:
        """Sequence number of the last recovered transaction (``transactions[i]`` has
        ``seq - len(transactions) + 1 + i``); the next commit gets ``seq + 1``."""
        return self.snapshot_seq + len(self.transactions)


# --- record encoding ---------------------------------------------------------------------

def segment_header_body(epoch: int, seg: int, seq: int, cutoffs: dict[int, Cutoff],
                         now: float) -> bytes:
    meta = {"v": JOURNAL_VERSION, "epoch": epoch, "seg": seg, "seq": seq,
            "cutoffs": [[e, s, o] for e, (s, o) in sorted(cutoffs.items())], "t": now}
    return TAG_SEGMENT + msgpack.packb(meta, use_bin_type=True)


def rotated_body(next_seg: int) -> bytes:
    return TAG_ROTATED + U64.pack(next_seg)


def batch_body(txns: Sequence[Buffer]) -> list[Buffer]:
    lengths = [memoryview(t).nbytes for t in txns]
    head = TAG_BATCH + struct.pack(f"<I{len(lengths)}I", len(lengths), *lengths)
    return [head, *txns]


def decode_segment_header(body: bytes, where: str) -> dict[str, Any]:
    try:
        meta = msgpack.unpackb(body[1:], raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types
        raise CorruptData(f"{where}: segment header does not decode: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("v"), int):
        raise CorruptData(f"{where}: not a journal segment header")
    if meta["v"] > JOURNAL_VERSION:
        raise UnsupportedSchema(f"{where}: journal format version {meta['v']}; this straw "
                                f"reads up to {JOURNAL_VERSION}. Upgrade straw")
    try:
        meta["cutoffs"] = {int(e): (int(s), int(o)) for e, s, o in meta["cutoffs"]}
        for k in ("epoch", "seg", "seq"):
            meta[k] = int(meta[k])
    except (KeyError, TypeError, ValueError):
        raise CorruptData(f"{where}: malformed journal segment header") from None
    return meta


def decode_batch(body: bytes, where: str) -> list[bytes]:
    try:
        (n,) = U32.unpack_from(body, 1)
        lengths = struct.unpack_from(f"<{n}I", body, 5)
    except struct.error:
        raise CorruptData(f"{where}: malformed transaction batch") from None
    pos = 5 + 4 * n
    if pos + sum(lengths) != len(body):
        raise CorruptData(f"{where}: transaction batch lengths do not match its size")
    out = []
    for ln in lengths:
        out.append(body[pos:pos + ln])
        pos += ln
    return out

