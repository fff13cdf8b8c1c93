"""Checked reads of publications: ``ReadSession``.

Every read authenticates what it returns (D6): ``read``/``validate`` check the whole
extent against the checksum the reference names; ``manifest`` checks the manifest;
``read_record`` checks the manifest and that one record.  A mismatch of bytes that are
present is ``CorruptData`` at once, never retried.  Bytes that are *missing* (the file is
shorter than the extent, or still reads as zeros, wholly or on one side of a page boundary,
or the file is not visible yet) may be another client's visibility lag: the read reopens
the file, drops the range's cached pages (a reopen may keep a stale page: see
``Filesystem.drop_cached``) and retries a bounded number of times, then raises
``StorageUnavailable`` — except
a frame header zeroed on one side of a page boundary, whose bytes are present: if it
stays damaged through every retry it is ``CorruptData``.

When the pack is *final* there is no lag to wait for, so nothing is retried: a pack
whose file ends in a valid SEAL trailer, or that the catalog knows as sealed or
reclaimed, or that the catalog never heard of (a pack is known to the catalog before its
file exists), or that the reading store itself is writing (its own writes are visible to
it) — asked only after a read failed (the store's ``pack_status`` callback),
then confirmed by one more read through a freshly opened descriptor (close-to-open).  A
final pack fails at once: ``InvalidReference`` for a reference that cannot be right (no
publication starts at its offset, its size runs past an intact pack, its pack was
reclaimed or never written), ``CorruptData`` for damage (a sealed or own pack truncated
or zeroed below a published extent, a sealed pack deleted outside straw, a checksum
mismatch); the store's own pack missing is ``StorageUnavailable`` (moved outside straw).

A reference is followed only after ``check_pack_path`` accepted its shape, and its pack
is opened with ``Filesystem.open_beneath`` from the pool root resolved once when the
session opened: no component beneath the root is followed through a symbolic link (a
directory swapped for one while reading included), and anything but a regular file (a
FIFO would block a read forever) is refused at once, ``InvalidReference``.  No buffer
larger than one read chunk is allocated for a reference before an authenticated frame
header at its offset said that the extent has exactly its size and the file was seen to
hold all of it; every field of a reference (size, checksum, digest, records) must match
the extent, else ``InvalidReference`` naming the field.

A session caches open files and checked manifests; it is not an ownership pin.  (A pack
reclaimed while a session holds it open may still read back, intact, through that handle:
what guarantees a read is a durable owner or pin, never such luck.)

Reclaimed means freed: a cached descriptor keeps an unlinked pack's bytes allocated, so

* a collection in this process (``SharedFilesystemStore.collect_garbage``) makes every
  session of this process on that pool (the store's own and those of ``read_session()``;
  a process-wide weak registry) drop its descriptors and manifests of the packs it
  reclaimed before it returns (``drop_reclaimed``);
* a session of another process cannot be reached: when it next uses its cache, at most
  every ``_SWEEP_SECONDS``, it checks its cached descriptors (one ``fstat`` each) and drops
  those whose file has no link any more (or cannot be checked, e.g. ESTALE on NFS).  A
  session that is never used again holds its descriptors until it is closed.

The hot read path gains no syscall: one clock read per cache use.

A session belongs to the process that opened it (``straw.process``): in a forked child
every read and ``close()`` raise ``ForkedProcess`` before touching a file or taking a
lock; the fork itself already closed the child's copies of the cached descriptors.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import platform
import posixpath
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from .. import framing, tracing
from ..clock import Clock
from ..errors import (
    Closed,
    CorruptData,
    ExtentMismatch,
    InvalidRange,
    InvalidReference,
    StorageUnavailable,
    StrawError,
    UnsupportedSchema,
    WrongReferenceKind,
)
from ..fs import Filesystem, NotBeneath
from ..pack import EXTENT_PREFIX, decode_manifest, manifest_size, read_sealed_index
from ..process import ProcessBound, close_quietly
from ..refs import (
    PACK_PATH_RE,
    Manifest,
    Record,
    RecordInfo,
    RecordRef,
    RecordSetRef,
    SegmentRef,
    alias_parts,
    canonical_ref,
    check_pack_path,
    parse_metadata,
    ref_from_tuple,
)
from . import ranges

_FIRST_READ = 64 * 1024
_CHUNK = 1 << 19  # read-and-hash granularity of whole-extent reads
_PAGE = 4096  # granularity at which another client's view of fresh data can be partial
_FD_CACHE = 64
_ZERO_HEADER = bytes(framing.HEADER_SIZE)
# confirm_published: one read covers headers at most this far apart, and this long in all
# (the bytes between them are read too: bounded, and cheaper than a read per header)
_BULK_GAP = 64 * 1024
_BULK_SPAN = 4 * 1024 * 1024
_SWEEP_SECONDS = 5.0  # how often a session looks for cached packs another client reclaimed

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


# --- payloads as bytes, without a second copy --------------------------------------------
# Records read back carry ``bytes`` (straw-queue's type), and a payload is read straight
# into its bytes object: CPython's PyBytes_FromStringAndSize(NULL, n) makes an
# uninitialised bytes object that nothing else references yet, which we fill through a
# view of its buffer before handing it out (what C extensions do).  Elsewhere (another
# Python) a bytearray is filled and copied once.
_CPYTHON = platform.python_implementation() == "CPython"
if _CPYTHON:
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    _BYTES_DATA = bytes.__basicsize__ - 1  # offset of the data in a bytes object


# Large buffers ask for transparent huge pages, as NumPy does for its arrays (with THP in
# "madvise" mode, the common default, a 16 MiB payload otherwise takes 4096 page faults).
_HUGE_MIN = 4 << 20
try:
    _libc: Any = ctypes.CDLL(None, use_errno=True)
    _madvise = _libc.madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
except (OSError, AttributeError):
    _madvise = None
_MADV_HUGEPAGE = 14  # Linux


def _advise_huge(addr: int, n: int) -> None:
    if _madvise is None or n < _HUGE_MIN:
        return
    start = -(-addr // _PAGE) * _PAGE  # madvise takes whole pages inside the buffer
    end = (addr + n) // _PAGE * _PAGE
    if end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: errors are ignored


def fresh_bytes(n: int) -> tuple[bytes, memoryview]:
    """A new ``bytes`` of ``n`` bytes and a writable view of its content: the caller fills
    the view completely before the bytes object is used (its content is uninitialised).
    Not on CPython: a bytearray (bytes-like: compares, decodes, slices the same)."""
    if _CPYTHON and n > 0:
        data = _new_bytes(None, n)
        addr = id(data) + _BYTES_DATA
        _advise_huge(addr, n)
        view = memoryview((ctypes.c_char * n).from_address(addr))
        return data, view.cast("B")
    if n == 0:
        return b"", memoryview(bytearray())
    buf = bytearray(n)
    return buf, memoryview(buf)  # type: ignore[return-value]


MANIFEST_CODEC = "record-set.v2"  # the codec the manifest ordinal reads back with


@dataclass(frozen=True)
class ExtentInfo:
    """The checked content of one extent: its own records (``local``, payloads at
    ``offsets``) or, for a ``record_set`` publication, its ``members`` (records of other
    extents with a copy of their manifest entries), the publication reference it holds,
    straw's ``Manifest`` of it, and the entry of its manifest ordinal."""

    segment: SegmentRef
    version: int
    api: str
    local: tuple[RecordInfo, ...]
    offsets: tuple[int, ...]
    members: tuple[tuple[RecordRef, RecordInfo], ...]
    ref: RecordSetRef
    manifest: Manifest
    payload_start: int  # where the payloads begin in the extent body

    @property
    def manifest_info(self) -> RecordInfo:
        """The entry of the manifest ordinal (built on demand: reads rarely ask)."""
        mjson = _manifest_json(self.manifest)
        return RecordInfo(f"manifest:{self.ref.digest}", MANIFEST_CODEC, {}, 0, len(mjson),
                          framing.hash_buffers([mjson]).hex())


def manifest_dict(m: Manifest) -> dict[str, Any]:
    """straw-queue's manifest shape (``store.manifest``)."""
    return {"version": 2, "digest": m.ref.digest,
            "records": [r.to_dict() for r in m.record_refs],
            "dependencies": [d.to_dict() for d in m.dependencies]}


def _manifest_json(m: Manifest) -> bytes:
    return json.dumps(manifest_dict(m), sort_keys=True, separators=(",", ":")).encode()


def envelope_dict(info: RecordInfo) -> dict[str, Any]:
    """straw-queue's record envelope shape (``inspect_segment``, ``envelope``); the
    checksum is our xxh3-128 hex of the payload."""
    return {"record_id": info.record_id, "codec": info.codec,
            "metadata": dict(info.metadata), "tokens": info.tokens or 0,
            "length": info.length, "checksum": info.checksum, "version": 1}


def _zero_tail(parts: list[tuple[int, memoryview]], start: int, end: int) -> bool:
    """True if the extent [start, end), read as ``parts`` ((file offset, bytes) pieces),
    ends in zeros from a page boundary on (``_zero_page_tail`` across pieces)."""
    tail = start
    for off, buf in parts:
        arr: Any = np.frombuffer(buf, dtype=np.uint8)
        nz = np.flatnonzero(arr)
        if nz.size:
            tail = max(tail, off + int(nz[-1]) + 1)
    boundary = -(-tail // _PAGE) * _PAGE
    return tail > start and boundary < end


def _alloc(size: int) -> memoryview:
    """An uninitialised byte buffer: a read fills it, so zero-filling would be wasted."""
    arr: Any = np.empty(size, dtype=np.uint8)
    return memoryview(arr).cast("B")


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
    boundary = -(-(file_offset + tail_start) // _PAGE) * _PAGE - file_offset
    return tail_start > 0 and boundary < len(buf)


def _partial_header(head: memoryview, file_offset: int) -> bool:
    """A header that fails its check and is zeros on one side of a page boundary it
    straddles: another client's partial view of fresh data, either pages from the boundary
    on not visible yet, or the page before it still cached from before the write (it held
    reserved zeros then; the pack's size did not change, so nothing invalidated it)."""
    try:
        framing.decode_header(head)
    except CorruptData:
        cut = -file_offset % _PAGE  # where a page boundary cuts the header, if it does
        stale_head = 0 < cut < len(head) and head[:cut] == bytes(cut)
        return stale_head or _zero_page_tail(head, file_offset)
    except Exception:  # torn or unsupported: not this case
        return False
    return False


def _check_extent_size(seg: SegmentRef) -> None:
    """Refuse a size no extent can have before anything is read for it (a shorter read
    would parse as a torn frame, which is not an answer about a reference)."""
    if seg.size < framing.HEADER_SIZE + EXTENT_PREFIX.size:
        raise ExtentMismatch(
            f"{seg!r}: size {seg.size} is too small to be an extent (at least "
            f"{framing.HEADER_SIZE + EXTENT_PREFIX.size} bytes); the reference is edited: "
            "use the reference publish returned")


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
class _Lag:
    """Bytes not (yet) visible (``kind``: missing, short, zeros, partial): another
    client's visibility lag unless the pack is final."""

    kind: str
    detail: str


@dataclass(frozen=True)
class _Final:
    """A pack whose content cannot change any more (D6: no visibility lag to wait for).
    ``kind``: ``complete`` (the file ends in a valid SEAL trailer; ``offsets`` from its
    index), ``sealed`` (the catalog says so; the file may be damaged), ``reclaimed``
    (tombstoned), ``unknown`` (the catalog never heard of it and the file is missing),
    ``own`` (the reading store is its writer: what it wrote is visible to it)."""

    kind: str
    offsets: frozenset[int] = frozenset()


def _needs(seg: SegmentRef, m: Manifest) -> list[SegmentRef]:
    """The publications a manifest's extent needs (``ReadSession.needs``)."""
    out = {(d.path, d.offset): d.segment for d in m.dependencies}
    out.update(((r.segment.path, r.segment.offset), r.segment) for r in m.record_refs)
    out.pop((seg.path, seg.offset), None)
    return list(out.values())


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
        self.retries = visibility_retries
        self.backoff = visibility_backoff
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._extents: OrderedDict[SegmentRef, ExtentInfo] = OrderedDict()
        self._lock = threading.Lock()
        # Descriptors are shared by the session's threads: one dropped (evicted, reopened
        # after lag, reclaimed) while another thread reads through it is retired, not
        # closed, until no read is in flight (``_reading``): closing it under a reader
        # fails its read with EBADF, or worse, its number is reused by another file.
        self._inflight = 0
        self._retired: list[int] = []
        self.closed = False
        self._next_sweep = clock.now() + _SWEEP_SECONDS
        with _SESSIONS_LOCK:
            _SESSIONS.add(self)

    def _process_subject(self) -> str:
        return f"read session of run {self.run_id!r} at {self.root}"

    def _drop_inherited(self) -> None:
        fds = list(self._fds.values())
        self._fds.clear()
        self._extents.clear()
        for fd in fds:
            close_quietly(self.fs, fd)

    # --- context manager ------------------------------------------------------------
    def __enter__(self) -> ReadSession:
        self._check_process()
        return self

    def close(self) -> None:
        """Close the cached files.  In a forked child: ``ForkedProcess``, taking no lock
        (the child's copies are closed already; ``straw.process``)."""
        if self._in_forked_child():
            self._refuse_close_in_child()
        with self._lock:
            for fd in self._fds.values():
                self._retire(fd)
            self._fds.clear()
            self._extents.clear()
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
        self._check_ref(ref)
        started = self.clock.now() if tracing.enabled() else None
        whole = self._small_extent_at_once(ref.segment)
        ext = whole[0] if whole is not None else self._extent(ref.segment)
        self._match(ref, ext)
        if ext.members:
            return self._read_members(ext)
        if whole is not None:
            records = whole[1]
        else:  # the body after the manifest: the read straw-queue's trace times
            started = self.clock.now() if tracing.enabled() else None
            _, records = self._read_extent(ref.segment)
        if started is not None:  # straw-queue traces one "read" per record
            share = (self.clock.now() - started) / max(1, len(records))
            for r in records:
                tracing.emit("read", root=self.root, size=len(r.payload), seconds=share)
        return iter(records)

    def _small_extent_at_once(self, seg: SegmentRef) -> tuple[ExtentInfo, list[Record]] | None:
        """A small extent whose manifest this session has not checked yet, read and
        checked in ONE pass (``_read_extent``: header against the reference, manifest,
        body hash; its manifest is then cached), instead of a read for the manifest and a
        second one for the whole body (a generation client's take reads every prompt
        input so).  None when that does not apply (a large extent, or one checked
        already).  A fault fails this pass as it fails the two-step path (the same checks
        and error classes: a reference that does not match is ``InvalidReference``,
        damage ``CorruptData``, D6), with no second attempt."""
        if seg.size > _CHUNK or seg in self._extents:
            return None
        return self._read_extent(seg)

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
        ext = self._extent(ref.segment)
        if ext.members:
            for rref, info in ext.members:
                self._member_info(rref, info)
        else:
            # every byte is checked, none kept: a large payload passes through a bounded
            # scratch buffer (a rewind checks results of many MiB in a small process)
            self._read_extent(ref.segment, keep=False)
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
        self._check_ref(ref)
        ext = self._extent(ref.segment)
        self._match(ref, ext)
        return ext.manifest

    def needs(self, seg: SegmentRef) -> list[SegmentRef]:
        """The publications that ``seg``'s publication needs, from its checked manifest:
        its dependencies and, for a record set, the publications holding its records
        (each once; the publication itself is left out)."""
        self._check_process()
        seg = self._canonical(seg)
        self._check_ref(seg)
        return _needs(seg, self._extent(seg).manifest)

    def cached_needs(self, seg: SegmentRef) -> list[SegmentRef] | None:
        """``needs`` if this session holds the checked manifest already (no I/O), else
        None (a canonical, checked reference: e.g. one whose manifest was just checked)."""
        self._check_process()
        ext = self._extents.get(seg)
        return None if ext is None else _needs(seg, ext.manifest)

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
        self._check_ref(ref)
        if seg in self._extents:
            return
        _check_extent_size(seg)
        head = self._read_exact(seg.path, seg.offset, framing.HEADER_SIZE, frame=True)
        self._check_header(seg, head)

    def confirm_published(self, segs: Sequence[SegmentRef]) -> list[bool]:
        """Which of ``segs`` (canonical, structurally checked by the caller) are confirmed
        to name a publication (D4) by reading their frame headers in bulk: per pack, ONE
        read spans neighbouring extents' headers (a gap of at most ``_BULK_GAP`` bytes
        between them), so retaining a restored backlog of 10,000 groups costs a few reads,
        not 10,000.  A header is confirmed only on the condition ``check_published``
        returns on (a valid extent frame of the reference's size and checksum); anything
        else (short file, zeros, another frame, an I/O error) is False, never an error:
        the caller asks ``check_published`` for it, which retries visibility lag and names
        the fault, exactly as before."""
        self._check_process()
        out = [False] * len(segs)
        by_pack: dict[str, list[int]] = {}
        for i, seg in enumerate(segs):
            if seg in self._extents:  # its manifest was checked already
                out[i] = True
            elif seg.run_id == self.run_id and seg.size >= framing.HEADER_SIZE \
                    + EXTENT_PREFIX.size:
                by_pack.setdefault(seg.path, []).append(i)
        for path, idx in by_pack.items():
            check_pack_path(path, self.run_id)
            idx.sort(key=lambda i: segs[i].offset)
            start = 0
            for k in range(1, len(idx) + 1):
                if k < len(idx):
                    prev, cur = segs[idx[k - 1]].offset, segs[idx[k]].offset
                    if cur - (prev + framing.HEADER_SIZE) <= _BULK_GAP \
                            and cur - segs[idx[start]].offset <= _BULK_SPAN:
                        continue
                self._confirm_span(path, [segs[i] for i in idx[start:k]], idx[start:k], out)
                start = k
        return out

    def _confirm_span(self, path: str, segs: list[SegmentRef], idx: list[int],
                      out: list[bool]) -> None:
        lo = segs[0].offset
        buf = _alloc(segs[-1].offset + framing.HEADER_SIZE - lo)
        try:
            with self._reading():
                n = self.fs.readinto(self._fd(path), buf, lo)
        except OSError:
            return  # check_published decides (missing, not visible yet, ...)
        for i, seg in zip(idx, segs, strict=True):
            at = seg.offset - lo
            if at + framing.HEADER_SIZE > n:
                break
            try:
                header = framing.decode_header(buf[at:at + framing.HEADER_SIZE])
            except (StrawError, framing.TornFrame):  # check_published names it
                continue
            out[i] = header.kind == framing.KIND_EXTENT and header.frame_length == seg.size \
                and header.body_hash.hex() == seg.checksum

    def read_record(self, ref: RecordRef) -> Record:
        """One record, reading and checking only its extent's manifest and that record.
        The manifest ordinal (see ``straw.refs``) reads back as a record too, as in
        straw-queue: id ``manifest:<digest>``, codec ``record-set.v2``, the manifest dict
        as canonical JSON, checked against the extent like every record."""
        self._check_process()
        info, where = self._locate(ref)
        if where is None:  # the manifest
            ext = self._extent(ref.segment)
            return Record(info.record_id, _manifest_json(ext.manifest), info.codec, {}, 0)
        path, offset = where
        started = self.clock.now() if tracing.enabled() else None
        data, view = fresh_bytes(info.length)
        self._read_exact(path, offset, info.length, into=view)
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
        return self._read_exact(path, offset + start, stop - start, into=into)

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
        self._check_ref(seg)
        return self._extent(seg)

    def _extent(self, seg: SegmentRef) -> ExtentInfo:
        """``extent`` of a reference checked already."""
        cached = self._extents.get(seg)
        if cached is not None:
            return cached
        _check_extent_size(seg)
        head = self._read_exact(seg.path, seg.offset, min(seg.size, _FIRST_READ), frame=True,
                                frame_size=seg.size)
        header = self._check_header(seg, head)
        body_head = memoryview(head)[framing.HEADER_SIZE:]
        if body_head.nbytes < EXTENT_PREFIX.size:
            raise InvalidReference(f"{seg!r}: too small to be an extent")
        need = manifest_size(body_head)
        if need > header.body_length:
            raise CorruptData(f"{seg.path} offset {seg.offset}: manifest longer than extent")
        if need > body_head.nbytes:
            body_head = memoryview(self._read_exact(
                seg.path, seg.offset + framing.HEADER_SIZE, need))
        raw, payload_start = decode_manifest(body_head, f"{seg.path} offset {seg.offset}")
        return self._remember(seg, raw, payload_start, header.body_length)

    def _locate(self, record_ref: RecordRef) -> tuple[RecordInfo, tuple[str, int] | None]:
        """A record's checked manifest entry and (path, absolute payload offset); None as
        location for the manifest ordinal."""
        if isinstance(record_ref, RecordSetRef):
            raise WrongReferenceKind(
                f"expected a RecordRef (one record), got a RecordSetRef (a publication: "
                f"{record_ref!r}); read a publication with read(ref), or pass one of its "
                "records' RecordRef")
        if not isinstance(record_ref, RecordRef):
            raise TypeError(f"expected a RecordRef, got {type(record_ref).__name__}")
        record_ref = self._canonical(record_ref)
        record_ref.check()
        if record_ref.segment.run_id != self.run_id:
            self._check_ref(record_ref.segment)  # the error naming both runs
        ext = self._extent(record_ref.segment)
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

    # --- internals --------------------------------------------------------------------
    def _canonical(self, ref: Any) -> Any:
        """``ref`` with an in-pool alias of its pack resolved (``straw.refs.canonical_ref``);
        a canonical reference is returned as it is, without I/O."""
        return canonical_ref(ref, self._resolve_alias)

    def _resolve_alias(self, path: str) -> str:
        """The canonical pack path that ``path`` (not canonical) names through symbolic
        links inside the pool, else ``path`` unchanged (the reference check then refuses
        it).  A link whose target lies outside the pool root is ``InvalidReference``:
        straw never follows a reference out of its pool.  Only names are resolved here;
        the pack is opened by its canonical path beneath the root."""
        parts = alias_parts(path)
        if parts is None:
            return path
        try:
            real = self.fs.realpath(posixpath.join(self.real_root, *parts))
        except OSError as e:  # a loop of links, say
            raise InvalidReference(f"reference path {path!r} cannot be resolved inside the "
                                   f"pool {self.root!r}: {e}") from None
        base = self.real_root.rstrip("/") + "/"
        if not real.startswith(base):
            raise InvalidReference(
                f"reference path {path!r} leads outside the pool root {self.root!r} (to "
                f"{real!r}) through a symbolic link; straw follows references only to packs "
                "inside their pool: use the pack's own path")
        rel = real[len(base):]
        return rel if PACK_PATH_RE.match(rel) else path

    def _check_ref(self, ref: object) -> None:
        if isinstance(ref, RecordRef):
            raise WrongReferenceKind(
                f"expected a RecordSetRef (a publication), got a RecordRef (one record: "
                f"{ref!r}); read one record with read_record(ref), or pass the "
                "publication's RecordSetRef (record_set(refs, ...) makes one of records)")
        if not isinstance(ref, (RecordSetRef, SegmentRef)):
            raise TypeError(f"expected a RecordSetRef, got {type(ref).__name__}")
        ref.check()
        if ref.run_id != self.run_id:
            raise InvalidReference(
                f"{ref!r} belongs to run {ref.run_id!r}, this store is run {self.run_id!r}"
            )

    @staticmethod
    def _match(ref: RecordSetRef, ext: ExtentInfo) -> None:
        """Every field of a publication reference must be the extent's (D6)."""
        if ref == ext.ref:
            return
        for name in ("digest", "records", "payload_bytes", "tokens"):
            if getattr(ref, name) != getattr(ext.ref, name):
                raise InvalidReference(
                    f"{ref!r}: {name} is {getattr(ref, name)!r}, the publication's is "
                    f"{getattr(ext.ref, name)!r} (usage or digest of another publication); "
                    "the reference is edited or stale: use the reference publish returned")
        raise InvalidReference(
            f"{ref!r}: its manifest is ordinal {ext.ref.manifest.ordinal} of the extent, "
            f"not {ref.manifest.ordinal}; the reference is edited")

    def _read_extent(self, seg: SegmentRef, *, keep: bool = True
                     ) -> tuple[ExtentInfo, list[Record]]:
        """Read and check a whole extent; its records with ``bytes`` payloads.  Each
        payload is read straight into its own bytes object in chunks, hashed chunk by
        chunk while still in the CPU cache (one pass over memory, no second copy).  A
        mismatch whose bytes end in zero pages may be another client's partial view of
        fresh data: reread a bounded number of times; if it persists it is corruption.
        ``seg`` is checked by the caller (``_check_ref``)."""
        _check_extent_size(seg)
        if seg.size > _CHUNK:
            # Nothing large is allocated for a reference before its size is known right:
            # the authenticated header at its offset names exactly this size, and the file
            # holds its last byte (or the lag/final rules decided, without allocating).
            head = self._read_exact(seg.path, seg.offset, framing.HEADER_SIZE, frame=True)
            self._check_header(seg, head)
            self._read_exact(seg.path, seg.offset + seg.size - 1, 1)
        delay = self.backoff
        attempt = 0
        final: _Final | None = None
        while True:
            ok, ext, payloads, parts = self._read_and_hash(seg, keep=keep)
            if ok:
                assert ext is not None
                if not keep:
                    return ext, []
                return ext, [Record(i.record_id, p, i.codec, i.metadata, i.tokens or 0)
                             for i, p in zip(ext.local, payloads, strict=True)]
            if final is not None or not _zero_tail(parts, seg.offset, seg.offset + seg.size):
                break
            self._drop_fd(seg.path)
            final = self._finality(seg.path)
            if final is not None:
                continue  # no lag to wait for: one more pass through a fresh descriptor
            if attempt == self.retries:
                break
            self.clock.sleep(delay)
            delay = min(delay * 2, 1.0)
            attempt += 1
        raise CorruptData(f"{seg.path} offset {seg.offset}: extent body checksum mismatch")

    def _read_and_hash(self, seg: SegmentRef, *, keep: bool = True
                       ) -> tuple[bool, ExtentInfo | None, list[bytes],
                                  list[tuple[int, memoryview]]]:
        """One pass over an extent: (body checksum matched, its manifest, the payloads,
        the (file offset, bytes) parts read, for the zero-tail rule).  ``keep=False``
        checks the same bytes but returns no payloads: those beyond the first read go
        through one scratch buffer of ``_CHUNK`` bytes (memory bounded whatever their
        size), and each chunk leaves only its last nonzero byte in ``parts``."""
        # A small extent is read whole at once; of a large one only the start (header and
        # manifest, as a rule): its payloads are read straight into their bytes objects, so
        # what the first read holds of them is copied once more, and that must stay small.
        first = seg.size if seg.size <= _CHUNK else _FIRST_READ
        head = _alloc(first)
        self._read_exact(seg.path, seg.offset, first, into=head, frame=True,
                         frame_size=seg.size)
        header = self._check_header(seg, head)
        parts = [(seg.offset, head)]
        body = head[framing.HEADER_SIZE:]
        if body.nbytes < EXTENT_PREFIX.size:
            raise InvalidReference(f"{seg!r}: too small to be an extent")
        need = manifest_size(body)
        if need > header.body_length:
            return False, None, [], parts  # a manifest length that cannot be: damage or lag
        mbuf = body[:need] if need <= body.nbytes else self._read_exact(
            seg.path, seg.offset + framing.HEADER_SIZE, need)
        if need > body.nbytes:
            parts.append((seg.offset + framing.HEADER_SIZE, mbuf))
        hasher = xxhash.xxh3_128()
        hasher.update(mbuf)
        # The manifest of an extent checked before is not parsed again: the frame header
        # (checked against the reference) and the body hash below authenticate these same
        # bytes, so its cached parse describes them.
        cached = self._extents.get(seg)
        raw: dict[str, Any] | None = None
        if cached is not None and cached.payload_start == need:
            lengths = [i.length for i in cached.local]
        else:
            try:
                raw, _ = decode_manifest(mbuf, f"{seg.path} offset {seg.offset}")
            except CorruptData:
                if _zero_tail(parts, seg.offset, seg.offset + seg.size):
                    return False, None, [], parts  # not all of it visible yet
                raise
            lengths = [r[4] for r in raw["recs"]]
        if need + sum(lengths) != header.body_length:
            raise CorruptData(f"{seg.path} offset {seg.offset}: the manifest's records do not "
                              "fill the extent")
        payloads = []
        pos = seg.offset + framing.HEADER_SIZE + need  # file offset of the next payload
        head_end = seg.offset + first
        scratch = None if keep else _alloc(min(_CHUNK, max(lengths, default=0)))
        with self._reading():  # fd stays open for this loop
            fd = self._fd(seg.path)
            for n in lengths:
                if pos + n <= head_end:  # wholly in the first read: a small copy
                    piece = head[pos - seg.offset:pos + n - seg.offset]
                    hasher.update(piece)
                    if keep:
                        payloads.append(bytes(piece))
                    pos += n
                    continue
                if scratch is not None:
                    pos = self._hash_through(fd, seg, head, head_end, pos, n, hasher,
                                             scratch, parts)
                    continue
                data, view = fresh_bytes(n)
                k = max(0, head_end - pos)  # bytes of it already in the first read
                if k:
                    view[:k] = head[pos - seg.offset:]
                    hasher.update(view[:k])
                done = k
                while done < n:
                    m = min(_CHUNK, n - done)
                    chunk = view[done:done + m]
                    self._fill(fd, seg.path, chunk, pos + done)
                    hasher.update(chunk)
                    done += m
                parts.append((pos + k, view[k:]))
                payloads.append(data)
                pos += n
        if hasher.digest() != header.body_hash:
            return False, None, [], parts
        if raw is None:
            assert cached is not None
            return True, cached, payloads, parts
        return True, self._remember(seg, raw, need, header.body_length), payloads, parts

    def _fill(self, fd: int, path: str, chunk: memoryview, offset: int) -> None:
        """``chunk`` from ``offset`` of the pack through ``fd``; a short read or an error
        takes the slow path, which reopens and retries (visibility lag)."""
        try:
            complete = self.fs.readinto(fd, chunk, offset) == len(chunk)
        except OSError:
            complete = False
        if not complete:
            self._read_exact(path, offset, len(chunk), into=chunk)

    def _hash_through(self, fd: int, seg: SegmentRef, head: memoryview, head_end: int,
                      pos: int, n: int, hasher: Any, scratch: memoryview,
                      parts: list[tuple[int, memoryview]]) -> int:
        """Hash the payload of ``n`` bytes at file offset ``pos`` (its start may lie in
        ``head``, the first read) through ``scratch``, keeping nothing of it; returns the
        offset after it.  For the zero-tail rule each chunk adds its last nonzero byte
        to ``parts`` (``_zero_tail`` needs only the last nonzero position)."""
        k = max(0, head_end - pos)  # bytes of it already in the first read
        if k:
            hasher.update(head[pos - seg.offset:])
        done = k
        while done < n:
            m = min(len(scratch), n - done)
            chunk = scratch[:m]
            self._fill(fd, seg.path, chunk, pos + done)
            hasher.update(chunk)
            if chunk[m - 1]:  # the common case: no scan
                parts.append((pos + done + m - 1, memoryview(bytes(chunk[m - 1:m]))))
            else:
                rev: Any = np.frombuffer(chunk, dtype=np.uint8)[::-1]
                back = int(np.argmax(rev != 0))
                if rev[back]:
                    at = m - 1 - back
                    parts.append((pos + done + at, memoryview(bytes(chunk[at:at + 1]))))
            done += m
        return pos + n

    def _check_header(self, ref: SegmentRef | RecordSetRef, buf: Any) -> framing.FrameHeader:
        where = f"{ref.path} offset {ref.offset}"
        try:
            header = framing.decode_header(buf)
        except CorruptData as e:
            final = self._finality(ref.path)
            if final is not None and final.kind in ("complete", "sealed", "own") \
                    and ref.offset not in final.offsets:
                raise InvalidReference(
                    f"{ref!r}: no publication of sealed pack {ref.path} starts at offset "
                    f"{ref.offset} (an edited or fabricated reference)") from None
            # "Invalid segment header": straw-queue's phrase for this failure, which its
            # callers match; the rest names the place and the two possible causes.
            raise CorruptData(f"Invalid segment header at {where}: {e} (data damaged, or the "
                              "reference does not point at an extent)") from None
        if header.kind != framing.KIND_EXTENT or header.frame_length != ref.size:
            raise ExtentMismatch(
                f"{ref!r} does not match the frame at {where} (the frame there holds "
                f"{header.frame_length} bytes); the reference is edited or stale: use the "
                "reference publish returned")
        if header.body_hash.hex() != ref.checksum:
            raise InvalidReference(
                f"{ref!r}: checksum differs from the extent at {where} (stale or edited "
                "reference)"
            )
        return header

    def _remember(self, seg: SegmentRef, raw: dict[str, Any], payload_start: int,
                  body_length: int) -> ExtentInfo:
        where = f"{seg.path} offset {seg.offset}"
        if raw.get("run") != seg.run_id:
            raise InvalidReference(f"{seg!r}: the extent belongs to run {raw.get('run')!r}")
        local = []
        offsets = []
        pos = seg.offset + framing.HEADER_SIZE + payload_start
        for i, (rid, codec, meta, tokens, length, h) in enumerate(raw["recs"]):
            local.append(RecordInfo(rid, codec, parse_metadata(meta, f"{where} record {i}"),
                                    tokens, length, h.hex()))
            offsets.append(pos)
            pos += length
        if pos != seg.offset + framing.HEADER_SIZE + body_length:
            raise CorruptData(f"{where}: the manifest's records do not fill the extent")
        members = []
        for i, (p, o, s, c, ordinal, rid, codec, meta, tokens, length, h) in \
                enumerate(raw.get("mems", ())):
            try:
                mref = RecordRef(SegmentRef.at(seg.run_id, p, o, s, c.hex()), ordinal)
                mref.check()
            except (InvalidReference, UnsupportedSchema) as e:
                raise CorruptData(f"{where}: member {i} is not a valid reference: {e}") from None
            members.append((mref, RecordInfo(
                rid, codec, parse_metadata(meta, f"{where} member {i}"), tokens, length,
                h.hex())))
        deps = []
        for d in raw["deps"]:
            try:
                dep = ref_from_tuple(seg.run_id, [d[0], d[1], d[2], d[3].hex(), d[4].hex(),
                                                  *d[5:]])
                dep.check()
            except (InvalidReference, UnsupportedSchema) as e:
                raise CorruptData(f"{where}: dependency is not a valid reference: {e}") from None
            deps.append(dep)
        digest = raw["digest"].hex()
        ref = RecordSetRef(RecordRef(seg, len(local)), digest, len(members) or len(local),
                           raw.get("pb", 0), raw.get("tok", 0))
        if members:
            infos = tuple(info for _, info in members)
            rrefs = tuple(r for r, _ in members)
        else:
            infos = tuple(local)
            rrefs = tuple(RecordRef(seg, i) for i in range(len(local)))
        manifest = Manifest(ref, raw["sub"], infos, tuple(deps), rrefs)
        ext = ExtentInfo(seg, raw["v"], raw.get("api", "publish"), tuple(local),
                         tuple(offsets), tuple(members), ref, manifest, payload_start)
        with self._lock:
            self._extents[seg] = ext
            if len(self._extents) > 256:
                self._extents.popitem(last=False)
        return ext

    def _fd(self, path: str) -> int:
        self._check_process()  # every file access passes here (tensor reads included)
        if self.clock.now() >= self._next_sweep:
            self._sweep_unlinked()
        with self._lock:
            if self.closed:
                raise Closed("read session is closed; open a new one (store.read_session())")
            fd = self._fds.get(path)
            if fd is not None:
                self._fds.move_to_end(path)
                return fd
        try:
            fd = self.fs.open_beneath(self.real_root, path)
        except NotBeneath as e:
            raise InvalidReference(
                f"reference path {path!r} is not a pack of this pool: {e.strerror}. straw "
                "opens references only as regular files beneath the pool root, never through "
                "a symbolic link (it could lead outside the pool)") from None
        with self._lock:
            if self.closed:  # closed while this thread opened: nothing will close it
                close_quietly(self.fs, fd)
                raise Closed("read session is closed; open a new one (store.read_session())")
            cached = self._fds.get(path)
            if cached is not None:
                # another thread missed the cache for this pack at the same time and got
                # there first: use its descriptor, close ours (replacing it in the cache
                # would leak the other one, still in use by that thread)
                close_quietly(self.fs, fd)
                self._fds.move_to_end(path)
                return cached
            self._fds[path] = fd
            if len(self._fds) > _FD_CACHE:
                _, old = self._fds.popitem(last=False)
                self._retire(old)
        return fd

    def _retire(self, fd: int) -> None:
        """Close ``fd`` now if no read is in flight, else once the last one ends (caller
        holds ``self._lock``)."""
        if self._inflight:
            self._retired.append(fd)
        else:
            close_quietly(self.fs, fd)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """The scope of a read through cached descriptors: none is closed under it."""
        with self._lock:
            self._inflight += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1
                retired: list[int] = []
                if not self._inflight:
                    retired, self._retired = self._retired, []
            for fd in retired:
                close_quietly(self.fs, fd)

    def _sweep_unlinked(self) -> None:
        """Drop cached descriptors of packs that have no link any more (reclaimed by
        another client): they would keep the reclaimed bytes allocated."""
        self._next_sweep = self.clock.now() + _SWEEP_SECONDS
        gone = set()
        with self._reading():  # none of the listed descriptors is closed meanwhile
            with self._lock:
                cached = list(self._fds.items())
            for path, fd in cached:
                try:
                    if self.fs.fstat(fd).nlink > 0:
                        continue
                except OSError:
                    pass  # cannot tell (ESTALE, ...): reopening is cheap and safe
                gone.add(path)
        if gone:
            self._forget(gone)

    def _forget(self, paths: set[str]) -> None:
        """Close the cached descriptors of ``paths`` and forget their manifests."""
        with self._lock:
            for seg in [r for r in self._extents if r.path in paths]:
                del self._extents[seg]
        for path in paths:
            self._drop_fd(path)

    def _drop_fd(self, path: str) -> None:
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is not None:
                self._retire(fd)

    def _read_exact(self, path: str, offset: int, size: int, into: Any = None,
                    frame: bool = False, frame_size: int | None = None) -> memoryview:
        """Exactly ``size`` bytes at ``offset``.  Missing bytes (short file, zero header,
        file not visible) are retried a bounded number of times for visibility lag, then
        ``StorageUnavailable`` — unless the pack is final: then one more read through a
        fresh descriptor, and the error at once (``frame``: ``offset`` is where the
        reference says an extent starts; ``frame_size``: the extent's size by the
        reference, so that a file too short for it whose frame header is there and names
        another size is an edited reference at once, ``ExtentMismatch``, not lag)."""
        buf = _alloc(size) if into is None else memoryview(into).cast("B")
        if buf.nbytes != size:
            raise ValueError(f"buffer holds {buf.nbytes} bytes, {size} requested")
        check_pack_path(path, self.run_id)
        delay = self.backoff
        attempt = 0
        final: _Final | None = None
        while True:
            lag = self._try_read(path, offset, buf, frame, frame_size=frame_size,
                                 give_up=final is None and attempt == self.retries,
                                 refresh=attempt > 0 or final is not None)
            if lag is None:
                return buf
            self._drop_fd(path)
            if final is not None:
                raise self._final_error(final, path, offset, lag, frame)
            final = self._finality(path)
            if final is not None:
                continue  # no lag to wait for: one more read through a fresh descriptor
            if attempt == self.retries:
                break
            self.clock.sleep(delay)
            delay = min(delay * 2, 1.0)
            attempt += 1
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

    def _read_blocks(self, path: str, offset: int, buf: memoryview, block: int,
                     starts: Iterable[int] | None = None) -> Iterator[tuple[int, int]]:
        """Fill ``buf`` with the ``buf.nbytes`` bytes at ``offset``, ``block`` bytes at a
        time, yielding ``(lo, hi)`` as soon as ``buf[lo:hi]`` holds its bytes, so that
        the caller verifies each block while it is still in the CPU cache (the bytes are
        unchecked: the caller holds their checksums, tensor chunks).  Unlike
        ``_read_exact`` per block, the path check and descriptor lookup happen once per
        call (per 1 MiB block they cost several percent of a cache-warm read); a short or
        failed read of a block goes through ``_read_exact``, which retries visibility lag
        and applies the final-pack rules (D6).  ``starts``: the blocks to read, as offsets
        into ``buf`` (multiples of ``block``; default all of them, in order): threads
        sharing one ``buf`` pass one thread-safe iterator, each reading the blocks it
        takes from it."""
        check_pack_path(path, self.run_id)
        with self._reading():  # the descriptors stay open across the yields
            try:
                fd: int | None = self._fd(path)
            except OSError:
                fd = None  # not visible yet, say: _read_exact decides
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
                    self._read_exact(path, offset + lo, hi - lo, into=view)
                    fd = None  # _read_exact may have dropped the descriptor: look it up again
                    try:
                        fd = self._fd(path)
                    except OSError:
                        pass
                yield lo, hi

    def _try_read(self, path: str, offset: int, buf: memoryview, frame: bool, *,
                  give_up: bool, refresh: bool = False,
                  frame_size: int | None = None) -> _Lag | None:
        """One attempt: None when ``buf`` holds the bytes, else what is missing.
        ``refresh`` (a retry): the range's cached pages are dropped first, through the
        freshly opened descriptor, since a reopen alone may keep them
        (``Filesystem.drop_cached``)."""
        size = buf.nbytes
        try:
            with self._reading():
                fd = self._fd(path)
                if refresh:
                    self.fs.drop_cached(fd, offset, size)
                n = self.fs.readinto(fd, buf, offset)
        except FileNotFoundError:
            return _Lag("missing", "the file does not exist")
        except OSError as e:
            raise StorageUnavailable(f"reading {path}: {e}") from e
        if n < size:
            if frame_size is not None and n >= framing.HEADER_SIZE:
                _refuse_another_frame(path, offset, buf[:framing.HEADER_SIZE], frame_size)
            return _Lag("short", f"the file holds {offset + n} bytes, the reference needs "
                                 f"{offset + size}")
        # Only a frame start is known to be non-zero: a payload may be zeros.
        if frame and buf[:framing.HEADER_SIZE] == _ZERO_HEADER:
            return _Lag("zeros", "the extent still reads as zeros")
        if frame and _partial_header(buf[:framing.HEADER_SIZE], offset) and not give_up:
            # Bytes present that stay wrong through every retry are not lag: once we give
            # up, the caller's header check reports CorruptData (D6).
            return _Lag("partial", "the frame header is only partly visible")
        return None

    def _finality(self, path: str) -> _Final | None:
        """Whether the pack is final (asked only after a read failed): its file ends in a
        valid SEAL trailer, or the catalog knows it sealed, reclaimed, or not at all."""
        with self._reading():
            try:
                fd: int | None = self._fd(path)
            except OSError:  # missing, or not readable now: the catalog may tell
                fd = None
            if fd is not None:
                try:
                    entries = read_sealed_index(self.fs, fd, self.fs.fstat(fd).size)
                except (OSError, StrawError, ValueError, TypeError):
                    entries = None  # unreadable or damaged seal: not final *this* way
                if entries is not None:
                    return _Final("complete", frozenset(e.offset for e in entries))
        status = self.pack_status(path) if self.pack_status is not None else None
        if status is None:
            return None
        if status.state == "tombstoned":
            final = _Final("reclaimed")
        elif status.state in ("sealed", "own"):
            final = _Final(status.state, status.offsets)
        elif status.state == "unknown" and fd is None:
            final = _Final("unknown")
        else:
            return None
        # what we read next goes through a descriptor opened after the catalog said so
        self._drop_fd(path)
        return final

    @staticmethod
    def _final_error(final: _Final, path: str, offset: int, lag: _Lag,
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
