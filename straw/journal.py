"""The queue journal: an append-only, framed log of opaque transactions with group commit,
snapshots and epochs.  The coordinator (the single writer of one queue) builds on it.

Role.  The coordinator hands the journal opaque ``bytes`` transactions; ``commit`` returns
only once the transaction is durable.  ``recover`` rebuilds what the next coordinator
needs: the newest valid snapshot's state bytes plus every committed transaction after it,
in order.  The journal knows nothing about tasks or leases.

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

Epochs (D8, D9).  Each coordinator incarnation writes its own epoch's segments and never
writes another epoch's files, so recovery never truncates anything and a paused, fenced
old coordinator may keep appending to (even rotating) its own segments harmlessly.  The
epoch-start record of epoch E holds its *cutoffs*: for each older epoch whose records
E's recovery used, (last segment, end offset) it read up to.  Recovery:

1. lists the directory (and probes, by ``open``, the names a stale listing may lack: the
   next segments of the newest epoch and the next epoch numbers);
2. H = the highest epoch with a segment whose header frame is valid (an epoch whose start
   record never became durable never served, D9: its files are ignored, and epochs above
   H are ignored entirely).  Cutoffs come from H's header.  Older epoch E < H is read up
   to its cutoff; an older epoch without a cutoff is ignored entirely (H's recovery never
   saw it: a fenced ghost).  H itself is read to its end: its torn tail (its own crash)
   is left in place and cut at the next epoch by the cutoff ``recover`` reports;
3. the snapshot used is the newest one whose position is within its epoch's readable
   range (a fenced old coordinator's snapshot beyond its cutoff is ignored); then every
   segment after that position is read, in (epoch, seg) order, each epoch cut at its
   cutoff.  Recovery cost therefore follows the live state (snapshot + suffix).
   ``Recovered.cutoffs`` (what the next epoch records) names only the epochs read: from
   the snapshot's epoch to H, so the map stays small; older epochs are covered by the
   snapshot, and anything of an epoch without a cutoff is ignored.  H's cutoff is the
   end of its valid frames (its last confirm included).  Snapshots never delete the
   current epoch's last segment (they rotate first), so a started epoch keeps a segment
   until a newer epoch's snapshot covers it.

Before the next epoch records H's end as a cutoff, ``recover`` fsyncs H's last segment:
the dead writer may have left written-but-unsynced frames in the page cache, and a cutoff
must never point past durable data.

Torn versus corrupt (D6), per ``straw.framing``: a damaged complete frame followed by a
frame of a later write group is ``CorruptData``; otherwise it is a torn tail.  Confirm
records make the last *acknowledged* group such a frame: after a group's fdatasync and
``fence()`` returned, and before any waiter is told, the leader writes a confirm record
right after the group (not synced) whose group start is its own offset; the next group
continues that write group (its frames' group start is the confirm's offset), so the
confirm and the next group are one write group, covered by the next sync.  A flipped byte
in an acknowledged group is therefore followed by a later group's frame -- its confirm --
and is ``CorruptData``; a power loss that tears the unsynced (confirm + next group) is a
torn tail, as before; a crash after the sync but before the confirm leaves the group
intact (and unacknowledged).  Blind spot: the confirm is not synced by itself, so damage
to the last group *and* a power loss that also lost its confirm look like a torn tail (a
double fault; ``close`` syncs the last confirm, so a cleanly closed journal has none).
Only the last segment of the read-to-end epoch H may have a torn tail; anything before a
recorded cutoff, in a rotated segment, or in a snapshot (fsynced before its rename) must
be intact, else ``CorruptData`` -- except a torn rotated record right after the segment's
last confirm (a power loss during the rotation: nothing acknowledged lives there).  A
missing segment that recovery needs, a segment header that names another position, a
sequence-number mismatch, a newest segment of H that ends with a rotated record (its
successor was durable and is gone), or a newest valid epoch older than the
``started_epoch`` the caller knows of (its segments are gone) is also ``CorruptData``.
Recovery fails closed: it raises, it never cuts or deletes anything, and the message
names the file, the offset and what to do.  A newer format
version or an unknown record tag is ``UnsupportedSchema``.  Files are read until a short
read (a size cached from another client may be stale), a segment only up to its clean end
(the run of zeros after its frames: a sparse tail costs nothing), and never through a
symbolic link (``CorruptData``; ``straw.journal_files``).

Group commit.  ``commit`` (or ``enqueue`` + ``wait``) is called from many threads.
``enqueue`` appends the request to a pending list under the mutex and assigns its sequence
number (so a caller that enqueues under its own lock gets journal order = its apply order).
``wait(seq)``: if ``seq`` is not durable yet and no sync is in flight, the caller becomes
the leader: it takes everything pending, writes it with ONE ``writev`` (all frames share a
write group: same group start) and ONE ``fdatasync``, calls ``fence()``, and wakes
everybody.  A lone caller never waits for anything (no timers, no sleeps; the bounded
wait for announced siblings below needs someone else in flight).  Requests that
arrive during a sync are taken by the next leader.  A caller about to enqueue can
announce itself (``incoming()``): a leader waits for announced callers, at most
``group_wait`` seconds, so their transactions join its group (``straw.siblings``).
If the write, the sync or ``fence()``
fails, every waiter of that batch gets ``IndeterminateCommit`` (cause chained) and the
journal is unusable: later calls raise ``Fenced`` (when ``fence`` raised ``Fenced``) or
``StorageUnavailable``, and so do waiters of requests that were still pending (those were
never written).  A sync is never retried.  A new write group starts only after the
previous group's sync returned (the writer side of D6).  Space is reserved ahead
(``Filesystem.reserve``) so that a commit usually does not change the file size; reserved
zeros are the clean end for the scanner and are trimmed when the segment rotates or the
journal closes.

Segments rotate when a group would take a segment past ``segment_target_bytes``: the old
segment's last confirm is synced; the new segment is created exclusively, its header and
the group are written as one group, synced, and its name made durable with ``fsync_dir``;
then a rotated record naming the new segment ends the old one, synced, before the commit
returns (three syncs per rotation instead of one: rotations are rare).  So a segment that
ends with a rotated record had a durable successor, and a missing newest segment is
detected; a crash before the rotated record is durable leaves at most a torn rotated
record after the old segment's last confirm.

Snapshots.  ``snapshot(state)`` requires that ``state`` reflect exactly the transactions
enqueued so far and that nobody enqueues until it returns (the coordinator calls it under
the lock it enqueues under).  It makes everything enqueued durable (leading a group if
needed), then: writes the snapshot durably (temp file, fsync, rename to its unique final
name, ``fsync_dir``); rotates to a new segment (durable, as above); calls ``fence()``
-- if fenced it stops and deletes nothing (a fenced coordinator must not delete what the
new epoch still needs); finally deletes every segment entirely before the snapshot
position (all older epochs' and its own up to the snapshot's segment), older snapshots
and stale temp files (``ENOENT`` is success), then ``fsync_dir``.  Old segments are thus
removed only after the snapshot is durable.  A failed deletion is counted in
``metrics()['cleanup_errors']`` and retried by the next snapshot; it does not fail the
snapshot.

What the coordinator must guarantee (see also ``Journal``):

* one writer per epoch, epochs increasing: ``Journal(epoch=E)`` needs E >
  ``recovered.last_epoch``, and segment names are created exclusively, so two
  incarnations can never write the same epoch;
* the fence: a takeover makes its new epoch durable where ``fence()`` looks (the queue's
  lock/epoch file) BEFORE calling ``recover``; then a fenced coordinator's snapshot either
  is seen and used by the takeover's recovery or is ignored, and its deletions never
  remove segments the new epoch needs.

Fork safety (``straw.process``): a ``Journal`` belongs to the process that opened it.  In
a forked child every method raises ``ForkedProcess`` before taking the mutex (another
thread may have held it at the fork), and ``close()`` only closes the child's copy of the
segment descriptor: it never leads a group, writes or trims the parent's segment.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .clock import Clock, SystemClock
from .durable import framing
from .errors import (
    CorruptData,
    Fenced,
    IndeterminateCommit,
    StorageUnavailable,
    StrawError,
    UnsupportedSchema,
)
from .fs import Buffer, Filesystem
from .journal_files import Reader
from .pack import storage_error
from .process import OPEN_QUEUE_IN_CHILD, ProcessBound, close_quietly
from .siblings import DEFAULT_GROUP_WAIT, Siblings

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
_TAG_TXN = bytes([REC_TXN])
_TAG_BATCH = bytes([REC_BATCH])
_TAG_CONFIRM = bytes([REC_CONFIRM])
_TAG_SEGMENT = bytes([REC_SEGMENT])
_TAG_ROTATED = bytes([REC_ROTATED])
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
CONFIRM_LEN = framing.HEADER_SIZE + 1
ROTATED_LEN = framing.HEADER_SIZE + 1 + _U64.size
_TAIL_LEN = CONFIRM_LEN + ROTATED_LEN  # reserved beyond every group: its tail records fit

_SEG_RE = re.compile(r"^j-(\d{6,})-(\d{6,})\.log\Z")
_SNAP_RE = re.compile(r"^s-(\d{6,})-(\d{6,})-(\d{12,})\.snap\Z")
_TMP_MARK = ".snap.tmp-"

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

def _segment_header_body(epoch: int, seg: int, seq: int, cutoffs: dict[int, Cutoff],
                         now: float) -> bytes:
    meta = {"v": JOURNAL_VERSION, "epoch": epoch, "seg": seg, "seq": seq,
            "cutoffs": [[e, s, o] for e, (s, o) in sorted(cutoffs.items())], "t": now}
    return _TAG_SEGMENT + msgpack.packb(meta, use_bin_type=True)


def _rotated_body(next_seg: int) -> bytes:
    return _TAG_ROTATED + _U64.pack(next_seg)


def _batch_body(txns: Sequence[Buffer]) -> list[Buffer]:
    lengths = [memoryview(t).nbytes for t in txns]
    head = _TAG_BATCH + struct.pack(f"<I{len(lengths)}I", len(lengths), *lengths)
    return [head, *txns]


def _decode_segment_header(body: bytes, where: str) -> dict[str, Any]:
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


def _decode_batch(body: bytes, where: str) -> list[bytes]:
    try:
        (n,) = _U32.unpack_from(body, 1)
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


# --- recovery ------------------------------------------------------------------------------

class _Reader(Reader):
    """File reads for recovery (``straw.journal_files``), and segment headers."""

    def header(self, name: str) -> dict[str, Any] | None:
        """The segment's header record if its first frame is valid, else None."""
        data = self.read(name, 1 << 16)
        if data is None:
            return None
        try:
            hdr, body = framing.decode_frame(data)
        except (framing.TornFrame, CorruptData):
            if len(data) >= 1 << 16:  # a larger header than we read: read it all
                data = self.read(name) or b""
                try:
                    hdr, body = framing.decode_frame(data)
                except (framing.TornFrame, CorruptData):
                    return None
            else:
                return None
        if hdr.kind != framing.KIND_JOURNAL or bytes(body[:1]) != _TAG_SEGMENT:
            return None
        return _decode_segment_header(bytes(body), f"{self.dir}/{name}")


def _list(fs: Filesystem, directory: str) -> tuple[dict[int, set[int]], list[Position]] | None:
    try:
        names = fs.listdir(directory)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise storage_error(e, f"cannot list journal directory {directory}") from e
    segs: dict[int, set[int]] = {}
    snaps: list[Position] = []
    for name in names:
        m = _SEG_RE.match(name)
        if m:
            segs.setdefault(int(m[1]), set()).add(int(m[2]))
            continue
        m = _SNAP_RE.match(name)
        if m:
            snaps.append((int(m[1]), int(m[2]), int(m[3])))
    return segs, snaps


_FAIL_CLOSED = (
    "Recovery changed nothing (no byte was cut, no file deleted) and will not start the "
    "queue on it: restore the journal directory from a backup, or keep a copy of it and "
    "report the damage"
)


def recover(fs: Filesystem, directory: str, *, started_epoch: int = 0) -> Recovered:
    """Read the journal in ``directory`` (see the module docstring): the newest valid
    snapshot, the committed transactions after it, and the cutoffs for the next epoch.
    ``started_epoch``: the newest epoch known (outside the journal) to have made its
    epoch-start record durable; a journal whose newest valid epoch is older lost it.

    Raises ``CorruptData`` for damaged or missing durable data (fail closed: nothing is
    cut or deleted), ``UnsupportedSchema`` for a newer format, ``StorageUnavailable`` for
    I/O errors.  Writes nothing, but fsyncs the last segment of the newest epoch (see the
    module docstring)."""
    try:
        return _recover(fs, directory, started_epoch)
    except CorruptData as e:
        raise CorruptData(f"{e}. {_FAIL_CLOSED}") from None


def _recover(fs: Filesystem, directory: str, started_epoch: int) -> Recovered:
    t0 = time.perf_counter()
    stats: dict[str, Any] = {"files_read": 0, "bytes_read": 0, "segments": 0, "frames": 0,
                             "fsyncs": 0, "snapshot_bytes": 0, "torn_tail": False}
    listed = _list(fs, directory)
    if listed is None:
        stats["seconds"] = time.perf_counter() - t0
        return Recovered(None, [], 0, {}, stats)
    segs, snaps = listed
    rd = _Reader(fs, directory, stats)

    # A stale listing (shared filesystems cache entries) may lack the newest epochs.
    top = max([*segs, *(p[0] for p in snaps), 0])
    while rd.exists(segment_name(top + 1, 1)):
        top += 1
        segs.setdefault(top, set()).add(1)
    last_epoch = top

    # H: the highest epoch with a valid segment header; its cutoffs rule older epochs.
    head_epoch = 0
    cutoffs: dict[int, Cutoff] = {}
    for e in sorted(segs, reverse=True):
        for s in sorted(segs[e]):
            meta = rd.header(segment_name(e, s))
            if meta is None:
                _check_not_corrupt(rd, segment_name(e, s))
            else:
                if meta["epoch"] != e or meta["seg"] != s:
                    raise CorruptData(f"{directory}/{segment_name(e, s)}: header names epoch "
                                      f"{meta['epoch']} segment {meta['seg']}")
                head_epoch, cutoffs = e, meta["cutoffs"]
                break
        if head_epoch:
            break
    if not head_epoch:
        if snaps:
            raise CorruptData(f"journal {directory}: snapshots {sorted(snaps)} but no valid "
                              "segment: segments were lost")
        if started_epoch:
            raise CorruptData(f"journal {directory}: no valid segment, but epoch "
                              f"{started_epoch} started (its epoch-start record was "
                              "durable): its segments were lost")
        stats["seconds"] = time.perf_counter() - t0
        return Recovered(None, [], last_epoch, {}, stats)
    h = head_epoch
    if h < started_epoch:
        raise CorruptData(f"journal {directory}: the newest epoch with a valid segment is "
                          f"{h}, but epoch {started_epoch} started (its epoch-start record "
                          f"was durable): every segment of epoch {started_epoch} was lost "
                          f"({segment_name(started_epoch, 1)} ...)")
    s = max(segs[h])
    while rd.exists(segment_name(h, s + 1)):  # the newest segments, past a stale listing
        s += 1
        segs[h].add(s)

    def ignored(e: int) -> bool:
        """A ghost epoch H never saw (or one that never started, above H)."""
        return e > h or (e < h and e not in cutoffs)

    def limit_of(e: int) -> Cutoff | None:
        """(seg, offset) for an older epoch; None for H (read to the end)."""
        return None if e == h else cutoffs[e]

    # the newest snapshot within its epoch's readable range
    snap_pos: Position | None = None
    for p in sorted(snaps, reverse=True):
        if p[0] > h:
            raise CorruptData(f"journal {directory}: snapshot of epoch {p[0]} but no valid "
                              f"segment of that epoch (newest valid: {h})")
        if ignored(p[0]):
            continue
        lim = limit_of(p[0])
        if lim is None or (p[1], p[2]) <= lim:
            snap_pos = p
            break
    state: memoryview | None = None
    seq = 0
    if snap_pos is not None:
        state, seq = _read_snapshot(rd, snap_pos)
    snapshot_seq = seq

    txns: list[bytes] = []
    next_cutoffs: dict[int, Cutoff] = {}
    first_epoch = snap_pos[0] if snap_pos is not None else min(segs)
    for e in sorted(x for x in segs if first_epoch <= x <= h):
        if ignored(e):
            continue
        lim = limit_of(e)
        present = segs[e]
        first = snap_pos[1] if snap_pos is not None and e == snap_pos[0] else 1
        last = lim[0] if isinstance(lim, tuple) else max(present)
        if last < first:
            raise CorruptData(f"journal {directory}: epoch {e} ends at segment {last}, before "
                              f"the snapshot's segment {first}")
        end: Cutoff = (first, 0)
        for sg in range(first, last + 1):
            start = snap_pos[2] if snap_pos is not None and (e, sg) == snap_pos[:2] else 0
            upto = lim[1] if isinstance(lim, tuple) and sg == lim[0] else None
            final = lim is None and sg == last  # the one place a torn tail is allowed
            name = segment_name(e, sg)
            where = f"{directory}/{name}"
            if upto is not None and upto <= start:
                end = (sg, start)
                continue
            data = rd.read(name, upto, sync=final) if sg in present else None
            if data is None:
                if start > 0:  # the snapshot's own segment, deleted after the snapshot
                    end = (sg, start)
                    continue
                raise CorruptData(f"{where}: segment missing (recovery needs it: it is "
                                  "after the newest valid snapshot)")
            if len(data) < start or (upto is not None and len(data) < upto):
                raise CorruptData(f"{where}: {len(data)} bytes, shorter than a recorded "
                                  f"position ({max(start, upto or 0)})")
            stats["segments"] += 1
            try:
                scan = framing.scan_frames(_bytes_reader(data), len(data), start=start)
            except CorruptData as err:
                raise CorruptData(f"{where}: {err}") from None
            if scan.torn and not final and not (sg < last and _lost_rotated_record(data, scan)):
                raise CorruptData(f"{where}: damaged frame at offset {scan.end} before a "
                                  "recorded cutoff or in a rotated segment: synced data lost")
            if upto is not None and scan.end != upto:
                raise CorruptData(f"{where}: valid frames end at {scan.end}, a previous "
                                  f"recovery read up to {upto}")
            if scan.torn:
                stats["torn_tail"] = True
            seq = _apply_frames(scan.frames, start, e, sg, seq, txns, where)
            stats["frames"] += len(scan.frames)
            end = (sg, scan.end)
            if final and _rotated(scan.frames):
                end = (sg, _rotated_successor_missing(rd, e, sg, scan.frames[-1], where))
        next_cutoffs[e] = end
    stats["transactions"] = len(txns)
    stats["snapshot_position"] = snap_pos
    stats["epoch"] = h
    stats["seconds"] = time.perf_counter() - t0
    return Recovered(state, txns, last_epoch, next_cutoffs, stats, snapshot_seq, snap_pos)


def _tag(frame: framing.ScannedFrame) -> int:
    return frame.body[0] if len(frame.body) else -1


def _rotated(frames: list[framing.ScannedFrame]) -> bool:
    return bool(frames) and _tag(frames[-1]) == REC_ROTATED


def _lost_rotated_record(data: bytes, scan: framing.ScanResult) -> bool:
    """A segment followed by another one may end with a torn *rotated* record: the
    rotation made its last confirm durable and the next segment durable, then crashed
    before the rotated record's sync.  That record is the only thing written after a
    confirm there: torn right after a confirm, at most a rotated record's length, then
    zeros (reserved) or the end.  Nothing acknowledged lives in it."""
    return _confirm_ends_at(data, scan.end) and framing.is_zero(data[scan.end + ROTATED_LEN:])


def _confirm_ends_at(data: bytes, end: int) -> bool:
    """A valid confirm record ends at ``end`` (also when a scan started at ``end``, a
    snapshot's position: always right after a confirm)."""
    if end < CONFIRM_LEN:
        return False
    try:
        hdr, body = framing.decode_frame(data[end - CONFIRM_LEN:end])
    except (framing.TornFrame, StrawError):
        return False
    return hdr.kind == framing.KIND_JOURNAL and bytes(body) == _TAG_CONFIRM


def _rotated_successor_missing(rd: _Reader, epoch: int, seg: int,
                               frame: framing.ScannedFrame, where: str) -> int:
    """The newest segment of the newest epoch ends with a rotated record: its successor
    was durable before that record was written, so it is missing -> ``CorruptData``.
    Unless it appeared meanwhile (a fenced old coordinator rotating while we read: it
    never acknowledges again): then the rotated record lies beyond what we read, and the
    cutoff ends before it.  Returns that cutoff offset."""
    if rd.exists(segment_name(epoch, seg + 1)):
        return frame.offset
    raise CorruptData(f"{where} ends with a rotated record (offset {frame.offset}): segment "
                      f"{segment_name(epoch, seg + 1)} existed durably after it and is "
                      "missing, with every commit in it")


def _check_not_corrupt(rd: _Reader, name: str) -> None:
    """A segment without a valid header frame: an epoch that never started (its start
    record torn), unless the damaged header is followed by a later write group."""
    data = rd.read(name)
    if data:
        try:
            framing.scan_frames(_bytes_reader(data), len(data))
        except CorruptData as e:
            raise CorruptData(f"{rd.dir}/{name}: {e}") from None


def _bytes_reader(data: bytes) -> framing.ReadAt:
    def read_at(offset: int, length: int) -> bytes:
        return data[offset:offset + length]

    return read_at


def _apply_frames(frames: list[framing.ScannedFrame], start: int, epoch: int, seg: int,
                  seq: int, txns: list[bytes], where: str) -> int:
    for i, f in enumerate(frames):
        at = f"{where} offset {f.offset}"
        if f.header.kind != framing.KIND_JOURNAL:
            raise CorruptData(f"{at}: frame of kind {f.header.kind}, not a journal record")
        body = f.body
        tag = body[0] if len(body) else -1
        if tag == REC_TXN:
            txns.append(bytes(body[1:]))
            seq += 1
        elif tag == REC_BATCH:
            batch = _decode_batch(bytes(body), at)
            txns.extend(batch)
            seq += len(batch)
        elif tag == REC_CONFIRM:
            if len(body) != 1:
                raise CorruptData(f"{at}: malformed confirm record")
        elif tag == REC_ROTATED:
            if i != len(frames) - 1:
                raise CorruptData(f"{at}: records after the segment's rotated record")
            if len(body) != 1 + _U64.size or _U64.unpack_from(body, 1)[0] != seg + 1:
                raise CorruptData(f"{at}: rotated record does not name segment {seg + 1}")
        elif tag == REC_SEGMENT:
            if i != 0 or start != 0:
                raise CorruptData(f"{at}: segment header inside the segment")
            meta = _decode_segment_header(bytes(body), at)
            if meta["epoch"] != epoch or meta["seg"] != seg:
                raise CorruptData(f"{at}: header names epoch {meta['epoch']} segment "
                                  f"{meta['seg']}, the file name epoch {epoch} segment {seg}")
            if meta["seq"] != seq:
                raise CorruptData(f"{at}: segment starts after transaction {meta['seq']}, "
                                  f"but {seq} transactions precede it")
        else:
            raise UnsupportedSchema(f"{at}: journal record tag {tag}; upgrade straw")
        if i == 0 and start == 0 and tag != REC_SEGMENT:
            raise CorruptData(f"{at}: segment does not start with its header")
    return seq


def _read_snapshot(rd: _Reader, pos: Position) -> tuple[memoryview, int]:
    name = snapshot_name(*pos)
    where = f"{rd.dir}/{name}"
    data = rd.read_one_frame(name)
    if data is None:
        raise CorruptData(f"{where}: snapshot listed but missing")
    rd.stats["snapshot_bytes"] = len(data)
    try:
        hdr, body = framing.decode_frame(data)
    except framing.TornFrame as e:
        # renamed into place only after its fsync: incomplete means lost synced data
        raise CorruptData(f"{where}: incomplete snapshot ({e})") from None
    except CorruptData as e:
        raise CorruptData(f"{where}: {e}") from None
    if hdr.kind != framing.KIND_SNAPSHOT or hdr.frame_length != len(data):
        raise CorruptData(f"{where}: not a journal snapshot")
    try:
        (mlen,) = _U32.unpack_from(body, 0)
        meta = msgpack.unpackb(body[4:4 + mlen], raw=False)
    except Exception as e:  # struct.error or one of msgpack's errors
        raise CorruptData(f"{where}: snapshot metadata does not decode: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("v"), int):
        raise CorruptData(f"{where}: snapshot without metadata")
    if meta["v"] > JOURNAL_VERSION:
        raise UnsupportedSchema(f"{where}: snapshot format version {meta['v']}; upgrade straw")
    if (meta.get("epoch"), meta.get("seg"), meta.get("offset")) != pos:
        raise CorruptData(f"{where}: snapshot metadata names another position")
    return body[4 + mlen:], int(meta["seq"])  # a view: tens of MiB are not copied


# --- the writer ---------------------------------------------------------------------------

class _Request:
    __slots__ = ("body", "ntx")

    def __init__(self, body: list[Buffer], ntx: int) -> None:
        self.body = body
        self.ntx = ntx


class Journal(ProcessBound):
    """The writer of one epoch of a queue journal.  Thread-safe.

    ``Journal(fs, directory, epoch=E, recovered=recover(fs, directory), clock=...,
    segment_target_bytes=..., reserve_bytes=..., fence=..., group_wait=...)`` starts
    epoch E (> ``recovered.last_epoch``): it creates the epoch's first segment exclusively and
    durably writes the epoch-start record (cutoffs ``recovered.cutoffs``) before returning
    (D9: the new epoch is durable before service), then calls ``fence()``.

    Two ways to commit: ``commit(txn)`` (enqueue and wait), or ``enqueue(txn)`` under the
    caller's own lock (so that journal order is the caller's apply order) followed by
    ``wait(seq)`` outside it.  Sequence numbers are assigned at enqueue, in journal order.

    ``fence`` (optional) is called after every durable group and before a snapshot deletes
    anything; it must raise ``Fenced`` when this coordinator's epoch is no longer current.
    It runs outside the journal's mutex, in the leading thread.
    """

    _process_state = "its open segment and pending group commits"
    _process_remedy = OPEN_QUEUE_IN_CHILD

    def __init__(self, fs: Filesystem, directory: str, *, epoch: int, recovered: Recovered,
                 clock: Clock | None = None, segment_target_bytes: int = DEFAULT_SEGMENT_TARGET,
                 reserve_bytes: int = DEFAULT_RESERVE,
                 fence: Callable[[], None] | None = None,
                 group_wait: float = DEFAULT_GROUP_WAIT) -> None:
        self._bind_process()
        if epoch <= recovered.last_epoch:
            raise Fenced(f"journal {directory}: cannot start epoch {epoch}, epoch "
                         f"{recovered.last_epoch} already exists there; a newer coordinator "
                         "took over, or the epoch was not bumped. Recover again")
        if segment_target_bytes <= 0:
            raise ValueError(f"segment_target_bytes must be positive, not "
                             f"{segment_target_bytes}")
        self.fs = fs
        self.dir = directory
        self.epoch = epoch
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.segment_target_bytes = segment_target_bytes
        self.reserve_bytes = max(0, reserve_bytes)
        self.fence = fence
        self.cutoffs = dict(recovered.cutoffs)
        self._next_seq = recovered.seq  # last sequence number handed out by enqueue
        self._durable = recovered.seq  # last sequence number known durable (and unfenced)
        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)
        self._siblings = Siblings(self._mu, group_wait)  # announced, not enqueued yet
        self._pending: list[_Request] = []
        self._busy = False  # a leader (or a snapshot) is doing I/O outside the mutex
        self._broken: tuple[type[StrawError], str] | None = None
        self._failed: tuple[int, int, BaseException] | None = None  # the batch that failed
        self._closed = False
        self._fd: int | None = None
        self._seg = 0
        self._end = 0  # end of the valid data in the current segment (its confirm included)
        self._data_start = 0  # end of the current segment's header and its confirm
        self._group = 0  # group start for the next frames: the offset of the last confirm
        self._reserved = 0
        self._m = {"commits": 0, "frames": 0, "groups": 0, "fsyncs": 0, "dir_fsyncs": 0,
                   "bytes": 0, "max_group": 0, "rotations": 0, "snapshots": 0,
                   "snapshot_bytes": 0, "deleted_files": 0, "cleanup_errors": 0}
        self.last_cleanup_error: str | None = None
        try:
            fs.makedirs_durable(directory)
            self._new_segment(1, [], self._durable)
        except FileExistsError:
            raise Fenced(f"journal {directory}: epoch {epoch} was already started by "
                         "another coordinator") from None
        except OSError as e:
            raise storage_error(e, f"cannot start journal epoch {epoch} in {directory}") from e
        try:
            if fence is not None:
                fence()
            self._confirm()  # the epoch-start record is durable: confirm it
        except BaseException as e:
            self._abandon_fd()
            if isinstance(e, OSError):
                raise storage_error(e, f"cannot start journal epoch {epoch} in "
                                    f"{directory}") from e
            raise

    # --- public ------------------------------------------------------------------------
    @property
    def position(self) -> Position:
        """(epoch, segment, offset) just after the last record written: the last durable
        group's confirm record (which the next sync, or ``close``, makes durable)."""
        self._check_process()
        with self._mu:
            return (self.epoch, self._seg, self._end)

    @property
    def path(self) -> pathlib.Path:
        """The segment this journal appends to now (straw-queue's ``journal.path`` names
        its one journal file; ours is a directory of segments, and this is the newest)."""
        self._check_process()
        with self._mu:
            return pathlib.Path(self.dir, segment_name(self.epoch, self._seg))

    @property
    def seq(self) -> int:
        """Sequence number of the last durable (acknowledgeable) transaction."""
        self._check_process()
        with self._mu:
            return self._durable

    @property
    def sequence(self) -> int:
        """straw-queue's name for ``seq``: callers compare it around a request to see that
        it journaled one transaction (or, when retried, none)."""
        self._check_process()
        return self.seq

    def metrics(self) -> dict[str, Any]:
        self._check_process()
        with self._mu:
            out: dict[str, Any] = dict(self._m)
            out["sibling_waits"] = self._siblings.waits
            out["position"] = (self.epoch, self._seg, self._end)
            out["seq"] = self._durable
            out["pending"] = len(self._pending)
            return out

    def commit(self, txn: Buffer) -> int:
        """Append one transaction; returns its sequence number once it is durable (and
        ``fence()`` passed).  ``IndeterminateCommit`` if its group's write, sync or fence
        failed (it may or may not be durable; the journal is then unusable);
        ``Fenced``/``StorageUnavailable`` if it was never written (the journal was or
        became unusable first)."""
        self._check_process()
        return self.wait(self.enqueue(txn))

    def commit_many(self, txns: Sequence[Buffer]) -> int:
        """Append several transactions atomically (one frame: after a crash, all or none
        of them are recovered); returns the sequence number of the last one."""
        self._check_process()
        return self.wait(self.enqueue_many(txns))

    def enqueue(self, txn: Buffer) -> int:
        """Queue one transaction for the next group and return its sequence number at
        once (nothing is durable yet: ``wait`` for it before acknowledging)."""
        self._check_process()
        return self._enqueue(_Request([_TAG_TXN, txn], 1))

    def enqueue_many(self, txns: Sequence[Buffer]) -> int:
        """``enqueue`` for an atomic batch (one frame); returns the last sequence number."""
        self._check_process()
        if not txns:
            raise ValueError("enqueue_many needs at least one transaction")
        return self._enqueue(_Request(_batch_body(txns), len(txns)))

    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Announce a transaction about to be enqueued inside this block: a leader
        syncing meanwhile waits (at most ``group_wait``) for it to join its group."""
        self._check_process()
        with self._mu:
            self._siblings.announce()
        try:
            yield
        finally:
            with self._mu:
                self._siblings.arrive()

    def wait(self, seq: int) -> int:
        """Return ``seq`` once every transaction up to it is durable.  If no sync is in
        flight, the caller leads the next group (writes everything pending); otherwise it
        waits for the group in flight and then, if still needed, leads.  Raises as
        ``commit``."""
        self._check_process()
        with self._cond:
            self._drive(seq)
        return seq

    def snapshot(self, state: Buffer) -> None:
        """Write a snapshot of ``state`` (see the module docstring).  ``state`` must
        reflect exactly the transactions enqueued before this call, and no other thread
        may enqueue until it returns (call it under the lock you enqueue under).  It first
        makes every enqueued transaction durable.  ``StorageUnavailable`` if the snapshot
        could not be written (the journal stays usable) or the rotation failed (the
        journal is unusable); ``Fenced`` if ``fence()`` raised (nothing deleted, the
        journal unusable); errors of the flush as ``wait``."""
        self._check_process()
        with self._cond:
            self._check_usable()
            while True:
                self._drive(self._next_seq, gather=False)  # nobody may enqueue now
                if not self._busy:
                    break
                self._cond.wait()  # another snapshot in flight
            self._busy = True
            pos = (self.epoch, self._seg, self._end)
            seq = self._durable
        try:
            self._snapshot(state, pos, seq)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def close(self) -> None:
        """Make what was enqueued durable (best effort: waiters see any error), trim the
        reserved tail and close.  Later calls raise ``StorageUnavailable``.  Idempotent.
        In a forked child: only closes the child's copy of the segment descriptor, taking
        no lock (the pending transactions and the segment are the parent's)."""
        if self._in_forked_child():
            self._drop_inherited()
            self._closed = True
            return
        with self._cond:
            while self._busy:
                self._cond.wait()
            if self._closed:
                return
            if self._pending and self._broken is None:
                self._lead(gather=False)
            self._closed = True
            self._cond.notify_all()
        self._abandon_fd(trim=True)

    def __enter__(self) -> Journal:
        self._check_process()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _process_subject(self) -> str:
        return f"journal {self.dir} (epoch {self.epoch})"

    def _drop_inherited(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        close_quietly(self.fs, fd)

    # --- group commit --------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._broken is not None:
            cls, msg = self._broken
            raise cls(msg)
        if self._closed:
            raise StorageUnavailable(f"journal {self.dir} epoch {self.epoch} is closed")

    def _enqueue(self, req: _Request) -> int:
        with self._mu:
            self._check_usable()
            self._pending.append(req)
            self._next_seq += req.ntx
            return self._next_seq

    def _drive(self, seq: int, gather: bool = True) -> None:
        """With the mutex held: return once ``seq`` is durable, leading groups as needed
        (``gather``: see ``_lead``)."""
        while True:
            if seq <= self._durable:
                return
            if self._failed is not None and self._failed[0] <= seq <= self._failed[1]:
                lo, hi, cause = self._failed
                raise IndeterminateCommit(
                    f"journal {self.dir} epoch {self.epoch}: transactions {lo}..{hi} may or "
                    f"may not be durable ({type(cause).__name__}: {cause}); the journal is "
                    "unusable: recover, then look the request up before retrying"
                ) from cause
            self._check_usable()  # broken or closed: this one was never written
            if seq > self._next_seq:
                raise ValueError(f"sequence number {seq} was never enqueued in journal "
                                 f"{self.dir} (last: {self._next_seq})")
            if self._busy:
                self._cond.wait()
                continue
            self._lead(gather)

    def _lead(self, gather: bool = True) -> None:
        """With the mutex held, not busy, something pending: write it as one group.
        ``gather``: first wait for announced siblings (not when the caller holds a lock
        they need — a snapshot, a close — where waiting could only waste the bound)."""
        self._busy = True
        if gather:
            try:
                self._siblings.gather()
            except BaseException:  # e.g. KeyboardInterrupt: never leave _busy stuck
                self._busy = False
                self._cond.notify_all()
                raise
        batch = self._pending
        self._pending = []
        lo = self._durable + 1
        hi = self._durable + sum(r.ntx for r in batch)
        self._cond.release()
        failure: BaseException | None = None
        try:
            self._write_group(batch)
        except BaseException as e:  # noqa: B036 - a SimulatedCrash too: never strand waiters
            failure = e
        finally:
            self._cond.acquire()
        if failure is None:
            self._durable = hi
            self._m["commits"] += hi - lo + 1
            self._m["frames"] += len(batch)
            self._m["groups"] += 1
            self._m["max_group"] = max(self._m["max_group"], len(batch))
        else:
            self._failed = (lo, hi, failure)
            self._mark_broken(failure)
        self._busy = False
        self._cond.notify_all()
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # the process is dying (SimulatedCrash, KeyboardInterrupt)

    def _mark_broken(self, failure: BaseException) -> None:
        if self._broken is not None:
            return
        if isinstance(failure, Fenced):
            self._broken = (Fenced, f"journal {self.dir} epoch {self.epoch} was fenced "
                            f"({failure}); this coordinator must stop")
        else:
            self._broken = (StorageUnavailable,
                            f"journal {self.dir} epoch {self.epoch} is unusable after "
                            f"{type(failure).__name__}: {failure}; recover the queue (a new "
                            "epoch) to continue")

    def _write_group(self, batch: list[_Request]) -> None:
        """Outside the mutex, as the only writer: one writev + one fdatasync, then fence,
        then the group's confirm record (before any waiter is told)."""
        lengths = [sum(memoryview(b).nbytes for b in r.body) for r in batch]
        total = sum(framing.HEADER_SIZE + n for n in lengths)
        try:
            if self._end > self._data_start and self._end + total > self.segment_target_bytes:
                self._rotate(batch)
            else:
                start = self._end
                buffers: list[Buffer] = []
                for r in batch:
                    # one write group with the confirm before it (D6): same group start
                    buffers.append(framing.encode_header(framing.KIND_JOURNAL, r.body,
                                                         group_start=self._group))
                    buffers.extend(r.body)
                assert self._fd is not None
                self._reserve(start + total + _TAIL_LEN)
                self.fs.writev(self._fd, buffers, start)
                # the commit is acknowledged only after this sync; never retried
                self.fs.fdatasync(self._fd)
                self._m["fsyncs"] += 1
                self._end = start + total
            self._m["bytes"] += total
        except OSError as e:
            raise storage_error(e, f"journal {self.dir} write failed") from e
        if self.fence is not None:
            self.fence()
        try:
            self._confirm()
        except OSError as e:
            raise storage_error(e, f"journal {self.dir}: confirm record not written") from e

    def _confirm(self) -> None:
        """D6: after a group's sync and fence returned, and before any waiter is told, a
        confirm record right after it, NOT synced: it begins a new write group, which the
        next group continues (their frames carry the confirm's offset as group start) and
        the next sync covers.  Damage to the acknowledged group is then followed by a
        frame of a later write group (the confirm): ``CorruptData``, never a torn tail.
        A crash between the sync and the confirm leaves the group intact, unacknowledged."""
        assert self._fd is not None
        at = self._end
        self.fs.writev(self._fd, [framing.encode_frame(framing.KIND_JOURNAL, _TAG_CONFIRM,
                                                       group_start=at)], at)
        self._group = at
        self._end = at + CONFIRM_LEN

    def _rotate(self, batch: list[_Request]) -> None:
        """The group goes into a new segment, after its header, as one write group.  The
        old segment is finished so that a missing newest segment is detected: (1) its
        last confirm is synced (a segment that is not the last must be intact); (2) the
        new segment is made durable; (3) a *rotated* record naming it ends the old
        segment, synced.  A rotated segment whose successor is missing has lost it
        (``CorruptData`` at recovery); a crash before (3) is durable leaves the old
        segment intact, its rotated record absent or torn (recovery tells: see
        ``_lost_rotated_record``).  Raises OSError."""
        old, old_end, old_group = self._fd, self._end, self._group
        assert old is not None
        self.fs.fdatasync(old)
        self._m["fsyncs"] += 1
        try:
            self._new_segment(self._seg + 1, batch, self._durable)
        except BaseException:
            self._fd = old  # closed when the broken journal is closed
            raise
        self._end_segment(old, old_end, old_group)
        self._m["rotations"] += 1

    def _end_segment(self, fd: int, end: int, group: int) -> None:
        """Write the rotated record (naming the current segment, its durable successor)
        at ``end`` of the segment open as ``fd`` (it continues that segment's last write
        group), sync it, trim and close.  Raises OSError (``fd`` closed anyway)."""
        try:
            self.fs.writev(fd, [framing.encode_frame(
                framing.KIND_JOURNAL, _rotated_body(self._seg), group_start=group)], end)
            self.fs.fdatasync(fd)
        except BaseException:
            try:
                self.fs.close(fd)
            except OSError:
                pass
            raise
        self._m["fsyncs"] += 1
        self._close_fd(fd, end + ROTATED_LEN)

    def _new_segment(self, seg: int, batch: list[_Request], seq: int) -> None:
        """Create segment ``seg`` exclusively: header + ``batch`` as one group at offset 0,
        one fdatasync, name durable (fsync_dir).  Its confirm is the caller's (after the
        fence).  Raises OSError."""
        path = os.path.join(self.dir, segment_name(self.epoch, seg))
        head = framing.encode_frame(
            framing.KIND_JOURNAL,
            _segment_header_body(self.epoch, seg, seq, self.cutoffs, self.clock.now()),
            group_start=0)
        buffers: list[Buffer] = [head]
        for r in batch:
            buffers.append(framing.encode_header(framing.KIND_JOURNAL, r.body, group_start=0))
            buffers.extend(r.body)
        total = sum(memoryview(b).nbytes for b in buffers)
        fd = self.fs.open(path, write=True, create=True, exclusive=True)
        try:
            self._fd, self._seg, self._reserved = fd, seg, 0
            self._end = self._data_start = self._group = 0
            self._reserve(total + _TAIL_LEN)
            self.fs.writev(fd, buffers, 0)
            self.fs.fdatasync(fd)
            self._m["fsyncs"] += 1
            self.fs.fsync_dir(self.dir)  # D1: the new name is durable before any ack
            self._m["dir_fsyncs"] += 1
        except BaseException:
            self._fd = None
            try:
                self.fs.close(fd)
            except OSError:
                pass
            raise
        self._end = total
        # the segment holds transactions once it is past its header and that confirm
        self._data_start = len(head) + CONFIRM_LEN

    def _reserve(self, needed_end: int) -> None:
        if needed_end <= self._reserved or self.reserve_bytes <= 0 or self._fd is None:
            return
        step = self.reserve_bytes
        new_end = -(-max(needed_end, self._reserved + step) // step) * step
        if self.fs.reserve(self._fd, self._reserved, new_end - self._reserved):
            self._reserved = new_end
        else:
            self.reserve_bytes = 0  # not supported here: plain appends from now on

    def _close_fd(self, fd: int, end: int, sync: bool = False) -> None:
        """Close a segment we no longer write, trimming its reserved zeros (best effort:
        zeros that survive a crash are a clean end anyway); ``sync``: then make its last
        confirm durable too (a cleanly closed journal has no unconfirmed tail)."""
        try:
            if self.fs.fstat(fd).size > end:
                self.fs.truncate(fd, end)
            if sync:
                self.fs.fdatasync(fd)
                self._m["fsyncs"] += 1
        except OSError:
            pass
        try:
            self.fs.close(fd)
        except OSError:
            pass

    def _abandon_fd(self, trim: bool = False) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if trim and self._broken is None:
                self._close_fd(fd, self._end, sync=True)
            else:
                try:
                    self.fs.close(fd)
                except OSError:
                    pass

    # --- snapshots -------------------------------------------------------------------------
    def _snapshot(self, state: Buffer, pos: Position, seq: int) -> None:
        """As the only writer (``_busy``), outside the mutex."""
        final = os.path.join(self.dir, snapshot_name(*pos))
        tmp = f"{final}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        meta = msgpack.packb({"v": JOURNAL_VERSION, "epoch": pos[0], "seg": pos[1],
                              "offset": pos[2], "seq": seq, "t": self.clock.now()},
                             use_bin_type=True)
        body: list[Buffer] = [_U32.pack(len(meta)), meta, state]
        head = framing.encode_header(framing.KIND_SNAPSHOT, body, group_start=0)
        size = len(head) + sum(memoryview(b).nbytes for b in body)
        try:
            fd = self.fs.open(tmp, write=True, create=True, exclusive=True)
            try:
                self.fs.writev(fd, [head, *body], 0)
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
            self.fs.rename(tmp, final)
            self.fs.fsync_dir(self.dir)
        except OSError as e:
            # nothing of the journal changed: it stays usable
            self._unlink_quietly(tmp)
            raise storage_error(e, f"journal {self.dir}: snapshot {final} not written") from e
        self._m["fsyncs"] += 1
        self._m["dir_fsyncs"] += 1
        self._m["snapshots"] += 1
        self._m["snapshot_bytes"] = size
        # a new segment: the snapshot's segment receives nothing more
        try:
            self._rotate([])
        except BaseException as e:
            with self._mu:
                self._mark_broken(e)
            if isinstance(e, OSError):
                raise storage_error(e, f"journal {self.dir}: rotation after a snapshot "
                                    "failed") from e
            raise
        try:
            if self.fence is not None:
                self.fence()
            self._confirm()
        except BaseException as e:
            with self._mu:
                self._mark_broken(e)
            if isinstance(e, OSError):
                raise storage_error(e, f"journal {self.dir}: confirm after a snapshot "
                                    "failed") from e
            raise  # fenced: delete nothing
        self._delete_before(pos)

    def _delete_before(self, pos: Position) -> None:
        """Delete what the durable snapshot at ``pos`` makes unnecessary."""
        try:
            names = self.fs.listdir(self.dir)
        except OSError as e:
            self._cleanup_error(f"listdir: {e}")
            return
        doomed = []
        for name in names:
            m = _SEG_RE.match(name)
            if m and (int(m[1]), int(m[2])) <= pos[:2]:
                doomed.append(name)
                continue
            m = _SNAP_RE.match(name)
            if m and (int(m[1]), int(m[2]), int(m[3])) < pos:
                doomed.append(name)
                continue
            if _TMP_MARK in name:
                doomed.append(name)  # an interrupted (or fenced) snapshot's temp file
        deleted = 0
        for name in doomed:
            path = os.path.join(self.dir, name)
            try:
                self.fs.unlink(path)
                deleted += 1
            except FileNotFoundError:
                pass  # somebody (a previous attempt) deleted it already: success
            except OSError as e:
                self._cleanup_error(f"unlink {path}: {e}")
        if deleted:
            try:
                self.fs.fsync_dir(self.dir)
                self._m["dir_fsyncs"] += 1
            except OSError as e:
                self._cleanup_error(f"fsync_dir: {e}")
        self._m["deleted_files"] += deleted

    def _cleanup_error(self, what: str) -> None:
        self._m["cleanup_errors"] += 1
        self.last_cleanup_error = what

    def _unlink_quietly(self, path: str) -> None:
        try:
            self.fs.unlink(path)
        except OSError:
            pass


__all__ = [
    "DEFAULT_RESERVE",
    "DEFAULT_SEGMENT_TARGET",
    "JOURNAL_VERSION",
    "Journal",
    "Position",
    "Recovered",
    "recover",
    "segment_name",
    "snapshot_name",
]
