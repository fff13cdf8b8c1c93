"""Packs: append-only files of extents, one writer each, sealed when done.

A pack is a sequence of frames (``straw.framing``)::

    PACK_HEADER  (run, writer, incarnation, pack number)
    EXTENT ...   one per publication; several extents written by one ``publish_many``
                 share a write group and one data sync
    SEAL         index of the pack's extents, then a 16-byte trailer
                 (u64 offset of the SEAL frame, b"STRWSEAL") so the index is found
                 without scanning

Extent body (the publication)::

    0      4   manifest length M (u32 LE)
    4      16  xxh3-128 of the manifest
    20     M   manifest (msgpack): submission id, batch position, logical digest,
               dependencies, and per record: id, codec, JSON metadata, tokens, length,
               xxh3-128 of the payload
    20+M       payloads back to back

Manifest version 2 (this straw; version 1 stays readable) adds ``pb``/``tok`` (the
publication's payload bytes and tokens, dependencies included transitively), ``api``
(which call published it: ``publish``, ``records`` or ``record_set``, for
``publication_receipt``), ``mems`` (the records of a ``record_set`` publication, which
live in other extents: location, ordinal and a copy of their manifest entry) and two more
fields per dependency (its manifest ordinal, payload bytes and tokens).  The SEAL index
entries grow by the same four fields (version-1 entries decode with ``ordinal = records``,
no counts, api ``publish``).

``read`` verifies the body checksum (which the reference names); ``read_record`` verifies
the manifest checksum and that record's own checksum, reading nothing else.
``decode_manifest`` also checks the manifest's shape (field types, counts, 16-byte
hashes): a manifest that passes its checksum but was crafted or written by a broken
writer is ``CorruptData`` naming the field, never a KeyError inside a reader.

Space is reserved ahead (``Filesystem.reserve``: ``fallocate`` keeping the file size) so
that a publication is one ``writev`` into allocated blocks plus one ``fdatasync``, and a
full disk is met by the reservation, before anything is written.  The file size is always
what was written, and a byte once in the file never changes (append-only, as straw-queue's
segment files): callers that size a pool by its ``*.pack`` files (straw-queue's suffix)
see their data, not the reservation, and vime's tests check both.  The price: a write
extends the size, so its ``fdatasync`` also commits the size (a journal commit on ext4)
even for a publication inside a block already written; growing the size a block at a
time would avoid that, but exposes zeros that later writes change.  ``seal``
truncates the pack to its end, which also frees the unused reservation.  Packs of an
older straw grew the file instead: their reserved tail reads as zeros, which the scanner
treats as the clean end.  On a nearly full disk the reservation shrinks (halving) down to
what the write group needs; a reservation that fails even then raises ``QuotaExceeded``
and leaves the pack intact and open (nothing was written).

Upholds D1 (a pack's name is durable through a directory fsync before any reference into
it exists; a reference is returned only after the data sync of its write group) and the
writer side of D6 (a new group starts only after the previous group's sync returned; after
a failed write or sync the pack is abandoned, never written again).
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from ..checks import short_repr
from ..durable import framing
from ..errors import CorruptData, StorageUnavailable, UnsupportedSchema, storage_error
from ..fs import Filesystem
from .refs import PACK_SUFFIXES

EXTENT_PREFIX = struct.Struct("<I16s")
TRAILER = struct.Struct("<Q8s")
TRAILER_MAGIC = b"STRWSEAL"
MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, 2)
APIS = ("publish", "records", "record_set")
PACK_SUFFIX = PACK_SUFFIXES[0]  # what new packs are named (refs.PACK_SUFFIXES)


@dataclass(frozen=True)
class ExtentEntry:
    """What a pack's SEAL index (and the idempotency index) knows of one extent."""

    submission_id: str
    index: int  # position in its publish_many batch
    count: int  # size of that batch
    offset: int
    size: int
    checksum: bytes
    digest: bytes
    records: int
    ordinal: int  # records stored in the extent itself (its manifest's ordinal)
    payload_bytes: int  # 0 for extents of manifest version 1 (not recorded)
    tokens: int
    api: str  # the call that published it (APIS)

    def packed(self) -> list[Any]:
        return [self.submission_id, self.index, self.count, self.offset, self.size,
                self.checksum, self.digest, self.records, self.ordinal, self.payload_bytes,
                self.tokens, self.api]

    @classmethod
    def unpacked(cls, e: Sequence[Any]) -> ExtentEntry:
        if len(e) == 8:  # version 1
            return cls(*e, e[7], 0, 0, "publish")  # type: ignore[call-arg]
        return cls(*e)


@dataclass
class EncodedExtent:
    """A publication laid out for writing: header + body buffers (payloads not copied)."""

    buffers: list[Any]
    entry: ExtentEntry
    record_offsets: list[int]  # absolute payload offsets in the pack
    manifest: dict[str, Any]


def encode_extent(
    *,
    run_id: str,
    submission_id: str,
    index: int,
    count: int,
    digest: bytes,
    records: Sequence[tuple[str, str, str, int | None, memoryview, bytes]],
    dependencies: Sequence[list[Any]],
    offset: int,
    group_start: int,
    payload_bytes: int,
    tokens: int,
    api: str = "publish",
    members: Sequence[list[Any]] = (),
) -> EncodedExtent:
    """Lay out one extent at ``offset``.  ``records`` are (id, codec, metadata JSON,
    tokens, payload view, payload xxh3-128); ``members`` the rows of a ``record_set``
    publication's records (``_check_member``)."""
    manifest = {
        "v": MANIFEST_VERSION,
        "run": run_id,
        "sub": submission_id,
        "idx": index,
        "n": count,
        "digest": digest,
        "deps": list(dependencies),
        "recs": [[rid, codec, meta, tokens, len(p), h]
                 for rid, codec, meta, tokens, p, h in records],
        "pb": payload_bytes,
        "tok": tokens,
        "api": api,
        "mems": list(members),
    }
    mbytes = msgpack.packb(manifest, use_bin_type=True)
    prefix = EXTENT_PREFIX.pack(len(mbytes), xxhash.xxh3_128_digest(mbytes))
    body: list[Any] = [prefix, mbytes] + [r[4] for r in records if len(r[4])]
    header = framing.encode_header(framing.KIND_EXTENT, body, group_start=group_start)
    size = framing.HEADER_SIZE + sum(memoryview(b).nbytes for b in body)
    pos = offset + framing.HEADER_SIZE + EXTENT_PREFIX.size + len(mbytes)
    record_offsets = []
    for r in records:
        record_offsets.append(pos)
        pos += len(r[4])
    entry = ExtentEntry(submission_id, index, count, offset, size, header[24:40], digest,
                        len(members) if members else len(records), len(records),
                        payload_bytes, tokens, api)
    return EncodedExtent([header, *body], entry, record_offsets, manifest)


def decode_manifest(body_prefix: Any, where: str) -> tuple[dict[str, Any], int]:
    """Parse and check the manifest at the start of an extent body (which must hold at
    least prefix + manifest).  Returns the manifest and the offset of the payloads within
    the body."""
    mv = memoryview(body_prefix).cast("B")
    if mv.nbytes < EXTENT_PREFIX.size:
        raise CorruptData(f"{where}: extent body shorter than its prefix")
    mlen, mhash = EXTENT_PREFIX.unpack_from(mv)
    end = EXTENT_PREFIX.size + mlen
    if mv.nbytes < end:
        raise CorruptData(f"{where}: extent body shorter than its manifest ({mlen} bytes)")
    mbytes = mv[EXTENT_PREFIX.size:end]
    if xxhash.xxh3_128_digest(mbytes) != mhash:
        raise CorruptData(f"{where}: manifest checksum mismatch")
    try:
        manifest = msgpack.unpackb(mbytes, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for malformed input
        raise CorruptData(f"{where}: manifest does not decode: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("v") not in READABLE_VERSIONS:
        version = manifest.get("v") if isinstance(manifest, dict) else None
        raise UnsupportedSchema(
            f"{where}: manifest version {version!r}; this straw reads up to "
            f"{MANIFEST_VERSION}"
        )
    _check_manifest_shape(manifest, where)
    return manifest, end


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0  # msgpack ints fit in 64 bits; bools are not counts


def _is_hash(v: object) -> bool:
    return type(v) is bytes and len(v) == 16


def _check_manifest_shape(m: dict[str, Any], where: str) -> None:
    """The shape every reader of a manifest relies on.  The manifest passed its checksum,
    so a wrong shape was crafted or written by a broken writer: ``CorruptData`` naming
    the field, not a KeyError or ValueError deep inside a reader."""
    if type(m.get("run")) is not str or type(m.get("sub")) is not str:
        raise CorruptData(f"{where}: manifest lacks its run or submission id")
    if not (_is_count(m.get("idx")) and _is_count(m.get("n")) and _is_hash(m.get("digest"))):
        raise CorruptData(f"{where}: manifest batch position or digest is malformed")
    deps, recs = m.get("deps"), m.get("recs")
    if type(deps) is not list or type(recs) is not list:
        raise CorruptData(f"{where}: manifest dependencies or records are not lists")
    v2 = m["v"] >= 2
    for d in deps:
        if not (type(d) is list and len(d) == (9 if v2 else 6) and type(d[0]) is str
                and all(_is_count(x) for x in d[1:3]) and _is_hash(d[3]) and _is_hash(d[4])
                and all(_is_count(x) for x in d[5:])):
            raise CorruptData(f"{where}: manifest dependency {short_repr(d)} is malformed")
    for r in recs:
        if not _is_record_row(r):
            raise CorruptData(f"{where}: manifest record {short_repr(r)} is malformed")
    if not v2:
        return
    if not (_is_count(m.get("pb")) and _is_count(m.get("tok")) and m.get("api") in APIS
            and type(m.get("mems")) is list):
        raise CorruptData(f"{where}: manifest counts, api or members are malformed")
    for r in m["mems"]:
        if not (type(r) is list and len(r) == 11 and type(r[0]) is str
                and _is_count(r[1]) and _is_count(r[2]) and _is_hash(r[3])
                and _is_count(r[4]) and _is_record_row(r[5:])):
            raise CorruptData(f"{where}: manifest member {short_repr(r)} is malformed")
    if m["mems"] and recs:
        raise CorruptData(f"{where}: manifest has both records and members")


def _is_record_row(r: Any) -> bool:
    return (type(r) is list and len(r) == 6 and type(r[0]) is str and type(r[1]) is str
            and type(r[2]) is str and (r[3] is None or _is_count(r[3]))
            and _is_count(r[4]) and _is_hash(r[5]))


def manifest_size(body_prefix: Any) -> int:
    """How many body bytes hold prefix + manifest (from the first 20 bytes)."""
    mlen, _ = EXTENT_PREFIX.unpack_from(memoryview(body_prefix).cast("B"))
    return int(EXTENT_PREFIX.size + mlen)


def entry_from_manifest(manifest: dict[str, Any], offset: int, header: framing.FrameHeader
                        ) -> ExtentEntry:
    local = len(manifest["recs"])
    members = len(manifest.get("mems", ()))
    return ExtentEntry(manifest["sub"], manifest["idx"], manifest["n"], offset,
                       header.frame_length, header.body_hash, manifest["digest"],
                       members or local, local, manifest.get("pb", 0),
                       manifest.get("tok", 0), manifest.get("api", "publish"))


class PackWriter:
    """The open pack of one writer incarnation."""

    def __init__(self, fs: Filesystem, path: str, header_info: dict[str, Any],
                 reserve_bytes: int) -> None:
        self.fs = fs
        self.path = path
        self.reserve_bytes = reserve_bytes
        self.entries: list[ExtentEntry] = []
        self.broken = False
        try:
            self.fd = fs.open(path, write=True, create=True, exclusive=True)
        except OSError as e:
            raise storage_error(e, f"cannot create pack {path}") from e
        try:
            head = framing.encode_frame(
                framing.KIND_PACK_HEADER, msgpack.packb(header_info, use_bin_type=True),
                group_start=0,
            )
            self.reserved = 0
            self._reserve(len(head))
            fs.writev(self.fd, [head], 0)
            self.data_end = len(head)
            fs.fsync(self.fd)
            # D1: the pack's name must be durable before any reference into it exists.
            fs.fsync_dir(os.path.dirname(path))
        except OSError as e:
            self.abandon()
            raise storage_error(e, f"cannot initialise pack {path}") from e

    def _step(self) -> int:
        """The reservation step: as large as the pack already is (at least
        ``RESERVE_RAMP_FLOOR``), at most ``reserve_bytes``.  It doubles with the pack, so a
        writer that dies before sealing leaves at most about as many reserved blocks as it
        wrote (plus the floor) until its pack is collected, instead of a whole
        ``reserve_bytes`` per writer: nothing may trim a dead writer's tail (a writer whose
        lock expired may still append within its lock-check window, D4).  A long-lived
        writer reaches the full step once its pack holds ``reserve_bytes``."""
        return min(self.reserve_bytes, max(RESERVE_RAMP_FLOOR, self.reserved))

    def _reserve(self, needed_end: int) -> None:
        """Reserve up to the next multiple of the step (``_step``) past ``needed_end``.  On
        a nearly full disk (ENOSPC/EDQUOT) retry with half the step each time, down to
        exactly ``needed_end`` (what the write needs): only that failing raises, so a small
        publication fits wherever its own bytes fit.  A failed reservation wrote nothing."""
        if needed_end <= self.reserved or self.reserve_bytes <= 0:
            return
        ends = _reserve_candidates(self.reserved, needed_end, self._step())
        for i, new_end in enumerate(ends):
            try:
                supported = self.fs.reserve(self.fd, self.reserved, new_end - self.reserved,
                                            keep_size=True)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT) and i + 1 < len(ends):
                    continue
                raise
            if supported:
                self.reserved = new_end
            else:
                self.reserve_bytes = 0  # not supported here: plain appends from now on
            return

    def append_group(self, extents: Sequence[EncodedExtent]) -> None:
        """Write several laid-out extents (starting at ``data_end``) with one writev and
        ONE data sync.  After an error the pack is abandoned."""
        if self.broken:
            raise StorageUnavailable(f"pack {self.path} was abandoned after an I/O error")
        buffers = [b for e in extents for b in e.buffers]
        total = sum(e.entry.size for e in extents)
        try:
            self._reserve(self.data_end + total)
        except OSError as e:
            # Nothing was written: the pack stays intact and open, so a retry once space
            # is free continues in it instead of leaving one more pack behind.
            raise storage_error(e, f"cannot reserve space in pack {self.path}") from e
        try:
            self.fs.writev(self.fd, buffers, self.data_end)
            # D1: the reference is returned only after this sync.  fdatasync suffices:
            # it persists the data and the new file size (what reading it back needs).
            # Never retried after a failure (the dirty pages may already be gone): the
            # pack is abandoned instead.
            self.fs.fdatasync(self.fd)
        except OSError as e:
            self.abandon()
            raise storage_error(e, f"publication to pack {self.path} failed") from e
        self.data_end += total
        self.entries.extend(e.entry for e in extents)

    def seal(self) -> None:
        """Write the SEAL index and trailer, sync, and trim the reserved tail."""
        if self.broken:
            return
        body = msgpack.packb(
            {"v": MANIFEST_VERSION, "end": self.data_end,
             "extents": [e.packed() for e in self.entries]},
            use_bin_type=True,
        )
        frame = framing.encode_frame(framing.KIND_SEAL, body, group_start=self.data_end)
        trailer = TRAILER.pack(self.data_end, TRAILER_MAGIC)
        end = self.data_end + len(frame) + len(trailer)
        try:
            self.fs.writev(self.fd, [frame, trailer], self.data_end)
            self.fs.truncate(self.fd, end)
            self.fs.fsync(self.fd)
        except OSError as e:
            self.abandon()
            raise storage_error(e, f"sealing pack {self.path} failed") from e
        self.fs.close(self.fd)
        self.broken = True  # closed: no more writes

    def abandon(self) -> None:
        if not self.broken:
            self.broken = True
            try:
                self.fs.close(self.fd)
            except OSError:
                pass


_MIN_RESERVE_STEP = 4096
RESERVE_RAMP_FLOOR = 1 << 20  # the first reservation step of a new pack (``_step``)


def _reserve_candidates(reserved: int, needed_end: int, step: int) -> list[int]:
    """The reservation ends to try, largest first: multiples of ``step``, ``step / 2``, ...
    past ``needed_end``, then ``needed_end`` itself."""
    ends = [-(-max(needed_end, reserved + step) // step) * step]
    step //= 2
    while step >= _MIN_RESERVE_STEP:
        end = -(-max(needed_end, reserved + step) // step) * step
        if end < ends[-1]:
            ends.append(end)
        step //= 2
    if ends[-1] != needed_end:
        ends.append(needed_end)
    return ends


def read_sealed_index(fs: Filesystem, fd: int, size: int) -> list[ExtentEntry] | None:
    """The SEAL index of a sealed pack via its trailer, or None if the pack is not
    (completely) sealed."""
    if size < TRAILER.size + framing.HEADER_SIZE:
        return None
    read_at = framing.read_at_fn(fs, fd)
    trailer = read_at(size - TRAILER.size, TRAILER.size)
    if len(trailer) != TRAILER.size:  # another client's short view
        return None
    seal_offset, magic = TRAILER.unpack(trailer)
    if magic != TRAILER_MAGIC or seal_offset + framing.HEADER_SIZE > size - TRAILER.size:
        return None
    try:
        header, body = framing.decode_frame(read_at(seal_offset, size - TRAILER.size
                                                    - seal_offset))
    except (framing.TornFrame, CorruptData):
        return None
    if header.kind != framing.KIND_SEAL:
        return None
    return _seal_entries(body)


def _seal_entries(body: Any) -> list[ExtentEntry]:
    seal = msgpack.unpackb(body, raw=False)
    if seal.get("v") not in READABLE_VERSIONS:
        raise UnsupportedSchema(f"seal index version {seal.get('v')!r}")
    return [ExtentEntry.unpacked(e) for e in seal["extents"]]


@dataclass
class ScannedPack:
    """What a scan of a pack a crash may have left open can trust."""

    entries: list[ExtentEntry]
    sealed: bool  # a SEAL frame ended the scan
    damage: list[tuple[int, str]]  # (offset, reason) of damaged extents, not indexed


def scan_pack(fs: Filesystem, fd: int, size: int) -> ScannedPack:
    """Every valid extent of a pack that may have been left open by a crash.

    A damaged synced extent (``framing.DamagedFrame``) does not abort the scan: the
    extents before it are kept (they are valid and were synced before it), the damaged
    write group is dropped (its batch is incomplete), and the scan resumes at the next
    frame that starts its own write group, from where the frames must again follow each
    other back to back (a valid frame found only by searching for the magic, e.g. one
    inside the damaged extent's payload, is never trusted on its own).  A complete frame
    in the final group that fails its checksum is dropped by the torn-tail rule (it may
    never have been synced) and reported; a plain incomplete tail is not."""
    read_at = framing.read_at_fn(fs, fd)
    entries: list[ExtentEntry] = []
    damage: list[tuple[int, str]] = []
    start = 0
    while True:
        try:
            scan = framing.scan_frames(read_at, size, start=start)
        except framing.DamagedFrame as e:
            damage.append((e.offset, f"synced extent damaged ({e}): not indexed"))
            # the frames before the damage, walked again up to it
            entries.extend(_extents_of(framing.scan_frames(read_at, e.offset, start=start)))
            if e.resume is None:
                return ScannedPack(entries, False, damage)
            start = e.resume
            continue
        if scan.sealed and not damage:
            return ScannedPack(_seal_entries(scan.frames[-1].body), True, damage)
        entries.extend(_extents_of(scan))
        if scan.torn and _complete_frame_at(read_at, scan.end, size):
            damage.append((scan.end, "final write group damaged or torn: not indexed"))
        return ScannedPack(entries, scan.sealed, damage)


def _extents_of(scan: framing.ScanResult) -> list[ExtentEntry]:
    entries = []
    for f in scan.frames:
        if f.header.kind == framing.KIND_EXTENT:
            manifest, _ = decode_manifest(f.body, f"extent at offset {f.offset}")
            entries.append(entry_from_manifest(manifest, f.offset, f.header))
    return entries


_SECTOR = 512


def _complete_frame_at(read_at: framing.ReadAt, pos: int, size: int) -> bool:
    """A frame whose header checks and whose bytes are all present starts at ``pos`` (so
    its body failed its checksum): damage, or a torn sector of an unsynced write.  A frame
    whose last sector still reads as zeros (reserved space) was cut short: incomplete."""
    try:
        header = framing.decode_header(read_at(pos, framing.HEADER_SIZE))
    except (framing.TornFrame, CorruptData, UnsupportedSchema):
        return False
    end = pos + header.frame_length
    if end > size:
        return False
    last = max(pos + framing.HEADER_SIZE, (end - 1) // _SECTOR * _SECTOR)
    return not framing.is_zero(read_at(last, end - last))
