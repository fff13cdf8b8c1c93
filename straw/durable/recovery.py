"""Recovery of a queue journal: the newest valid snapshot plus the suffix after it (D9).

``recover`` rebuilds what the next coordinator needs: the newest valid snapshot's state
bytes plus every committed transaction after it, in order (the files and records:
``straw.durable.segments``; the writer: ``straw.durable.journal``).

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

Torn versus corrupt (D6): confirm records (``straw.durable.confirm``, the protocol shared
with the catalog) make damage to the last acknowledged group ``CorruptData``; the leader
writes one after each group's fdatasync and ``fence()``, before any waiter is told
(``close`` syncs the last confirm, so a cleanly closed journal has no unconfirmed tail).
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
symbolic link (``CorruptData``; ``straw.durable.journal_files``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import CorruptData, StrawError, UnsupportedSchema, storage_error
from ..fs import Filesystem
from . import framing
from .journal_files import Reader
from .segments import (
    CONFIRM_LEN,
    JOURNAL_VERSION,
    REC_BATCH,
    REC_CONFIRM,
    REC_ROTATED,
    REC_SEGMENT,
    REC_TXN,
    ROTATED_LEN,
    SEG_RE,
    SNAP_RE,
    TAG_CONFIRM,
    TAG_SEGMENT,
    U32,
    U64,
    Cutoff,
    Position,
    Recovered,
    decode_batch,
    decode_segment_header,
    segment_name,
    snapshot_name,
)

# --- recovery ------------------------------------------------------------------------------

class _Reader(Reader):
    """File reads for recovery (``straw.durable.journal_files``), and segment headers."""

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
        if hdr.kind != framing.KIND_JOURNAL or bytes(body[:1]) != TAG_SEGMENT:
            return None
        return decode_segment_header(bytes(body), f"{self.dir}/{name}")


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
        m = SEG_RE.match(name)
        if m:
            segs.setdefault(int(m[1]), set()).add(int(m[2]))
            continue
        m = SNAP_RE.match(name)
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
    last_epoch = _probe_newer_epochs(rd, segs, snaps)
    h, cutoffs = _head_epoch(rd, segs)
    if not h:
        _check_nothing_started(directory, snaps, started_epoch)
        stats["seconds"] = time.perf_counter() - t0
        return Recovered(None, [], last_epoch, {}, stats)
    if h < started_epoch:
        raise CorruptData(f"journal {directory}: the newest epoch with a valid segment is "
                          f"{h}, but epoch {started_epoch} started (its epoch-start record "
                          f"was durable): every segment of epoch {started_epoch} was lost "
                          f"({segment_name(started_epoch, 1)} ...)")
    s = max(segs[h])
    while rd.exists(segment_name(h, s + 1)):  # the newest segments, past a stale listing
        s += 1
        segs[h].add(s)
    epochs = _Epochs(h, cutoffs)
    snap_pos = _newest_snapshot(directory, snaps, epochs)
    state: memoryview | None = None
    seq = 0
    if snap_pos is not None:
        state, seq = _read_snapshot(rd, snap_pos)
    snapshot_seq = seq

    txns: list[bytes] = []
    next_cutoffs: dict[int, Cutoff] = {}
    first_epoch = snap_pos[0] if snap_pos is not None else min(segs)
    for e in sorted(x for x in segs if first_epoch <= x <= h):
        if epochs.ignored(e):
            continue
        seq, next_cutoffs[e] = _read_epoch(rd, e, segs[e], epochs.limit_of(e), snap_pos,
                                           seq, txns)
    stats["transactions"] = len(txns)
    stats["snapshot_position"] = snap_pos
    stats["epoch"] = h
    stats["seconds"] = time.perf_counter() - t0
    return Recovered(state, txns, last_epoch, next_cutoffs, stats, snapshot_seq, snap_pos)


def _probe_newer_epochs(rd: _Reader, segs: dict[int, set[int]],
                        snaps: list[Position]) -> int:
    """A stale listing (shared filesystems cache entries) may lack the newest epochs:
    probe the next epoch numbers (adding what exists to ``segs``); returns the highest
    epoch with any file."""
    top = max([*segs, *(p[0] for p in snaps), 0])
    while rd.exists(segment_name(top + 1, 1)):
        top += 1
        segs.setdefault(top, set()).add(1)
    return top


def _head_epoch(rd: _Reader, segs: dict[int, set[int]]) -> tuple[int, dict[int, Cutoff]]:
    """H: the highest epoch with a valid segment header, and the cutoffs it names (they
    rule older epochs); (0, {}) if no segment header is valid."""
    for e in sorted(segs, reverse=True):
        for s in sorted(segs[e]):
            meta = rd.header(segment_name(e, s))
            if meta is None:
                _check_not_corrupt(rd, segment_name(e, s))
            else:
                if meta["epoch"] != e or meta["seg"] != s:
                    raise CorruptData(f"{rd.dir}/{segment_name(e, s)}: header names epoch "
                                      f"{meta['epoch']} segment {meta['seg']}")
                return e, meta["cutoffs"]
    return 0, {}


def _check_nothing_started(directory: str, snaps: list[Position], started_epoch: int) -> None:
    """No valid segment: a journal that never started, unless something says it did."""
    if snaps:
        raise CorruptData(f"journal {directory}: snapshots {sorted(snaps)} but no valid "
                          "segment: segments were lost")
    if started_epoch:
        raise CorruptData(f"journal {directory}: no valid segment, but epoch "
                          f"{started_epoch} started (its epoch-start record was "
                          "durable): its segments were lost")


@dataclass(frozen=True)
class _Epochs:
    """Which epochs recovery reads, and how far: H to its end, an older epoch up to the
    cutoff H recorded for it."""

    head: int
    cutoffs: dict[int, Cutoff]

    def ignored(self, e: int) -> bool:
        """A ghost epoch H never saw (or one that never started, above H)."""
        return e > self.head or (e < self.head and e not in self.cutoffs)

    def limit_of(self, e: int) -> Cutoff | None:
        """(seg, offset) for an older epoch; None for H (read to the end)."""
        return None if e == self.head else self.cutoffs[e]


def _newest_snapshot(directory: str, snaps: list[Position],
                     epochs: _Epochs) -> Position | None:
    """The newest snapshot within its epoch's readable range."""
    for p in sorted(snaps, reverse=True):
        if p[0] > epochs.head:
            raise CorruptData(f"journal {directory}: snapshot of epoch {p[0]} but no valid "
                              f"segment of that epoch (newest valid: {epochs.head})")
        if epochs.ignored(p[0]):
            continue
        lim = epochs.limit_of(p[0])
        if lim is None or (p[1], p[2]) <= lim:
            return p
    return None


def _read_epoch(rd: _Reader, e: int, present: set[int], lim: Cutoff | None,
                snap_pos: Position | None, seq: int, txns: list[bytes]) -> tuple[int, Cutoff]:
    """Read epoch ``e``'s segments after the snapshot (up to its cutoff ``lim``, or to the
    end for H), appending their transactions to ``txns``.  Returns the sequence number
    reached and the cutoff the next epoch records for ``e``."""
    directory = rd.dir
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
        rd.stats["segments"] += 1
        scan = _scan_segment(data, start, upto, final, sg < last, where)
        if scan.torn:
            rd.stats["torn_tail"] = True
        seq = _apply_frames(scan.frames, start, e, sg, seq, txns, where)
        rd.stats["frames"] += len(scan.frames)
        end = (sg, scan.end)
        if final and _rotated(scan.frames):
            end = (sg, _rotated_successor_missing(rd, e, sg, scan.frames[-1], where))
    return seq, end


def _scan_segment(data: bytes, start: int, upto: int | None, final: bool, rotated: bool,
                  where: str) -> framing.ScanResult:
    """Scan a segment's frames from ``start``; a torn tail only where one is allowed
    (``final``, or a lost rotated record of a segment with a successor), and the frames
    must end at the recorded cutoff ``upto``."""
    try:
        scan = framing.scan_frames(_bytes_reader(data), len(data), start=start)
    except CorruptData as err:
        raise CorruptData(f"{where}: {err}") from None
    if scan.torn and not final and not (rotated and _lost_rotated_record(data, scan)):
        raise CorruptData(f"{where}: damaged frame at offset {scan.end} before a "
                          "recorded cutoff or in a rotated segment: synced data lost")
    if upto is not None and scan.end != upto:
        raise CorruptData(f"{where}: valid frames end at {scan.end}, a previous "
                          f"recovery read up to {upto}")
    return scan


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
    return hdr.kind == framing.KIND_JOURNAL and bytes(body) == TAG_CONFIRM


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
            batch = decode_batch(bytes(body), at)
            txns.extend(batch)
            seq += len(batch)
        elif tag == REC_CONFIRM:
            if len(body) != 1:
                raise CorruptData(f"{at}: malformed confirm record")
        elif tag == REC_ROTATED:
            if i != len(frames) - 1:
                raise CorruptData(f"{at}: records after the segment's rotated record")
            if len(body) != 1 + U64.size or U64.unpack_from(body, 1)[0] != seg + 1:
                raise CorruptData(f"{at}: rotated record does not name segment {seg + 1}")
        elif tag == REC_SEGMENT:
            if i != 0 or start != 0:
                raise CorruptData(f"{at}: segment header inside the segment")
            meta = decode_segment_header(bytes(body), at)
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
        (mlen,) = U32.unpack_from(body, 0)
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

