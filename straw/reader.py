"""Checked reads of publications: ``ReadSession``.

Every read authenticates what it returns (D6): ``read``/``validate`` check the whole
extent against the checksum the reference names; ``manifest`` checks the manifest;
``read_record`` checks the manifest and that one record.  A mismatch of bytes that are
present is ``CorruptData`` at once, never retried.  Bytes that are *missing* (the file is
shorter than the extent, or still reads as zeros, wholly or on one side of a page boundary,
or the file is not visible yet) may be another client's visibility lag: the read reopens
the file and retries a bounded number of times, then raises ``StorageUnavailable`` — except
a frame header zeroed on one side of a page boundary, whose bytes are present: if it
stays damaged through every retry it is ``CorruptData``.

When the pack is *final* there is no lag to wait for, so nothing is retried: a pack
whose file ends in a valid SEAL trailer, or that the catalog knows as sealed or
reclaimed, or that the catalog never heard of (a pack is known to the catalog before its
file exists) — asked only after a read failed (the store's ``pack_status`` callback),
then confirmed by one more read through a freshly opened descriptor (close-to-open).  A
final pack fails at once: ``InvalidReference`` for a reference that cannot be right (no
publication starts at its offset, its size runs past an intact pack, its pack was
reclaimed or never written), ``CorruptData`` for damage (a sealed pack truncated or
zeroed below a published extent, deleted outside straw, a checksum mismatch).

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
every read raises ``ForkedProcess`` before touching a file or taking a lock, ``close()``
only closes the child's copies of the cached descriptors, and the fork itself already
closed them.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from . import framing
from .clock import Clock
from .errors import CorruptData, InvalidReference, StorageUnavailable, StrawError
from .fs import Filesystem, NotBeneath
from .pack import EXTENT_PREFIX, decode_manifest, manifest_size, read_sealed_index
from .process import ProcessBound, close_quietly
from .refs import (
    Manifest,
    Record,
    RecordInfo,
    RecordRef,
    RecordSetRef,
    check_pack_path,
    parse_metadata,
)

_FIRST_READ = 64 * 1024
_CHUNK = 1 << 19  # read-and-hash granularity of whole-extent reads
_PAGE = 4096  # granularity at which another client's view of fresh data can be partial
_FD_CACHE = 64
_ZERO_HEADER = bytes(framing.HEADER_SIZE)
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


def _alloc(size: int) -> memoryview:
    """An uninitialised byte buffer: a read fills it, so zero-filling would be wasted."""
    arr: Any = np.empty(size, dtype=np.uint8)
    return memoryview(arr).cast("B")


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


@dataclass(frozen=True)
class PackStatus:
    """What the pool's catalog knows of a pack: ``state`` is ``"unknown"`` (never
    opened: a pack is known to the catalog before its file is created), ``"open"``,
    ``"sealed"`` or ``"tombstoned"`` (reclaimed); ``offsets`` are the extents of a sealed
    pack."""

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
    (tombstoned), ``unknown`` (the catalog never heard of it and the file is missing)."""

    kind: str
    offsets: frozenset[int] = frozenset()


class ReadSession(ProcessBound):
    """Checked reads with a cache of open packs and authenticated manifests."""

    _process_state = "its open pack files"

    def __init__(self, fs: Filesystem, root: str, run_id: str, clock: Clock, *,
                 visibility_retries: int = 8, visibility_backoff: float = 0.05,
                 pack_status: PackStatusFn | None = None) -> None:
        self._bind_process()
        self.fs = fs
        self.root = root
        # resolved once: the operator's root may be a symlink, nothing beneath it may
        self.real_root = fs.realpath(root)
        self.pack_status = pack_status
        self.run_id = run_id
        self.clock = clock
        self.retries = visibility_retries
        self.backoff = visibility_backoff
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._manifests: OrderedDict[RecordSetRef, Manifest] = OrderedDict()
        self._lock = threading.Lock()
        self.closed = False
        self._next_sweep = clock.now() + _SWEEP_SECONDS
        with _SESSIONS_LOCK:
            _SESSIONS.add(self)

    def _process_subject(self) -> str:
        return f"read session of run {self.run_id!r} at {self.root}"

    def _drop_inherited(self) -> None:
        fds = list(self._fds.values())
        self._fds.clear()
        self._manifests.clear()
        for fd in fds:
            close_quietly(self.fs, fd)

    # --- context manager ------------------------------------------------------------
    def __enter__(self) -> ReadSession:
        self._check_process()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the cached files.  In a forked child: only the child's copies, taking no
        lock (``straw.process``)."""
        if self._in_forked_child():
            self._drop_inherited()
            self.closed = True
            return
        with self._lock:
            for fd in self._fds.values():
                try:
                    self.fs.close(fd)
                except OSError:
                    pass
            self._fds.clear()
            self._manifests.clear()
            self.closed = True
        with _SESSIONS_LOCK:
            _SESSIONS.discard(self)

    # --- public reads -----------------------------------------------------------------
    def read(self, ref: RecordSetRef) -> list[Record]:
        """The publication's records in order, payloads as read-only memoryviews."""
        self._check_process()
        manifest, body, payload_start = self._read_extent(ref)
        out = []
        pos = payload_start
        for info in manifest.records:
            out.append(Record(info.record_id, body[pos:pos + info.length].toreadonly(),
                              info.codec, info.metadata, info.tokens))
            pos += info.length
        return out

    def validate(self, ref: RecordSetRef) -> tuple[RecordRef, ...]:
        """Check the whole extent; returns the checked references of its records."""
        self._check_process()
        manifest, _, _ = self._read_extent(ref)
        return manifest.record_refs

    def manifest(self, ref: RecordSetRef) -> Manifest:
        self._check_process()
        self._check_ref(ref)
        cached = self._manifests.get(ref)
        if cached is not None:
            return cached
        head = self._read_exact(ref.path, ref.offset, min(ref.size, _FIRST_READ), frame=True)
        header = self._check_header(ref, head)
        body_head = memoryview(head)[framing.HEADER_SIZE:]
        if body_head.nbytes < EXTENT_PREFIX.size:
            raise InvalidReference(f"{ref!r}: too small to be an extent")
        need = manifest_size(body_head)
        if need > header.body_length:
            raise CorruptData(f"{ref.path} offset {ref.offset}: manifest longer than extent")
        if need > body_head.nbytes:
            body_head = memoryview(self._read_exact(
                ref.path, ref.offset + framing.HEADER_SIZE, need))
        raw, payload_start = decode_manifest(body_head, f"{ref.path} offset {ref.offset}")
        return self._remember(ref, raw, payload_start)

    def check_published(self, ref: RecordSetRef) -> None:
        """``InvalidReference`` unless ``ref`` names a publication: the frame at its offset
        is an extent of its size and checksum.  One small read (none when its manifest was
        checked already); what is retained or depended on must exist (D4)."""
        self._check_process()
        self._check_ref(ref)
        if ref in self._manifests:
            return
        if ref.size < framing.HEADER_SIZE:
            raise InvalidReference(f"{ref!r}: too small to be an extent")
        head = self._read_exact(ref.path, ref.offset, framing.HEADER_SIZE, frame=True)
        self._check_header(ref, head)

    def read_record(self, record_ref: RecordRef) -> Record:
        """One record, reading and checking only the manifest and that record."""
        self._check_process()
        info = self._record_info(record_ref)
        data = self._read_exact(record_ref.record_set.path, record_ref.offset,
                                record_ref.length)
        if framing.hash_buffers([data]).hex() != record_ref.checksum:
            raise CorruptData(
                f"record {record_ref.record_id!r} at {record_ref.record_set.path} offset "
                f"{record_ref.offset}: payload checksum mismatch"
            )
        return Record(info.record_id, memoryview(data).toreadonly(), info.codec,
                      info.metadata, info.tokens)

    def read_range(self, record_ref: RecordRef, start: int, stop: int,
                   into: Any = None) -> memoryview:
        """Unchecked bytes [start, stop) of a record, read into ``into`` if given.  The
        caller verifies them against its own finer-grained checksums (tensor chunks)."""
        self._check_process()
        self._record_info(record_ref)
        if not 0 <= start <= stop <= record_ref.length:
            raise ValueError(f"range [{start}, {stop}) outside record of {record_ref.length}")
        return self._read_exact(record_ref.record_set.path, record_ref.offset + start,
                                stop - start, into=into)

    # --- internals --------------------------------------------------------------------
    def _record_info(self, record_ref: RecordRef) -> RecordInfo:
        if not isinstance(record_ref, RecordRef):
            raise TypeError(f"expected a RecordRef, got {type(record_ref).__name__}")
        manifest = self.manifest(record_ref.record_set)
        i = record_ref.index
        if not (0 <= i < len(manifest.record_refs)) or manifest.record_refs[i] != record_ref:
            raise InvalidReference(
                f"{record_ref!r} does not match record {i} of its publication's manifest"
            )
        return manifest.records[i]

    def _check_ref(self, ref: RecordSetRef) -> None:
        if not isinstance(ref, RecordSetRef):
            raise TypeError(f"expected a RecordSetRef, got {type(ref).__name__}")
        ref.check()
        if ref.run_id != self.run_id:
            raise InvalidReference(
                f"{ref!r} belongs to run {ref.run_id!r}, this store is run {self.run_id!r}"
            )

    def _read_extent(self, ref: RecordSetRef) -> tuple[Manifest, memoryview, int]:
        """Read and check a whole extent.  The body is read in chunks into one
        uninitialised buffer and hashed chunk by chunk while it is still in the CPU cache
        (one pass over memory instead of two).  A mismatch whose bytes end in zero pages
        may be another client's partial view of fresh data: reread a bounded number of
        times; if the same mismatch persists it is corruption."""
        self._check_ref(ref)
        if ref.size < framing.HEADER_SIZE:
            raise InvalidReference(f"{ref!r}: too small to be an extent")
        if ref.size > _CHUNK:
            # Nothing large is allocated for a reference before its size is known right:
            # the authenticated header at its offset names exactly this size, and the file
            # holds its last byte (or the lag/final rules decided, without allocating).
            head = self._read_exact(ref.path, ref.offset, framing.HEADER_SIZE, frame=True)
            self._check_header(ref, head)
            self._read_exact(ref.path, ref.offset + ref.size - 1, 1)
        buf = _alloc(ref.size)
        delay = self.backoff
        attempt = 0
        final: _Final | None = None
        while True:
            if self._read_and_hash(ref, buf):
                body = buf[framing.HEADER_SIZE:]
                raw, payload_start = decode_manifest(body, f"{ref.path} offset {ref.offset}")
                return self._remember(ref, raw, payload_start), body, payload_start
            if final is not None or not _zero_page_tail(buf, ref.offset):
                break
            self._drop_fd(ref.path)
            final = self._finality(ref.path)
            if final is not None:
                continue  # no lag to wait for: one more pass through a fresh descriptor
            if attempt == self.retries:
                break
            self.clock.sleep(delay)
            delay = min(delay * 2, 1.0)
            attempt += 1
        raise CorruptData(f"{ref.path} offset {ref.offset}: extent body checksum mismatch")

    def _read_and_hash(self, ref: RecordSetRef, buf: memoryview) -> bool:
        first = min(ref.size, _CHUNK)
        self._read_exact(ref.path, ref.offset, first, into=buf[:first], frame=True)
        header = self._check_header(ref, buf)
        hasher = xxhash.xxh3_128()
        hasher.update(buf[framing.HEADER_SIZE:first])
        pos = first
        fd = self._fd(ref.path)
        while pos < ref.size:
            n = min(_CHUNK, ref.size - pos)
            chunk = buf[pos:pos + n]
            try:
                complete = self.fs.readinto(fd, chunk, ref.offset + pos) == n
            except OSError:
                complete = False
            if not complete:  # the slow path reopens and retries (visibility lag)
                self._read_exact(ref.path, ref.offset + pos, n, into=chunk)
            hasher.update(chunk)
            pos += n
        return hasher.digest() == header.body_hash

    def _check_header(self, ref: RecordSetRef, buf: Any) -> framing.FrameHeader:
        where = f"{ref.path} offset {ref.offset}"
        try:
            header = framing.decode_header(buf)
        except CorruptData as e:
            final = self._finality(ref.path)
            if final is not None and final.kind in ("complete", "sealed") \
                    and ref.offset not in final.offsets:
                raise InvalidReference(
                    f"{ref!r}: no publication of sealed pack {ref.path} starts at offset "
                    f"{ref.offset} (an edited or fabricated reference)") from None
            raise CorruptData(f"{where}: {e} (data damaged, or the reference does not point "
                              "at an extent)") from None
        if header.kind != framing.KIND_EXTENT or header.frame_length != ref.size:
            raise InvalidReference(f"{ref!r} does not match the frame at {where}")
        if header.body_hash.hex() != ref.checksum:
            raise InvalidReference(
                f"{ref!r}: checksum differs from the extent at {where} (stale or edited "
                "reference)"
            )
        return header

    def _remember(self, ref: RecordSetRef, raw: dict[str, Any], payload_start: int
                  ) -> Manifest:
        if raw.get("run") != ref.run_id:
            raise InvalidReference(f"{ref!r}: the extent belongs to run {raw.get('run')!r}")
        digest = raw.get("digest")
        if not isinstance(digest, bytes) or digest.hex() != ref.digest:
            raise InvalidReference(
                f"{ref!r}: digest differs from the publication's "
                f"({digest.hex() if isinstance(digest, bytes) else digest!r}); the reference "
                "is edited or stale: use the reference publish returned")
        if len(raw["recs"]) != ref.records:
            raise InvalidReference(
                f"{ref!r}: records is {ref.records}, the publication holds "
                f"{len(raw['recs'])}; the reference is edited or stale: use the reference "
                "publish returned")

        infos = []
        rrefs = []
        pos = ref.offset + framing.HEADER_SIZE + payload_start
        for i, (rid, codec, meta, tokens, length, h) in enumerate(raw["recs"]):
            meta = parse_metadata(meta, f"{ref.path} offset {ref.offset} record {i}")
            infos.append(RecordInfo(rid, codec, meta, tokens, length, h.hex()))
            rrefs.append(RecordRef(ref, rid, i, pos, length, h.hex()))
            pos += length
        deps = tuple(
            RecordSetRef(ref.run_id, p, o, s, c.hex(), d.hex(), n)
            for p, o, s, c, d, n in raw["deps"]
        )
        m = Manifest(ref, raw["sub"], tuple(infos), deps, tuple(rrefs))
        with self._lock:
            self._manifests[ref] = m
            if len(self._manifests) > 256:
                self._manifests.popitem(last=False)
        return m

    def _fd(self, path: str) -> int:
        self._check_process()  # every file access passes here (tensor reads included)
        if self.clock.now() >= self._next_sweep:
            self._sweep_unlinked()
        with self._lock:
            if self.closed:
                raise ValueError("read session is closed")
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
            self._fds[path] = fd
            if len(self._fds) > _FD_CACHE:
                _, old = self._fds.popitem(last=False)
                self.fs.close(old)
        return fd

    def _sweep_unlinked(self) -> None:
        """Drop cached descriptors of packs that have no link any more (reclaimed by
        another client): they would keep the reclaimed bytes allocated."""
        self._next_sweep = self.clock.now() + _SWEEP_SECONDS
        with self._lock:
            cached = list(self._fds.items())
        gone = set()
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
            for ref in [r for r in self._manifests if r.path in paths]:
                del self._manifests[ref]
        for path in paths:
            self._drop_fd(path)

    def _drop_fd(self, path: str) -> None:
        with self._lock:
            fd = self._fds.pop(path, None)
        if fd is not None:
            try:
                self.fs.close(fd)
            except OSError:
                pass

    def _read_exact(self, path: str, offset: int, size: int, into: Any = None,
                    frame: bool = False) -> memoryview:
        """Exactly ``size`` bytes at ``offset``.  Missing bytes (short file, zero header,
        file not visible) are retried a bounded number of times for visibility lag, then
        ``StorageUnavailable`` — unless the pack is final: then one more read through a
        fresh descriptor, and the error at once (``frame``: ``offset`` is where the
        reference says an extent starts)."""
        buf = _alloc(size) if into is None else memoryview(into).cast("B")
        if buf.nbytes != size:
            raise ValueError(f"buffer holds {buf.nbytes} bytes, {size} requested")
        check_pack_path(path, self.run_id)
        delay = self.backoff
        attempt = 0
        final: _Final | None = None
        while True:
            lag = self._try_read(path, offset, buf, frame,
                                 give_up=final is None and attempt == self.retries)
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

    def _read_blocks(self, path: str, offset: int, buf: memoryview, block: int
                     ) -> Iterator[tuple[int, int]]:
        """Fill ``buf`` with the ``buf.nbytes`` bytes at ``offset``, ``block`` bytes at a
        time, yielding ``(lo, hi)`` as soon as ``buf[lo:hi]`` holds its bytes, so that
        the caller verifies each block while it is still in the CPU cache (the bytes are
        unchecked: the caller holds their checksums, tensor chunks).  Unlike
        ``_read_exact`` per block, the path check and descriptor lookup happen once per
        call (per 1 MiB block they cost several percent of a cache-warm read); a short or
        failed read of a block goes through ``_read_exact``, which retries visibility lag
        and applies the final-pack rules (D6)."""
        check_pack_path(path, self.run_id)
        try:
            fd: int | None = self._fd(path)
        except OSError:
            fd = None  # not visible yet, say: _read_exact decides
        for lo in range(0, buf.nbytes, block):
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
                  give_up: bool) -> _Lag | None:
        """One attempt: None when ``buf`` holds the bytes, else what is missing."""
        size = buf.nbytes
        try:
            fd = self._fd(path)
            n = self.fs.readinto(fd, buf, offset)
        except FileNotFoundError:
            return _Lag("missing", "the file does not exist")
        except OSError as e:
            raise StorageUnavailable(f"reading {path}: {e}") from e
        if n < size:
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
        elif status.state == "sealed":
            final = _Final("sealed", status.offsets)
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
        if lag.kind == "missing":
            return CorruptData(
                f"sealed pack {path} is missing: it was deleted outside straw (garbage "
                "collection tombstones a pack first). Restore it from a replica")
        if frame and (offset not in final.offsets
                      or (lag.kind == "short" and final.kind == "complete")):
            return InvalidReference(
                f"{where}: no publication of sealed pack {path} fits there ({lag.detail}); "
                "the reference is edited or stale: use the reference publish returned")
        return CorruptData(
            f"{where}: {lag.detail}, but pack {path} is sealed (its size is final, so this "
            "is damage, not visibility lag); restore it from a replica")
