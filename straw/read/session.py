"""Checked reads of publications: ``ReadSession``, the contract (D6).

Every read authenticates what it returns: ``read``/``validate`` check the whole extent
against the checksum the reference names; ``manifest`` checks the manifest;
``read_record`` checks the manifest and that one record; ``read_range`` the chunks a
range touches.  The session checks the reference, then delegates to one collaborator
per concern (``straw.read`` lists them).

A reference is followed only after ``check_pack_path`` accepted its shape, and its pack
is opened with ``Filesystem.open_beneath`` from the pool root resolved once when the
session opened: no component beneath the root is followed through a symbolic link (a
directory swapped for one while reading included), and anything but a regular file (a
FIFO would block a read forever) is refused at once, ``InvalidReference``.

A session is not an ownership pin: what guarantees a read is a durable owner or pin.  A
collection in this process makes every session of this process on that pool (the store's
own and those of ``read_session()``; a process-wide weak registry) let go of the packs it
reclaimed before it returns (``drop_reclaimed``).

A session belongs to the process that opened it (``straw.process``): in a forked child
every call, the private entry points the store and tensors use included, and ``close()``
raise ``ForkedProcess`` before touching a file or taking a lock; the fork itself already
closed the child's copies of the cached descriptors.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .. import tracing
from ..clock import Clock
from ..durable import framing
from ..errors import CorruptData, InvalidRange, InvalidReference
from ..fs import Filesystem
from ..pool.records import Manifest, Record, RecordInfo
from ..pool.refs import RecordRef, RecordSetRef, SegmentRef
from ..process import ProcessBound
from . import ranges
from .buffers import fresh_bytes
from .cache import PackCache
from .extent_reader import CHUNK, ExtentReader
from .extents import (
    ExtentInfo,
    check_extent_size,
    envelope_dict,
    manifest_dict,
    manifest_json,
    match,
)
from .extents import needs as manifest_needs
from .references import PoolReferences
from .visibility import PackStatusFn, Visibility

# every open session of this process, so that a collection can make them let go of what it
# reclaimed (weak: a session nobody references is not kept alive by this)
_SESSIONS: weakref.WeakSet[ReadSession] = weakref.WeakSet()
_SESSIONS_LOCK = threading.Lock()


def drop_reclaimed(real_root: str, paths: Iterable[str]) -> None:
    """Collection reclaimed ``paths`` (relative to the pool whose resolved root is
    ``real_root``): every session of this process on that pool closes its descriptors of
    them and forgets their manifests, so that their space is free now."""
    paths = set(paths)
    if not paths:
        return
    with _SESSIONS_LOCK:
        sessions = [s for s in _SESSIONS if s.real_root == real_root]
    for s in sessions:
        s._forget(paths)


class ReadSession(ProcessBound):
    """Checked reads with a cache of open packs and authenticated manifests."""

    _process_state = "its open pack files"

    def __init__(self, fs: Filesystem, root: str, run_id: str, clock: Clock, *,
                 visibility_retries: int = 8, visibility_backoff: float = 0.05,
                 pack_status: PackStatusFn | None = None, pool_id: str | None = None,
                 backend: Any = None) -> None:
        self._bind_process()
        self.fs = fs
        self.root = root
        # the store's ``straw.backend.FilesystemBackend`` (straw-queue's session carries
        # it); reads go through ``fs``, which the backend already wrapped
        self.backend = backend
        # the pool's identity (``SharedFilesystemStore.pool_id``), when the opener knows
        # it: a TensorRef compares it with its own before reading (two pools may hold
        # the same run id, and a reference followed into the wrong one finds nothing)
        self.pool_id = pool_id
        # resolved once: the operator's root may be a symlink, nothing beneath it may
        self.real_root = fs.realpath(root)
        self.pack_status = pack_status
        self.run_id = run_id
        self.clock = clock
        self._cache = PackCache(fs, self.real_root, clock)
        self._lock = self._cache.lock  # the one lock of the session's state
        self._visibility = Visibility(fs, self._cache, run_id, clock,
                                      retries=visibility_retries,
                                      backoff=visibility_backoff, pack_status=pack_status)
        self._reader = ExtentReader(self._cache, self._visibility)
        self._refs = PoolReferences(fs, root, self.real_root, run_id)
        self.closed = False
        with _SESSIONS_LOCK:
            _SESSIONS.add(self)

    def _process_subject(self) -> str:
        return f"read session of run {self.run_id!r} at {self.root}"

    def _drop_inherited(self) -> None:
        self._cache.drop_inherited()

    # --- context manager ------------------------------------------------------------
    def __enter__(self) -> ReadSession:
        self._check_process()
        return self

    def close(self) -> None:
        """Close the cached files.  In a forked child: ``ForkedProcess``, taking no lock
        (the child's copies are closed already; ``straw.process``)."""
        if self._in_forked_child():
            self._refuse_close_in_child()
        self._cache.close()
        self.closed = True
        with _SESSIONS_LOCK:
            _SESSIONS.discard(self)

    # --- public reads (straw-queue's read-session surface) ------------------------------
    def read(self, ref: RecordSetRef) -> Iterator[Record]:
        """The publication's records in order, payloads as ``bytes``: an iterator
        (``next(session.read(ref))``).  The reference and (for a publication that stores
        its records) the whole extent are checked before this returns, so a bad reference
        fails at the call, not at the first ``next``; the records of a ``record_set``
        publication, which live in other extents, are read and checked one by one as the
        iterator reaches them."""
        self._check_process()
        ref = self._canonical(ref)
        self._refs.check(ref)
        started = self.clock.now() if tracing.enabled() else None
        whole = self._small_extent_at_once(ref.segment)
        ext = whole[0] if whole is not None else self._reader.extent(ref.segment)
        match(ref, ext)
        if ext.members:
            return self._read_members(ext)
        if whole is not None:
            records = whole[1]
        else:  # the body after the manifest: the read straw-queue's trace times
            started = self.clock.now() if tracing.enabled() else None
            _, records = self._reader.read_extent(ref.segment)
        if started is not None:  # straw-queue traces one "read" per record
            share = (self.clock.now() - started) / max(1, len(records))
            for r in records:
                tracing.emit("read", root=self.root, size=len(r.payload), seconds=share)
        return iter(records)

    def _small_extent_at_once(self, seg: SegmentRef) -> tuple[ExtentInfo, list[Record]] | None:
        """A small extent whose manifest this session has not checked yet, read and
        checked in ONE pass (``ExtentReader.read_extent``: header against the reference,
        manifest, body hash; its manifest is then cached), instead of a read for the
        manifest and a second one for the whole body (a generation client's take reads every prompt
        input so).  None when that does not apply (a large extent, or one checked
        already).  A fault fails this pass as it fails the two-step path (the same checks
        and error classes: a reference that does not match is ``InvalidReference``,
        damage ``CorruptData``, D6), with no second attempt."""
        if seg.size > CHUNK or seg in self._cache.extents:
            return None
        return self._reader.read_extent(seg)

    def _read_members(self, ext: ExtentInfo) -> Iterator[Record]:
        for rref, _ in ext.members:
            yield self.read_record(rref)

    def validate(self, ref: RecordSetRef, *, task_id: str | None = None,
                 attempt_id: str | None = None) -> tuple[RecordRef, ...]:
        """Check the publication (its whole extent; for a ``record_set``, each member's
        manifest entry) and return the references of its records.  With ``task_id`` /
        ``attempt_id``, every record must name that task/attempt in its metadata
        (``task_id``/``attempt_id`` keys), else ``InvalidReference``."""
        self._check_process()
        ref = self._canonical(ref)
        manifest = self.checked_manifest(ref)
        ext = self._reader.extent(ref.segment)
        if ext.members:
            for rref, info in ext.members:
                self._member_info(rref, info)
        else:
            # every byte is checked, none kept: a large payload passes through a bounded
            # scratch buffer (a rewind checks results of many MiB in a small process)
            self._reader.read_extent(ref.segment, keep=False)
        for name, want in (("task_id", task_id), ("attempt_id", attempt_id)):
            if want is None:
                continue
            for info in manifest.records:
                if info.metadata.get(name) != want:
                    raise InvalidReference(
                        f"{ref!r}: record {info.record_id!r} names {name} "
                        f"{info.metadata.get(name)!r}, not {want!r} (task/attempt mismatch: "
                        "a result of another task attempt)")
        return manifest.record_refs

    def manifest(self, ref: RecordSetRef) -> dict[str, Any]:
        """straw-queue's manifest dict: ``version``, ``digest``, ``records`` (record
        reference dicts) and ``dependencies`` (publication reference dicts)."""
        self._check_process()
        m = self.checked_manifest(ref)
        return manifest_dict(m)

    def checked_manifest(self, ref: RecordSetRef) -> Manifest:
        """straw's own view of the checked manifest (records' ids, codecs, metadata,
        lengths and checksums, dependencies, record references)."""
        self._check_process()
        ref = self._canonical(ref)
        self._refs.check(ref)
        ext = self._reader.extent(ref.segment)
        match(ref, ext)
        return ext.manifest

    def needs(self, seg: SegmentRef) -> list[SegmentRef]:
        """The publications that ``seg``'s publication needs, from its checked manifest:
        its dependencies and, for a record set, the publications holding its records
        (each once; the publication itself is left out)."""
        self._check_process()
        seg = self._canonical(seg)
        self._refs.check(seg)
        return manifest_needs(seg, self._reader.extent(seg).manifest)

    def cached_needs(self, seg: SegmentRef) -> list[SegmentRef] | None:
        """``needs`` if this session holds the checked manifest already (no I/O), else
        None (a canonical, checked reference: e.g. one whose manifest was just checked)."""
        self._check_process()
        ext = self._cache.extents.get(seg)
        return None if ext is None else manifest_needs(seg, ext.manifest)

    def envelope(self, ref: RecordRef) -> dict[str, Any]:
        """straw-queue's record envelope dict (``record_id``, ``codec``, ``metadata``,
        ``tokens``, ``length``, ``checksum``, ``version``) from the checked manifest; the
        manifest ordinal's envelope describes the manifest record (``read_record``)."""
        self._check_process()
        info, _ = self._locate(ref)
        return envelope_dict(info)

    def check_published(self, ref: RecordSetRef | SegmentRef) -> None:
        """``InvalidReference`` unless ``ref`` names a publication: the frame at its offset
        is an extent of its size and checksum.  One small read (none when its manifest was
        checked already); what is retained or depended on must exist (D4)."""
        self._check_process()
        ref = self._canonical(ref)
        seg = ref.segment if isinstance(ref, RecordSetRef) else ref
        self._refs.check(ref)
        if seg in self._cache.extents:
            return
        check_extent_size(seg)
        head = self._visibility.read_exact(seg.path, seg.offset, framing.HEADER_SIZE, frame=True)
        self._visibility.check_header(seg, head)

    def confirm_published(self, segs: Sequence[SegmentRef]) -> list[bool]:
        """Which of ``segs`` (canonical, structurally checked by the caller) are confirmed
        to name a publication (D4) by reading their frame headers in bulk: per pack, ONE
        read spans neighbouring extents' headers (a gap of at most ``BULK_GAP`` bytes
        between them), so retaining a restored backlog of 10,000 groups costs a few reads,
        not 10,000.  A header is confirmed only on the condition ``check_published``
        returns on (a valid extent frame of the reference's size and checksum); anything
        else (short file, zeros, another frame, an I/O error) is False, never an error:
        the caller asks ``check_published`` for it, which retries visibility lag and names
        the fault."""
        self._check_process()
        return self._reader.confirm_published(segs)

    def read_record(self, ref: RecordRef) -> Record:
        """One record, reading and checking only its extent's manifest and that record.
        The manifest ordinal (see ``straw.refs``) reads back as a record too, as in
        straw-queue: id ``manifest:<digest>``, codec ``record-set.v2``, the manifest dict
        as canonical JSON, checked against the extent like every record."""
        self._check_process()
        info, where = self._locate(ref)
        if where is None:  # the manifest
            ext = self._reader.extent(ref.segment)
            return Record(info.record_id, manifest_json(ext.manifest), info.codec, {}, 0)
        path, offset = where
        started = self.clock.now() if tracing.enabled() else None
        data, view = fresh_bytes(info.length)
        self._visibility.read_exact(path, offset, info.length, into=view)
        if framing.hash_buffers([view]).hex() != info.checksum:
            raise CorruptData(
                f"record {info.record_id!r} at {path} offset {offset}: payload checksum "
                "mismatch")
        if started is not None:
            tracing.emit("read", root=self.root, size=info.length,
                         seconds=self.clock.now() - started)
        return Record(info.record_id, data, info.codec, info.metadata, info.tokens or 0)

    def read_payload_range(self, record_ref: RecordRef, start: int, stop: int,
                           into: Any = None) -> memoryview:
        """Unchecked bytes [start, stop) of a record, read into ``into`` if given.  The
        caller verifies them against its own finer-grained checksums (tensor chunks,
        ``SharedFilesystemStore.read_range``)."""
        self._check_process()
        info, where = self._locate(record_ref)
        if where is None:
            raise InvalidReference(f"{record_ref!r} names a manifest, not a payload record")
        if not 0 <= start <= stop <= info.length:
            raise InvalidRange(f"range [{start}, {stop}) outside record of {info.length} "
                               "bytes")
        path, offset = where
        return self._visibility.read_exact(path, offset + start, stop - start, into=into)

    def payload_location(self, record_ref: RecordRef) -> tuple[RecordInfo, str, int]:
        """A payload record's checked manifest entry, pack path and absolute offset (for
        readers that read into their own destination: ``straw.tensor``)."""
        self._check_process()
        info, where = self._locate(record_ref)
        if where is None:
            raise InvalidReference(f"{record_ref!r} names a manifest, not a payload record")
        return info, where[0], where[1]

    def read_range(self, ref: RecordRef, start: int, stop: int, *, chunk_bytes: int,
                   checksums: Sequence[str]) -> bytearray:
        """Bytes [start, stop) of a record, checked against the caller's chunk checksums
        (``checksums[k]`` hashes payload bytes [k*chunk_bytes, (k+1)*chunk_bytes), hex
        SHA-256 or xxh3-128): every chunk the range touches is read and checked whole
        (``straw.read.ranges``); a mismatch is ``CorruptData``."""
        self._check_process()
        started = self.clock.now() if tracing.enabled() else None
        out = ranges.read_range(self, ref, start, stop, chunk_bytes=chunk_bytes,
                                checksums=checksums)
        if started is not None:
            self._trace_range(ref, start, stop, chunk_bytes, started)
        return out

    def read_tensor_range(self, ref: RecordRef, start: int, stop: int, *,
                          expected: Mapping[str, Any] | None = None
                          ) -> tuple[dict[str, Any], bytearray]:
        """``(envelope, bytes [start, stop))`` of a ``tensor.v1`` record, checked against
        the chunk checksums of its authenticated manifest entry.  ``expected``
        (``{"dtype", "shape", "length"}``, any subset) must match the envelope before
        any payload is read, else ``CorruptData``."""
        self._check_process()
        started = self.clock.now() if tracing.enabled() else None
        info, _, _ = self.payload_location(ref)
        chunk_bytes, sums = ranges.tensor_chunks(info, expected)
        out = ranges.read_range(self, ref, start, stop, chunk_bytes=chunk_bytes,
                                checksums=sums)
        if started is not None:
            self._trace_range(ref, start, stop, chunk_bytes, started)
        return envelope_dict(info), out

    def _trace_range(self, record_ref: RecordRef, start: int, stop: int, chunk_bytes: int,
                     started: float) -> None:
        """straw-queue's ``read_range`` trace event: the range's bytes and the bytes of
        the whole chunks checked for it."""
        info, _ = self._locate(record_ref)
        tracing.emit("read_range", root=self.root, size=stop - start,
                     checked_bytes=ranges.checked_span(info.length, start, stop, chunk_bytes),
                     seconds=self.clock.now() - started)

    # --- extents ----------------------------------------------------------------------
    def extent(self, seg: SegmentRef) -> ExtentInfo:
        """The checked manifest of the extent ``seg`` names (cached): its frame header
        matches the reference (size, checksum) and the manifest its own checksum."""
        self._check_process()
        seg = self._canonical(seg)
        self._refs.check(seg)
        return self._reader.extent(seg)

    def _locate(self, record_ref: RecordRef) -> tuple[RecordInfo, tuple[str, int] | None]:
        """A record's checked manifest entry and (path, absolute payload offset); None as
        location for the manifest ordinal."""
        record_ref = self._refs.record(record_ref)
        ext = self._reader.extent(record_ref.segment)
        o = record_ref.ordinal
        if o < len(ext.local):
            return ext.local[o], (record_ref.segment.path, ext.offsets[o])
        if o == len(ext.local):
            return ext.manifest_info, None
        raise InvalidReference(
            f"{record_ref!r}: the extent stores {len(ext.local)} records (ordinals "
            f"0..{len(ext.local) - 1}) and its manifest (ordinal {len(ext.local)}); there is "
            f"no ordinal {o}")

    def _member_info(self, rref: RecordRef, copy: RecordInfo) -> RecordInfo:
        """A ``record_set`` member's entry in its own extent, which must be the copy the
        record set holds (``CorruptData`` otherwise: both passed their checksums)."""
        info, where = self._locate(rref)
        if where is None or info != copy:
            raise CorruptData(f"record set member {rref!r} differs from the record it names")
        return info

    # --- references ------------------------------------------------------------------
    def _canonical(self, ref: Any) -> Any:
        """``ref`` with an in-pool alias of its pack resolved (``PoolReferences``)."""
        return self._refs.canonical(ref)

    # --- entry points of the store and of tensor loads ----------------------------------
    def _forget(self, paths: set[str]) -> None:
        """Close the cached descriptors of ``paths`` and forget their manifests."""
        self._cache.forget(paths)

    def _read_extent(self, seg: SegmentRef, *, keep: bool = True
                     ) -> tuple[ExtentInfo, list[Record]]:
        """Read and check a whole extent (``ExtentReader.read_extent``); ``seg`` is
        checked by the caller (``PoolReferences.check``)."""
        self._check_process()
        return self._reader.read_extent(seg, keep=keep)

    def _read_exact(self, path: str, offset: int, size: int, into: Any = None,
                    frame: bool = False, frame_size: int | None = None) -> memoryview:
        """Exactly ``size`` unchecked bytes at ``offset`` (``Visibility.read_exact``)."""
        self._check_process()
        return self._visibility.read_exact(path, offset, size, into, frame, frame_size)

    def _read_blocks(self, path: str, offset: int, buf: memoryview, block: int,
                     starts: Iterable[int] | None = None) -> Iterator[tuple[int, int]]:
        """``buf`` filled block by block, unchecked (``Visibility.read_blocks``)."""
        self._check_process()
        return self._visibility.read_blocks(path, offset, buf, block, starts)

