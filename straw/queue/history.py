"""Queue history segments: the completed part of a queue's state, on disk, read on demand.

Why.  A long-lived queue's state is mostly history: terminal tasks, the commit log, the
submission index and the request-id answers.  If the journal snapshot carried all of it, a
coordinator opening the queue would read and decode every completed task (about 15 s at
575,000).  D9 asks that recovery follow live state, so the snapshot carries the live state
plus a small *manifest* naming immutable history segments; history is looked up in them
when a call needs it (``task_status`` of an old task, a duplicate ``submit``, a retried
request id, a commit page), never at open.

What moves.  When the coordinator snapshots its journal it hands over a *delta*: every
task that is terminal now (it never changes again: complete, fail and cancel are final),
every commit row, every submission id and every request answer recorded since the last
snapshot.  A task id, submission id or request id is in at most one place (the live state
or one segment): the coordinator refuses a second use of an id it finds in history, so
keys of different segments are disjoint, and the commit rows of the segments are
contiguous position ranges [lo, hi) starting at 0.

Files, in ``Q/history/`` (all through ``straw.fs.Filesystem``)::

    h-<epoch:06d>-<seq:012d>-<rand8>.hist     one segment, immutable once named

A segment is a sequence of frames of kind ``HISTORY`` (``straw.framing``: each one
checksummed): data blocks, then one index frame.  A block body is msgpack: a keyed block
``[keys, values]`` (keys sorted), a commit block ``[row, ...]``.  The index body is msgpack
``{v, lo, hi, tables: {t|s|r: [[first_key, offset, length], ...], c: [[first_pos, offset,
length], ...]}, blooms: {t|s|r: [bits, k]}}`` -- ``t`` tasks (task id -> [row, metadata]),
``s`` submissions (submission id -> commit position), ``r`` requests (request id ->
[digest, reply]), ``c`` commit rows.  The snapshot's manifest entry of a segment holds
its name, size, index offset and length and its counts, so open reads no segment at all:
it checks that each named segment exists with its size (one ``stat``), and the first
lookup of a segment reads its index (fence keys + Bloom filters, about 1.5 B per entry of
the index and 1.25 B per key of the filters).

Crash safety (spec H1, D9's rule applied to history).  A segment is written under a new
unique name, fsynced, and its name made durable (``fsync_dir``) BEFORE the journal
snapshot naming it is written; segments are deleted only after a newer journal snapshot
that does not name them is durable and the fence passed (``cleanup``, called after
``Journal.snapshot`` returned), and a coordinator deletes only segments of its epoch or
older (a newer epoch's segments are never another's to delete).  So a crash at any point
of writing a segment leaves the old snapshot with its old segments (the new file is an
unnamed orphan, deleted by the next cleanup) or the new snapshot with its durable
segments.  A named segment that is missing, shorter than recorded, or whose frame fails
its checksum is ``CorruptData`` naming the file: never a silent miss.

Folding.  Every snapshot adds one delta segment; segments are merged like a binary
counter (while the newest is at least as large as the one before it, the two become one),
so there are O(log n) segments, each entry is rewritten O(log n) times, and a miss costs
one Bloom probe per segment.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import xxhash

from ..checks import UINT64_MAX
from ..durable import framing
from ..errors import CorruptData, UnsupportedSchema
from ..fs import Buffer, Filesystem, NotBeneath

HISTORY_VERSION = 1
BLOCK_ENTRIES = 128  # entries per data block: one block read answers a lookup
BLOOM_BITS_PER_KEY = 10
BLOOM_K = 7  # about 1% false positives at 10 bits per key
KEYED = ("t", "s", "r")  # tasks, submissions, requests
_NAME_RE = re.compile(r"^h-(\d{6,})-(\d{12,})-[0-9a-f]{8}\.hist\Z")
MISSING: Any = object()
_CACHE_BLOCKS = 64


def segment_epoch(name: str) -> int | None:
    m = _NAME_RE.match(name)
    return int(m[1]) if m else None


# --- Bloom filters (xxh3-64 of the key, double hashing) -------------------------------

def _hashes(keys: Sequence[str]) -> np.ndarray:
    h = xxhash.xxh3_64_intdigest
    return np.fromiter((h(k.encode()) for k in keys), dtype=np.uint64, count=len(keys))


def _bloom(keys: Sequence[str]) -> bytes:
    nbytes = (max(64, len(keys) * BLOOM_BITS_PER_KEY) + 7) // 8
    nbits = nbytes * 8  # what _maybe_in derives from the length
    bits = np.zeros(nbytes, dtype=np.uint8)
    if keys:
        hv = _hashes(keys)
        h1, h2 = hv & np.uint64(0xFFFFFFFF), (hv >> np.uint64(32)) | np.uint64(1)
        for i in range(BLOOM_K):
            idx = (h1 + np.uint64(i) * h2) % np.uint64(nbits)
            np.bitwise_or.at(bits, (idx >> np.uint64(3)).astype(np.int64),
                             np.left_shift(np.uint8(1), (idx & np.uint64(7)).astype(np.uint8)))
    return bits.tobytes()


def row_usage(row: Sequence[Any]) -> tuple[int, int, int]:
    """(payload bytes, records, tokens) of a commit row's result, as the coordinator's
    usage counts them (a six-field reference of an older straw records no bytes or
    tokens)."""
    ref = row[3]
    if len(ref) >= 9:
        return ref[7] or 0, ref[5], ref[8] or 0
    return 0, ref[5], 0


def _maybe_in(bits: bytes, key: str) -> bool:
    nbits = len(bits) * 8
    h = xxhash.xxh3_64_intdigest(key.encode())
    h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
    for i in range(BLOOM_K):
        idx = ((h1 + i * h2) & 0xFFFFFFFFFFFFFFFF) % nbits
        if not bits[idx >> 3] >> (idx & 7) & 1:
            return False
    return True


# --- the delta a snapshot hands over --------------------------------------------------

@dataclass
class Delta:
    """History recorded since the last snapshot: keyed entries (unsorted) and commit rows
    from position ``lo`` on."""

    tasks: list[tuple[str, Any]] = field(default_factory=list)
    subs: list[tuple[str, Any]] = field(default_factory=list)
    reqs: list[tuple[str, Any]] = field(default_factory=list)
    commits: list[Sequence[Any]] = field(default_factory=list)
    lo: int = 0
    status: dict[str, int] = field(default_factory=dict)  # terminal tasks by status

    def size(self) -> int:
        return len(self.tasks) + len(self.subs) + len(self.reqs) + len(self.commits)


# --- one segment ----------------------------------------------------------------------

class Segment:
    """A named, immutable segment: its manifest entry in memory; its index read on the
    first lookup, its blocks when needed (a few cached)."""

    def __init__(self, fs: Filesystem, directory: str, entry: dict[str, Any]) -> None:
        self.fs, self.dir, self.entry = fs, directory, entry
        self.name: str = entry["name"]
        self.path = os.path.join(directory, self.name)
        self.lo: int = entry["lo"]
        self.hi: int = entry["hi"]
        self.counts: dict[str, int] = entry["counts"]
        self.status: dict[str, int] = entry["status"]
        self._index: dict[str, Any] | None = None
        self._firsts: dict[str, list[Any]] = {}
        self._cache: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def size(self) -> int:
        return sum(self.counts.values()) + (self.hi - self.lo)

    def check_present(self) -> None:
        """At open: the segment exists with the size its snapshot recorded (one stat)."""
        try:
            st = self.fs.stat(self.path)
        except FileNotFoundError:
            raise CorruptData(
                f"queue history segment {self.path} is missing, but the journal snapshot "
                "names it: the queue's history is lost; restore the queue directory from a "
                "backup") from None
        if st.is_symlink:
            raise CorruptData(
                f"queue history segment {self.path} is a symbolic link; a history segment is "
                "never read through one (it could be another queue's): restore the queue "
                "directory from a backup")
        size = st.size
        if size < self.entry["size"]:
            raise CorruptData(
                f"queue history segment {self.path} holds {size} bytes, its journal "
                f"snapshot recorded {self.entry['size']}: it was truncated; restore the queue "
                "directory from a backup")

    def _read_frame(self, offset: int, length: int, what: str) -> memoryview:
        if not (0 <= offset and framing.HEADER_SIZE <= length
                and offset + length <= self.entry["size"]):
            # the index names a frame the segment cannot hold: allocate nothing for it
            raise CorruptData(f"queue history segment {self.path}: {what} at offset {offset} "
                              f"({length} bytes) lies outside the {self.entry['size']} bytes "
                              "its journal snapshot recorded; restore the queue directory "
                              "from a backup")
        buf = bytearray(length)
        fd = self._open()
        try:
            n = self.fs.readinto(fd, buf, offset)
        finally:
            self.fs.close(fd)
        if n < length:
            raise CorruptData(f"queue history segment {self.path}: {what} at offset {offset} "
                              f"is cut short ({n} of {length} bytes); restore the queue "
                              "directory from a backup")
        try:
            hdr, body = framing.decode_frame(buf)
        except framing.TornFrame as e:
            raise CorruptData(f"queue history segment {self.path}: {what} at offset "
                              f"{offset}: {e}") from None
        except CorruptData as e:
            raise CorruptData(f"queue history segment {self.path}: {what} at offset "
                              f"{offset} is damaged ({e}); restore the queue directory from "
                              "a backup") from None
        if hdr.kind != framing.KIND_HISTORY or hdr.frame_length != length:
            raise CorruptData(f"queue history segment {self.path}: {what} at offset {offset} "
                              "is not the frame its index names")
        return body

    def _open(self) -> int:
        """The segment open for reading, beneath the queue directory: a symbolic link in
        place of the segment or of ``history/`` is never followed (it could name another
        queue's or another pool's file)."""
        queue_dir, history = os.path.split(os.path.abspath(self.dir))
        try:
            return self.fs.open_beneath(queue_dir, f"{history}/{self.name}")
        except FileNotFoundError:
            raise CorruptData(f"queue history segment {self.path} is missing (named by the "
                              "journal snapshot); restore the queue directory") from None
        except NotBeneath as e:
            raise CorruptData(f"queue history segment {self.path}: not a regular file of the "
                              f"queue's history directory ({e.strerror}); a history segment "
                              "is never read through a symbolic link (it could be another "
                              "queue's): restore the queue directory from a backup") from None

    def index(self) -> dict[str, Any]:
        if self._index is None:
            off, n = self.entry["index"]
            idx = msgpack.unpackb(self._read_frame(off, n, "index"), raw=False)
            if idx.get("v", 0) > HISTORY_VERSION:
                raise UnsupportedSchema(f"queue history segment {self.path} has version "
                                        f"{idx.get('v')}; upgrade straw to read it")
            if (idx["lo"], idx["hi"]) != (self.lo, self.hi):
                raise CorruptData(f"queue history segment {self.path} covers commits "
                                  f"{idx['lo']}..{idx['hi']}, its snapshot says "
                                  f"{self.lo}..{self.hi}")
            self._firsts = {t: [b[0] for b in blocks] for t, blocks in idx["tables"].items()}
            self._index = idx
        return self._index

    def _block(self, table: str, i: int) -> Any:
        key = (table, i)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        _, off, n = self.index()["tables"][table][i][:3]
        body = self._read_frame(off, n, f"block {i} of table {table!r}")
        # keyed blocks: lists (user JSON must come back with lists); commit rows: tuples,
        # as the journal snapshot decodes them
        block = msgpack.unpackb(body, raw=False, use_list=table != "c")
        self._cache[key] = block
        if len(self._cache) > _CACHE_BLOCKS:
            self._cache.popitem(last=False)
        return block

    def get(self, table: str, key: str) -> Any:
        if not self.counts.get(table):
            return MISSING  # decided without reading the index
        bits, _k = self.index()["blooms"][table]
        if not _maybe_in(bits, key):
            return MISSING
        firsts = self._firsts[table]
        i = bisect.bisect_right(firsts, key) - 1
        if i < 0:
            return MISSING
        keys, values = self._block(table, i)
        j = bisect.bisect_left(keys, key)
        return values[j] if j < len(keys) and keys[j] == key else MISSING

    def commit(self, pos: int) -> Sequence[Any]:
        self.index()
        firsts = self._firsts["c"]
        i = bisect.bisect_right(firsts, pos) - 1
        return self._block("c", i)[pos - firsts[i]]  # type: ignore[no-any-return]

    def commit_usage(self, start: int) -> list[int]:
        """[bytes, records, tokens] of this segment's commits at positions >= ``start``:
        whole blocks from the index's sums, a partial block from its rows."""
        self.index()
        firsts, blocks = self._firsts["c"], self.index()["tables"]["c"]
        out = [0, 0, 0]
        i = max(0, bisect.bisect_right(firsts, start) - 1)
        for j in range(i, len(blocks)):
            if firsts[j] >= start and len(blocks[j]) > 3:
                sums = blocks[j][3]
            else:
                rows = self._block("c", j)[max(0, start - firsts[j]):]
                sums = [sum(x) for x in zip(*map(row_usage, rows), strict=True)] or [0, 0, 0]
            for k in range(3):
                out[k] += sums[k]
        return out

    def items(self, table: str) -> Iterator[tuple[str, Any]]:
        for i in range(len(self.index()["tables"][table])):
            keys, values = self._block(table, i)
            yield from zip(keys, values, strict=True)

    def commit_rows(self) -> Iterator[Sequence[Any]]:
        for i in range(len(self.index()["tables"]["c"])):
            yield from self._block("c", i)


def write_segment(fs: Filesystem, directory: str, name: str, delta: Delta,
                  hi: int) -> dict[str, Any]:
    """Write ``delta`` (commit rows ``delta.lo``..``hi``) as segment ``name``, durably
    (file fsync, then the directory: its name must be durable before a snapshot names
    it).  Returns its manifest entry.  Raises OSError."""
    blocks: list[bytes] = []
    tables: dict[str, list[list[Any]]] = {}
    blooms: dict[str, list[Any]] = {}
    offset = 0

    def add(body: bytes, first: Any, table: str, *extra: Any) -> None:
        nonlocal offset
        frame = framing.encode_frame(framing.KIND_HISTORY, body, group_start=0)
        tables[table].append([first, offset, len(frame), *extra])
        blocks.append(frame)
        offset += len(frame)

    counts = {}
    for table, entries in (("t", delta.tasks), ("s", delta.subs), ("r", delta.reqs)):
        entries = sorted(entries, key=lambda kv: kv[0])
        keys = [k for k, _ in entries]
        if any(a == b for a, b in zip(keys, keys[1:], strict=False)):
            raise CorruptData(f"queue history: an id appears twice in table {table!r} of "
                              f"segment {name}")
        tables[table] = []
        for i in range(0, len(entries), BLOCK_ENTRIES):
            part = entries[i:i + BLOCK_ENTRIES]
            add(msgpack.packb([[k for k, _ in part], [v for _, v in part]],
                              use_bin_type=True), part[0][0], table)
        blooms[table] = [_bloom(keys), BLOOM_K]
        counts[table] = len(entries)
    tables["c"] = []
    for i in range(0, len(delta.commits), BLOCK_ENTRIES):
        rows = delta.commits[i:i + BLOCK_ENTRIES]
        # the block's usage sums: the coordinator's usage of unprocessed commits then
        # reads the index, not every row
        sums = [sum(x) for x in zip(*map(row_usage, rows), strict=True)]
        # a block whose sums pass 64 bits (results of 2**64-1 tokens each) has none in
        # the index (msgpack holds 64 bits): its usage is summed from its rows instead
        extra = [sums] if all(v <= UINT64_MAX for v in sums) else []
        add(msgpack.packb(list(rows), use_bin_type=True), delta.lo + i, "c", *extra)
    index = msgpack.packb({"v": HISTORY_VERSION, "lo": delta.lo, "hi": hi, "tables": tables,
                           "blooms": blooms}, use_bin_type=True)
    index_frame = framing.encode_frame(framing.KIND_HISTORY, index, group_start=0)
    path = os.path.join(directory, name)
    fd = fs.open(path, write=True, create=True, exclusive=True)
    try:
        buffers: list[Buffer] = [*blocks, index_frame]
        at = 0
        for i in range(0, len(buffers), 256):  # bounded iovecs per call
            at += fs.writev(fd, buffers[i:i + 256], at)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(directory)  # D1: the name is durable before any snapshot names it
    return {"name": name, "size": offset + len(index_frame),
            "index": [offset, len(index_frame)], "lo": delta.lo, "hi": hi,
            "counts": counts, "status": dict(delta.status)}


# --- the whole history ----------------------------------------------------------------

class History:
    """The segments of a queue's history, oldest first (immutable: ``extended`` returns
    a new History).  Lookups probe the newest segment first (any order is right: keys
    are disjoint)."""

    def __init__(self, fs: Filesystem, directory: str, segments: Sequence[Segment] = ()
                 ) -> None:
        self.fs, self.dir = fs, directory
        self.segments = list(segments)
        self._los = [s.lo for s in self.segments if s.hi > s.lo]
        self._by_lo = [s for s in self.segments if s.hi > s.lo]
        self.commit_count = self.segments[-1].hi if self.segments else 0
        self.counts = {t: sum(s.counts.get(t, 0) for s in self.segments) for t in KEYED}
        self.status: dict[str, int] = {}
        for s in self.segments:
            for k, v in s.status.items():
                self.status[k] = self.status.get(k, 0) + v

    @classmethod
    def from_manifest(cls, fs: Filesystem, directory: str, manifest: dict[str, Any]
                      ) -> History:
        if manifest.get("v", 0) > HISTORY_VERSION:
            raise UnsupportedSchema(f"queue history manifest version {manifest.get('v')}; "
                                    "upgrade straw to read this queue")
        segments = [Segment(fs, directory, e) for e in manifest["segments"]]
        expect = 0
        for s in segments:
            if not isinstance(s.name, str) or segment_epoch(s.name) is None:
                raise CorruptData(f"queue history: the journal snapshot names segment "
                                  f"{s.name!r} in {directory}, not a history segment's name")
            if s.lo != expect or s.hi < s.lo:
                raise CorruptData(f"queue history: segment {s.path} covers commits "
                                  f"{s.lo}..{s.hi}, expected to start at {expect}")
            expect = s.hi
            s.check_present()
        return cls(fs, directory, segments)

    def manifest(self) -> dict[str, Any]:
        return {"v": HISTORY_VERSION, "segments": [s.entry for s in self.segments]}

    def names(self) -> set[str]:
        return {s.name for s in self.segments}

    # lookups ------------------------------------------------------------------------
    def get(self, table: str, key: str) -> Any:
        if not self.counts[table]:
            return MISSING
        for s in reversed(self.segments):
            v = s.get(table, key)
            if v is not MISSING:
                return v
        return MISSING

    def commit(self, pos: int) -> Sequence[Any]:
        if not 0 <= pos < self.commit_count:
            raise IndexError(pos)
        return self._by_lo[bisect.bisect_right(self._los, pos) - 1].commit(pos)

    def commit_usage(self, start: int) -> list[int]:
        """[bytes, records, tokens] of the history's commits at positions >= ``start``."""
        out = [0, 0, 0]
        for s in self._by_lo:
            if s.hi > start:
                for k, v in enumerate(s.commit_usage(start)):
                    out[k] += v
        return out

    def items(self, table: str) -> Iterator[tuple[str, Any]]:
        for s in self.segments:
            if s.counts.get(table):
                yield from s.items(table)

    # writing ------------------------------------------------------------------------
    def extended(self, delta: Delta, epoch: int, seq: int) -> History:
        """A new History: this one plus ``delta`` as a new durable segment, folded (see
        the module docstring).  Nothing of this one changes; its files stay until
        ``cleanup`` after a snapshot that no longer names them."""
        self.fs.makedirs_durable(self.dir)
        hi = delta.lo + len(delta.commits)
        segs = [*self.segments,
                Segment(self.fs, self.dir, write_segment(self.fs, self.dir,
                                                         self._new_name(epoch, seq), delta, hi))]
        while len(segs) >= 2 and segs[-2].size() <= segs[-1].size():
            merged = _merge(segs[-2], segs[-1])
            entry = write_segment(self.fs, self.dir, self._new_name(epoch, seq), merged,
                                  segs[-1].hi)
            segs[-2:] = [Segment(self.fs, self.dir, entry)]
        return History(self.fs, self.dir, segs)

    @staticmethod
    def _new_name(epoch: int, seq: int) -> str:
        return f"h-{epoch:06d}-{seq:012d}-{os.urandom(4).hex()}.hist"

    def cleanup(self, epoch: int) -> int:
        """After a durable journal snapshot naming this History (and the fence passed):
        delete segments of epoch <= ``epoch`` it does not name (merged, or orphans of an
        interrupted snapshot).  Best effort: returns how many were deleted; a failure is
        retried by the next snapshot's cleanup."""
        try:
            names = self.fs.listdir(self.dir)
        except OSError:
            return 0
        keep = self.names()
        queue_dir, history = os.path.split(os.path.abspath(self.dir))
        deleted = 0
        for name in names:
            e = segment_epoch(name)
            if e is None or e > epoch or name in keep:
                continue
            try:  # never through a symbolic link in place of ``history/``
                self.fs.unlink_beneath(queue_dir, f"{history}/{name}")
                deleted += 1
            except FileNotFoundError:
                pass
            except OSError:
                return deleted
        if deleted:
            try:
                self.fs.fsync_dir(self.dir)
            except OSError:
                pass
        return deleted


def _merge(a: Segment, b: Segment) -> Delta:
    """The entries of two adjacent segments (``a`` older) as one delta."""
    if a.hi != b.lo:
        raise CorruptData(f"queue history: segments {a.path} and {b.path} are not adjacent "
                          f"(commits ..{a.hi} and {b.lo}..)")
    status = dict(a.status)
    for k, v in b.status.items():
        status[k] = status.get(k, 0) + v
    return Delta(tasks=[*a.items("t"), *b.items("t")], subs=[*a.items("s"), *b.items("s")],
                 reqs=[*a.items("r"), *b.items("r")],
                 commits=[*a.commit_rows(), *b.commit_rows()], lo=a.lo, status=status)


__all__ = ["Delta", "History", "MISSING", "Segment", "write_segment"]
