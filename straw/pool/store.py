"""``SharedFilesystemStore``: publish immutable publications into packs; read them back
checked, from any client of the pool.

Pool layout::

    <root>/ONLINE_GC             present once a store opened the pool with online_gc=True
    <root>/POOL                  format marker (UnsupportedSchema if newer) and the
                                 pool's id (``pool_id``, written once by its creator)
    <root>/runs/<run_id>/...     writers, their incarnations and packs (straw.writer),
                                 queues (straw.coordinator)
    <root>/CATALOG               owners, packs, tombstones of every run (straw.catalog)

Several runs may share one root and are isolated: owners (and pins, and queues) belong to
a run, so a store sees and changes only its own run's owners, and its ``collect_garbage``
reclaims only its own run's packs; reachability is pool-wide, so no run reclaims what
another retains.

The store validates every input before any byte is written (``TypeError``/``ValueError``
naming the field; counts and sizes are ints within 64 bits, bools refused, see
``straw.checks``), lays publications out as
extents (``straw.pack``), writes a ``publish_many`` batch with one ``writev`` and one data
sync, and returns references only after that sync (D1).  Submission ids are the
idempotency ids (D7): a retry with the same id and content returns the original
references, different content raises ``IdempotencyConflict``; the index survives writer
restarts (``straw.writer``).  Reads go through ``straw.reader.ReadSession`` (D6); after a
failed read it may ask the catalog whether the pack is final (``_pack_status``).  A
reference that is retained, pinned or depended on must name a publication of the pool
(``check_published``: one small read of its frame header), else ``InvalidReference``
before anything is written.

Writing is lazy: a store that only reads takes no writer lock and creates nothing.
Publishing is serialised per store (one write in flight); use one store per writer
thread or process, each with its own ``writer_id``.

Fork safety (``straw.process``).  A store belongs to the process that opened it.  In a
forked child every method raises ``ForkedProcess`` before it takes a lock or touches a
file: the writer lock, the open pack and the catalog position are the parent's, and
using them would overwrite the parent's publications and corrupt the catalog.
``close()`` in a child raises ``ForkedProcess`` too and ``__exit__`` there does not raise;
neither touches anything of the parent's (no seal, no unlock, no write); the child's copies
of the descriptors are closed already at the fork.  A store opened in the child (with its
own ``writer_id`` if it publishes) works normally.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from .. import framing, tracing
from ..backend import FilesystemBackend
from ..catalog import Catalog, Extent
from ..checks import check_count, check_seconds, check_u64, check_usage_total, short_repr
from ..clock import Clock, SystemClock
from ..errors import (
    Closed,
    CorruptData,
    IdempotencyConflict,
    InvalidRecordId,
    InvalidReference,
    LocalDependencyOrder,
    ResourceLimitExceeded,
    StorageUnavailable,
    StrawError,
    UnknownCodec,
    UnsupportedSchema,
    WriterBusy,
)
from ..fs import Filesystem, PosixFS
from ..process import ProcessBound
from ..reader import PackStatus, ReadSession, drop_reclaimed, envelope_dict
from . import hold_owners, role_lock
from .pack import EXTENT_PREFIX, encode_extent, storage_error
from .recovery import incarnations, recover_writer, ref_from_entry, seal_dead_writers
from .refs import (
    NAME_RE,
    PACK_SUFFIXES,
    Manifest,
    Publication,
    Record,
    RecordInfo,
    RecordRef,
    RecordSetRef,
    SegmentRef,
    canonical_metadata,
    check_name,
    payload_view,
)
from .writer import RETIRED, Submission, WriterIncarnation

log = logging.getLogger("straw")

BUILTIN_CODECS = ("bytes.v1", "json.v1", "tensor.v1", "sample.v1")
# straw-queue's manifest codecs, which every straw-queue store accepts for callers' own
# records too: labels here (straw never interprets a stored record by them; our manifests
# are extents, and a manifest ordinal reads back labelled "record-set.v2")
MANIFEST_CODECS = ("record-set.v1", "record-set.v2")
POOL_FORMAT = 1
DEFAULT_SEGMENT_TARGET = 256 * 1024 * 1024
DEFAULT_RESERVE = 64 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = 16 * 1024**3  # straw-queue's default; enforced on request
DEFAULT_MAX_BUFFER_BYTES = 512 * 1024**2
# straw-queue 0.1.6's records per segment (payload records plus one manifest per
# publication), which its callers batch ``publish_many`` by.  Neither it nor straw refuses
# a larger call (straw's extents have no record-count bound); the constant is the batching
# hint, with straw-queue's value, so that callers sizing batches by it behave the same.
MAX_RECORDS = 10_000
_PUBLISH_SECONDS_KEPT = 1024

_API_CALLS = {"publish": "publish/publish_many", "records": "write_records",
              "record_set": "record_set"}
HOLD_API = "hold"  # the api part of the owner of an explicit ``hold`` (straw.pool.hold_owners)


def _check_usage(normalized: list[_Pub]) -> None:
    """Each publication's payload bytes and tokens, its dependencies' included
    transitively (what its manifest and reference carry), fit in 64 unsigned bits:
    ``ValueError`` ("overflow") before anything is written, never a wrapped count (a
    record's tokens may each be up to 2**64-1, as in straw-queue)."""
    totals: list[tuple[int, int]] = []
    for i, n in enumerate(normalized):
        deps = [totals[d] if isinstance(d, int) else (d.payload_bytes, d.tokens)
                for d in n.deps]
        payload_bytes = n.pub_bytes + sum(b for b, _ in deps)
        tokens = n.pub_tokens + sum(t for _, t in deps)
        check_usage_total(f"publications[{i}] payload bytes (dependencies included)",
                          payload_bytes)
        check_usage_total(f"publications[{i}] tokens (dependencies included)", tokens)
        totals.append((payload_bytes, tokens))


def _ident_tokens(tokens: int) -> int | None:
    """A record's token count as the digest hashes it: 0 as None, the previous straw's
    "no count", so that the digest of a publication without dependencies is the one the
    previous straw computed (idempotent retries across an upgrade)."""
    return tokens or None


@dataclass
class _Pub:
    """One validated publication: its records (id, codec, metadata JSON, tokens, payload
    view, payload hash), dependencies (references or indices of earlier publications of
    the call), logical digest, the records of a ``record_set`` (manifest rows, and the
    references with their entries), the bytes it writes itself, and its payload bytes and
    tokens without its dependencies."""

    recs: list[tuple[str, str, str, int, memoryview, bytes]]
    deps: list[Any]
    digest: bytes
    member_rows: list[list[Any]]
    members: list[tuple[RecordRef, RecordInfo]]
    own_bytes: int
    pub_bytes: int
    pub_tokens: int


# created in the pool root by a store opened with online_gc=True (``_mark_online_gc``)
ONLINE_GC_MARKER = "ONLINE_GC"


def _marker_body(info: Mapping[str, Any]) -> bytes:
    """The pool marker: ``info`` (an older marker's fields, kept) with the format, version
    and a new pool id."""
    body = {**info, "format": "straw-pool", "version": POOL_FORMAT,
            "pool_id": uuid.uuid4().hex}
    return json.dumps(body).encode()


def _parse_marker(data: bytes) -> dict[str, Any] | None:
    """The marker's fields, or None when it is empty, zeroed or torn."""
    try:
        info = json.loads(data)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _check_marker(marker: str, root: str, info: Mapping[str, Any]) -> None:
    if info.get("format") != "straw-pool" or not isinstance(info.get("version"), int):
        raise UnsupportedSchema(f"{marker} is not a straw pool marker: {dict(info)!r}")
    if info["version"] > POOL_FORMAT:
        raise UnsupportedSchema(
            f"pool {root} has format version {info['version']}; this straw reads "
            f"up to {POOL_FORMAT}. Upgrade straw"
        )
    pool_id = info.get("pool_id")
    if pool_id is not None and (not isinstance(pool_id, str) or not pool_id):
        raise UnsupportedSchema(f"{marker}: pool_id {pool_id!r} is not a pool id")


class SharedFilesystemStore(ProcessBound):
    """A pool client: publishes as writer ``writer_id`` and reads anything of its run.

    Parameters: ``root`` (pool directory, created if missing), ``run_id`` (the job),
    ``codecs`` (codec names in addition to the built-ins ``bytes.v1``, ``json.v1``,
    ``tensor.v1``, ``sample.v1``), ``segment_target_bytes`` (pack rotation target, not a
    hard limit), ``writer_id`` (stable name of this writer: submission ids are scoped to
    it and survive its restarts; concurrent writers need distinct ids), ``fs`` (the
    ``Filesystem``, default ``PosixFS``), ``clock``, ``reserve_bytes`` (the largest step of
    space reserved ahead in packs: a new pack's step starts at 1 MiB and doubles with the
    pack, so a writer killed early leaves little behind; less on a nearly full disk; 0
    disables),
    ``visibility_retries``/``visibility_backoff`` (bounded retries when another client's
    data is not visible yet), ``backend`` (a ``straw.backend.FilesystemBackend``: the
    storage profile and deployment declaration, verified against the live mount before
    anything is written), ``max_record_bytes`` (a record's largest payload: carried, and
    enforced (``ResourceLimitExceeded``) only with ``enforce_limits=True``, since
    straw-queue 0.1.6 documents it as capping nothing), ``max_buffer_bytes`` (accepted;
    straw copies no payload)."""

    _process_state = "its writer lock, open pack, catalog position and open files"

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        backend: FilesystemBackend | None = None,
        codecs: Iterable[str] = ("bytes.v1", "json.v1"),
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
        segment_target_bytes: int = DEFAULT_SEGMENT_TARGET,
        online_gc: bool = False,
        writer_id: str | None = None,
        fs: Filesystem | None = None,
        clock: Clock | None = None,
        reserve_bytes: int = DEFAULT_RESERVE,
        visibility_retries: int = 8,
        visibility_backoff: float = 0.05,
        enforce_limits: bool = False,
    ) -> None:
        self._bind_process()
        self.run_id = check_name("run_id", run_id)
        # A unique writer per store unless named: two stores of one process must not
        # share a writer (its lock would refuse the second).  A named writer is the one
        # that restarts: its submission ids survive its incarnations (D7).
        self._writer_id = check_name("writer_id", writer_id) if writer_id is not None \
            else uuid.uuid4().hex
        check_count("segment_target_bytes", segment_target_bytes)
        check_count("max_record_bytes", max_record_bytes, minimum=1)
        check_count("max_buffer_bytes", max_buffer_bytes, minimum=1)
        check_count("reserve_bytes", reserve_bytes)
        check_count("visibility_retries", visibility_retries)
        check_seconds("visibility_backoff", visibility_backoff, positive=False)
        if not isinstance(online_gc, bool):
            raise TypeError(f"online_gc must be a bool, got {type(online_gc).__name__}")
        if not isinstance(enforce_limits, bool):
            raise TypeError(f"enforce_limits must be a bool, got {type(enforce_limits).__name__}")
        if isinstance(codecs, str):
            raise TypeError("codecs must be an iterable of codec names, not one str")
        extra = set()
        for c in codecs:
            extra.add(check_name("codec name", c))
        self.codecs = frozenset(BUILTIN_CODECS) | frozenset(MANIFEST_CODECS) | extra
        self.fs = fs or PosixFS()
        self.clock = clock or SystemClock()
        self.root = os.path.abspath(os.fspath(root))
        self.segment_target_bytes = segment_target_bytes
        self.max_record_bytes = max_record_bytes
        # straw-queue 0.1.6 documents max_record_bytes as a compatibility argument that caps
        # nothing, and its callers pass small values relying on that: the cap is enforced
        # only for a store opened with enforce_limits=True (ours, an addition).
        self.enforce_limits = enforce_limits
        # straw copies no payload (writev of the caller's buffers), so no copy scratch
        # exists to bound: accepted for straw-queue callers, reported by ``metrics``.
        self.max_buffer_bytes = max_buffer_bytes
        # Retention and collection always work (owners are durable in the catalog);
        # online_gc only marks the pool as managed by online GC (ONLINE_GC, below)
        self.online_gc = online_gc
        self.reserve_bytes = reserve_bytes
        self._visibility = (visibility_retries, visibility_backoff)
        self.backend = self._check_backend(backend)
        self.fs = self.backend.filesystem(self.fs)  # its sync hook and count (fault, metrics)
        self._init_pool()
        if online_gc:
            self._mark_online_gc()
        self._session = ReadSession(self.fs, self.root, self.run_id, self.clock,
                                    visibility_retries=visibility_retries,
                                    visibility_backoff=visibility_backoff,
                                    pack_status=self._pack_status, pool_id=self.pool_id,
                                    backend=self.backend)
        self._writer: WriterIncarnation | None = None
        # this writer id's preparation holds (``straw.pool.hold_owners``): its own failed requests'
        # and its predecessors' (loaded when the writer starts)
        self._holds: set[str] = set()
        self._write_lock = threading.Lock()
        self.catalog = Catalog(self.fs, self.root, self.run_id)  # owners belong to the run
        self._metrics: dict[str, Any] = {"payload_bytes": 0, "records": 0, "segments": 0,
                                         "publish_seconds": []}
        self.closed = False

    @property
    def writer_id(self) -> str:
        """This store's writer: its own unique id unless ``writer_id=`` named one.  Record
        it with your request identity to ask ``publication_receipt`` after a lost reply,
        or to ``retire_writer`` it once its process is gone."""
        self._check_process()
        return self._writer_id

    @property
    def metrics(self) -> dict[str, Any]:
        """What this store published: ``payload_bytes``, ``records``, ``segments``
        (extents written), ``publish_seconds`` (the latest publications' durations) and
        ``buffer_bytes`` (copy scratch in use: always 0, straw copies no payload)."""
        self._check_process()
        m = dict(self._metrics)
        m["publish_seconds"] = list(m["publish_seconds"])
        m["buffer_bytes"] = 0
        return m

    # --- pool ---------------------------------------------------------------------------
    def _mark_online_gc(self) -> None:
        """A pool a store opened with ``online_gc=True`` is managed by online GC, as
        straw-queue's is once its shared catalog exists: the offline tools of
        ``straw.inspect`` refuse it from then on (its stores collect their garbage
        themselves).  The marker is written once, durably, and never removed."""
        path = os.path.join(self.root, ONLINE_GC_MARKER)
        try:
            if not self.fs.probe(path):
                self.fs.write_file_durable(path, b"opened with online_gc=True: straw.inspect's "
                                           b"offline inspection and cleanup refuse this pool\n")
        except OSError as e:
            raise storage_error(e, f"cannot mark pool {self.root} as managed by online GC "
                                f"({path})") from e

    def _check_backend(self, backend: object) -> FilesystemBackend:
        """The declared deployment, checked against the live mount before the pool is
        touched (``DeploymentMismatch``: nothing written)."""
        if backend is None:
            return FilesystemBackend(self.root)
        if not isinstance(backend, FilesystemBackend):
            raise TypeError(f"backend must be a straw.backend.FilesystemBackend, got "
                            f"{type(backend).__name__}")
        if not backend.serves(self.root):
            raise ValueError(f"backend root {backend.root} differs from the store root "
                             f"{self.root}; build the backend for the pool's root")
        backend.verify(self.fs)
        return backend

    def _init_pool(self) -> None:
        """Create the pool marker once, check its format and learn the pool's identity.

        The marker is created exclusively (never renamed over a name other clients may
        have cached) and its creator writes the pool's id into it: a random id, written
        once, that tells this pool from any other (two pools may hold the same run id; a
        ``TensorRef`` compares ids before reading, see ``straw.tensor``).  A marker
        without an id (a pool of an older straw) or one a crash left empty or torn is
        completed by ``_complete_marker`` under the marker's lock, so that concurrent
        clients agree on one id."""
        marker = os.path.join(self.root, "POOL")
        retries, delay = self._visibility
        try:
            for _ in range(retries + 3):
                try:
                    data = self.fs.read_file(marker)
                except FileNotFoundError:
                    self.fs.makedirs_durable(self.root)
                    try:
                        fd = self.fs.open(marker, write=True, create=True, exclusive=True)
                    except FileExistsError:
                        # another client created it; its name may not be visible to our
                        # lookups yet (a shared filesystem's entry cache): wait, reread
                        self.clock.sleep(delay)
                        delay = min(delay * 2, 1.0)
                        continue
                    try:
                        self.fs.writev(fd, [_marker_body({})], 0)
                        self.fs.fsync(fd)
                    finally:
                        self.fs.close(fd)
                    self.fs.fsync_dir(self.root)
                    continue
                info = _parse_marker(data)
                if info is None or "pool_id" not in info:
                    info = self._complete_marker(marker)
                break
            else:
                raise StorageUnavailable(f"pool marker {marker} did not become readable")
        except OSError as e:
            raise storage_error(e, f"cannot open pool {self.root}") from e
        _check_marker(marker, self.root, info)
        self.pool_id: str | None = info.get("pool_id")

    def _complete_marker(self, marker: str) -> dict[str, Any]:
        """The marker's content once it names the pool's id, under its lock: the first
        client to hold the lock writes the id, every later one reads it.  An empty,
        zeroed or torn marker (our own creation cut short by a crash) is rewritten whole.
        A marker of another format or a newer version is returned untouched (the caller
        refuses it).  On a read-only mount an older pool's marker cannot take an id: the
        pool opens without one (``pool_id`` None; references then cannot be told from
        another pool's of the same run, as before)."""
        try:
            fd = self.fs.open(marker, write=True)
        except PermissionError:
            return _parse_marker(self.fs.read_file(marker)) or {}
        except OSError as e:
            if e.errno != errno.EROFS:
                raise
            return _parse_marker(self.fs.read_file(marker)) or {}
        try:
            self.fs.lock(fd)
            try:
                info = _parse_marker(self.fs.read_to_end(fd))
                if info is not None and ("pool_id" in info or info.get("format") !=
                                         "straw-pool" or not isinstance(info.get("version"),
                                                                        int)
                                         or info["version"] > POOL_FORMAT):
                    return info
                body = _marker_body(info or {})
                self.fs.truncate(fd, 0)
                self.fs.writev(fd, [body], 0)
                self.fs.fsync(fd)
                return json.loads(body)  # type: ignore[no-any-return]
            finally:
                self.fs.unlock(fd)
        finally:
            self.fs.close(fd)

    # --- fork safety (straw.process) ---------------------------------------------------
    def _process_subject(self) -> str:
        return (f"SharedFilesystemStore of run {self.run_id!r} (writer {self._writer_id!r}) "
                f"at {self.root}")

    def _drop_inherited(self) -> None:
        for part in (self._writer, self._session, self.catalog):
            if part is not None:
                part._drop_inherited()

    # --- context manager ----------------------------------------------------------------
    def __enter__(self) -> SharedFilesystemStore:
        self._check_process()
        return self

    def close(self) -> None:
        """Seal the open pack, release the writer, close files.  Idempotent.  In a forked
        child it raises ``ForkedProcess`` and touches nothing of the parent's (the pack,
        the writer lock and the catalog are the parent's; ``__exit__`` there does not
        raise: ``straw.process``)."""
        if self.closed:
            return
        if self._in_forked_child():
            self._refuse_close_in_child()  # no lock taken: another thread may have held it
        self.closed = True
        try:
            with self._write_lock:
                if self._writer is not None:
                    self._drop_holds()
                    self._writer.close()
                    self._writer = None
        finally:
            self._session.close()
            self.catalog.close()

    def seal(self) -> None:
        """Seal the current pack (the next publication opens a new one)."""
        self._check_process()
        with self._write_lock:
            self._check_open()
            if self._writer is not None:
                self._writer.seal()

    # --- publishing ---------------------------------------------------------------------
    def publish(self, records: Sequence[Record], *, submission_id: str,
                dependencies: Sequence[RecordSetRef] = ()) -> RecordSetRef:
        """Publish one set of records durably; returns its reference (D1, D7)."""
        self._check_process()
        for i, d in enumerate(dependencies):
            if isinstance(d, int) and not isinstance(d, bool):
                raise ValueError(f"dependencies[{i}] is an index; index dependencies only "
                                 "exist inside publish_many")
        return self.publish_many([Publication(records, tuple(dependencies))],
                                 submission_id=submission_id)[0]

    def publish_many(self, publications: Sequence[Publication], *,
                     submission_id: str) -> tuple[RecordSetRef, ...]:
        """Several publications in one durable write, one reference each (a tuple, as
        straw-queue returns).  A dependency is a ``RecordSetRef`` or the index of an
        earlier publication of this call."""
        self._check_process()
        self._check_submission_id(submission_id)
        if isinstance(publications, (str, bytes)) or not isinstance(publications, Sequence):
            raise TypeError("publications must be a list of straw.Publication")
        if not publications:  # straw-queue refuses it too: an extent of nothing
            raise ValueError(f"publish_many([], submission_id={submission_id!r}) has no "
                             "publication to write; pass at least one Publication (an "
                             "empty one publishes an empty record set: publish([]))")
        normalized: list[_Pub] = []
        try:
            for i, p in enumerate(publications):
                normalized.append(self._normalize(p, i,
                                                  earlier=[n.digest for n in normalized]))
            started = self.clock.now() if tracing.enabled() else None
            refs = self._publish(normalized, submission_id, "publish")
        except Exception as e:
            self._hold_dependencies(e, "publish", submission_id,
                                    [d for p in publications if isinstance(p, Publication)
                                     for d in _sequence(p.dependencies)])
            raise
        if started is not None and refs:
            self._trace_write(refs[0].segment, [r for p in publications for r in p.records],
                              started)
        return tuple(refs)

    def _trace_write(self, seg: SegmentRef, records: Sequence[Record], started: float
                     ) -> None:
        """straw-queue's ``write`` trace event (``straw.tracing``): no payload byte."""
        tracing.emit("write", root=self.root, size=seg.size, records=records,
                     seconds=self.clock.now() - started)

    def write_records(self, records: Sequence[Record], *, submission_id: str
                      ) -> tuple[RecordRef, ...]:
        """Write records durably without publishing them as a set: one extent, whose
        records are ordinals 0..n-1 of it.  Name them in a publication later with
        ``record_set``.  Staged like every publication until ``release_publications``
        (of them, or of a record set naming them) or a durable owner takes over."""
        self._check_process()
        self._check_submission_id(submission_id)
        if isinstance(records, Sequence) and not isinstance(records, (str, bytes)) \
                and not records:  # straw-queue refuses it too: an extent of nothing
            raise ValueError(f"write_records([], submission_id={submission_id!r}) has no "
                             "record to write; pass at least one Record")
        normalized = [self._normalize(Publication(records), 0, "write_records")]
        started = self.clock.now() if tracing.enabled() else None
        (ref,) = self._publish(normalized, submission_id, "records")
        if started is not None:
            self._trace_write(ref.segment, records, started)
        return tuple(RecordRef(ref.segment, i) for i in range(ref.records))

    def record_set(self, refs: Sequence[RecordRef], *, submission_id: str,
                   dependencies: Sequence[RecordSetRef] = ()) -> RecordSetRef:
        """Publish records that already exist (``RecordRef``s, e.g. of ``write_records``)
        as one publication, without copying their bytes: an extent holding only a
        manifest that names them (and ``dependencies``).  They (and the dependencies)
        are retained through it for as long as it is (D4).  Its digest is the one a
        publication of the same records and dependencies has."""
        self._check_process()
        self._check_submission_id(submission_id)
        try:
            return self._record_set(refs, submission_id, dependencies)
        except Exception as e:
            self._hold_dependencies(e, "record_set", submission_id,
                                    [*_sequence(refs), *_sequence(dependencies)])
            raise

    def _record_set(self, refs: Sequence[RecordRef], submission_id: str,
                    dependencies: Sequence[RecordSetRef]) -> RecordSetRef:
        if isinstance(refs, (RecordRef, str, bytes)) or not isinstance(refs, Sequence):
            raise TypeError("refs must be a list of RecordRef")
        members = []
        seen: dict[RecordRef, int] = {}
        for i, r in enumerate(refs):
            if not isinstance(r, RecordRef):
                raise TypeError(f"refs[{i}] must be a RecordRef, got {type(r).__name__}")
            r = self._session._canonical(r)
            if r in seen:  # as a publication's record ids must be unique (straw-queue's)
                raise InvalidReference(f"refs[{i}] names the record refs[{seen[r]}] names; "
                                       "a record set names each record once")
            seen[r] = i
            r.check()
            if r.segment.run_id != self.run_id:
                raise InvalidReference(f"refs[{i}] belongs to run {r.segment.run_id!r}; "
                                       f"records must be in this store's run {self.run_id!r}")
            info, _, _ = self._session.payload_location(r)  # it exists and is a record
            members.append((r, info))
        pub = self._normalize(Publication((), tuple(dependencies)), 0, "record_set",
                              members=members)
        return self._publish([pub], submission_id, "record_set")[0]

    def _publish(self, normalized: list[_Pub], submission_id: str, api: str
                 ) -> list[RecordSetRef]:
        digests = tuple(n.digest for n in normalized)
        started = self.clock.now()
        with self._write_lock:
            self._check_open()
            writer = self._ensure_writer()
            # one submission id per call kind (straw-queue's receipts are bound to the
            # api): write_records and record_set of one request may share it
            known = writer.index.get((api, submission_id))
            if known is not None:
                if known.digests != digests:
                    raise IdempotencyConflict(
                        f"submission_id {submission_id!r} was already used by writer "
                        f"{self.writer_id!r} for different content through "
                        f"{_API_CALLS[api]}; use a new submission_id for new content"
                    )
                self._check_not_reclaimed(known.refs, submission_id, api)
                return list(known.refs)
            self._check_dependencies(normalized)
            _check_usage(normalized)
            refs = self._write(writer, submission_id, normalized, api)
            writer.index[(api, submission_id)] = Submission(digests, tuple(refs), api)
            if self._holds:  # a retry that succeeded: its edges hold what its hold held
                self._drop_holds({hold_owners.hold_owner(self.writer_id, api, submission_id)})
            m = self._metrics
            m["payload_bytes"] += sum(n.own_bytes for n in normalized)
            m["records"] += sum(len(n.recs) for n in normalized)
            m["segments"] += len(normalized)
            m["publish_seconds"] = (m["publish_seconds"] + [self.clock.now() - started]
                                    )[-_PUBLISH_SECONDS_KEPT:]
            return refs

    def _check_not_reclaimed(self, refs: Sequence[RecordSetRef | RecordRef],
                             submission_id: str, api: str) -> None:
        """A retry whose original result (or a dependency of it) garbage collection has
        reclaimed since gets no reference to bytes that are gone (straw-queue's rule):
        ``InvalidReference``, and the writer takes new requests as before.  Only retries
        pay for this look-up."""
        with self.catalog.locked() as st:
            gone = st.tombstoned_dependency(
                (r.segment.path, r.segment.offset) for r in refs)
        if gone is not None:
            raise InvalidReference(
                f"Reference has been reclaimed: submission_id {submission_id!r} of writer "
                f"{self.writer_id!r} ({_API_CALLS[api]}) published data in {gone[0]}, which "
                "garbage collection has reclaimed since; retain a result before releasing "
                "it if it must live on, or publish again under a new submission_id")

    def lookup_submission(self, submission_id: str) -> tuple[RecordSetRef, ...] | None:
        """The references published under ``submission_id`` by this writer id (across its
        restarts; a tuple, as ``publish_many`` returns them), or None (through
        publish/publish_many if it was, else through record_set, else write_records:
        ``publication_receipt`` asks for one)."""
        self._check_process()
        self._check_submission_id(submission_id)
        with self._write_lock:
            self._check_open()
            index = self._ensure_writer().index
            known = next((index[k] for k in (("publish", submission_id),
                                             ("record_set", submission_id),
                                             ("records", submission_id)) if k in index), None)
        return tuple(known.refs) if known else None

    def _write(self, writer: WriterIncarnation, submission_id: str,
               normalized: list[_Pub], api: str) -> list[RecordSetRef]:
        estimate = sum(n.own_bytes + 1024 + 256 * len(n.members) for n in normalized)
        start = writer.next_offset(estimate)
        pos = start
        extents = []
        placed: list[RecordSetRef] = []
        edges: list[tuple[Extent, list[Extent]]] = []
        with_edges = set(self.catalog.state.edges)  # extents known to have dependencies
        for i, n in enumerate(normalized):
            dep_refs = [placed[d] if isinstance(d, int) else d for d in n.deps]
            dep_rows = [[r.path, r.offset, r.size, bytes.fromhex(r.checksum),
                         bytes.fromhex(r.digest), r.records, r.manifest.ordinal,
                         r.payload_bytes, r.tokens] for r in dep_refs]
            # D1/D4: dependencies (and a record set's records) are retained, as edges of
            # this staged extent, before its bytes are written.  Edges that cannot matter
            # are skipped: a target in the same pack with no edges of its own is
            # protected by the pack itself.
            targets = [(r.path, r.offset) for r in dep_refs]
            targets += [(m.segment.path, m.segment.offset) for m, _ in n.members]
            if any(p != writer.pack_rel or (p, o) in with_edges for p, o in targets):
                edges.append(((writer.pack_rel, pos), sorted(set(targets))))
                with_edges.add((writer.pack_rel, pos))
            # usage includes the dependencies, transitively (theirs include theirs)
            payload_bytes = n.pub_bytes + sum(r.payload_bytes for r in dep_refs)
            tokens = n.pub_tokens + sum(r.tokens for r in dep_refs)
            ext = encode_extent(run_id=self.run_id, submission_id=submission_id, index=i,
                                count=len(normalized), digest=n.digest, records=n.recs,
                                dependencies=dep_rows, offset=pos, group_start=start,
                                payload_bytes=payload_bytes, tokens=tokens, api=api,
                                members=n.member_rows)
            extents.append(ext)
            placed.append(ref_from_entry(self.run_id, writer.pack_rel, ext.entry))
            pos += ext.entry.size
        if edges:
            self.catalog.record_edges(edges)
        return writer.append(extents)

    def _check_dependencies(self, normalized: list[_Pub]) -> None:
        """D1/D4: every dependency must name a publication of the pool (checked after the
        idempotency lookup, so a retry is answered as the original was, D7)."""
        for i, n in enumerate(normalized):
            for k, d in enumerate(n.deps):
                if isinstance(d, RecordSetRef):
                    self.check_published(d, f"publications[{i}].dependencies[{k}]")

    def _ensure_writer(self) -> WriterIncarnation:
        if self._writer is None:
            self._writer = WriterIncarnation(
                self.fs, self.root, self.run_id, self.writer_id, self.clock, self.catalog,
                segment_target_bytes=self.segment_target_bytes,
                reserve_bytes=self.reserve_bytes,
            )
            # a predecessor's holds are this incarnation's now (it may be the retrier)
            self._holds = hold_owners.holds_of(self.catalog, self.writer_id)
        return self._writer

    # --- preparation holds (straw.pool.hold_owners) ----------------------------------------------
    def _hold_dependencies(self, error: Exception, api: str, submission_id: str,
                           deps: Sequence[Any]) -> None:
        """A request that failed before its publication was durable: retain its valid
        dependencies under its own hold, so that its retry still finds them.  Best effort
        (the caller raises ``error`` whatever happens here)."""
        if isinstance(error, IdempotencyConflict) or self.closed or \
                self._in_forked_child():
            return  # a conflict's submission id is taken: no retry of it can publish
        extents = []
        for d in deps:
            if not isinstance(d, (RecordSetRef, RecordRef)):
                continue
            try:
                self.check_published(d, "dependency")
            except (StrawError, ValueError, TypeError):
                continue  # not a publication of this pool: nothing to protect
            extents.append((d.segment.path, d.segment.offset))
        if not extents:
            return
        owner = hold_owners.hold_owner(self.writer_id, api, submission_id)
        try:
            with self._write_lock:
                if self.closed:
                    return
                self._ensure_writer()  # its lock tells collections the holder is alive
                self.catalog.retain(owner, extents)
                self._holds.add(owner)
        except (StrawError, OSError) as e:
            log.warning("straw: cannot hold the dependencies of failed request %r of "
                        "writer %r: %s", submission_id, self.writer_id, e)

    def hold(self, key: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        """Retain ``refs`` for as long as this store's writer lives, under the hold owner
        of ``key`` (``straw.pool.hold_owners``; taking it again replaces its roots).  It goes with
        ``release_hold(key)``, with this store's ``close``, or with a collection once this
        writer is dead.  For a step that must keep data until a name of its own exists
        (an archive's index): a crash before that name leaves nothing retained for ever."""
        self._check_open()
        check_owner(key)
        owner = hold_owners.hold_owner(self.writer_id, HOLD_API, key)
        items = _listed(refs)
        checked = self._checked(items, "refs")
        self._check_all_published(items, "refs", checked)
        with self._write_lock:
            self._check_open()
            self._ensure_writer()  # its lock tells collections the holder is alive
            self.catalog.retain(owner, [(r.segment.path, r.segment.offset) for r in checked])
            self._holds.add(owner)

    def release_hold(self, key: str) -> bool:
        """Drop the hold of ``key`` taken by ``hold``; False if this store holds none."""
        self._check_open()
        owner = hold_owners.hold_owner(self.writer_id, HOLD_API, check_owner(key))
        with self._write_lock:
            if owner not in self._holds:
                return False
            self.catalog.release(owner)
            self._holds.discard(owner)
            return True

    def _drop_holds(self, owners: set[str] | None = None) -> None:
        """Release this writer's holds ``owners`` (all of them by default).  Called
        under the write lock."""
        chosen = set(self._holds) if owners is None else owners & self._holds
        if not chosen:
            return
        try:
            hold_owners.release_all(self.catalog, chosen)
        except (StrawError, OSError) as e:
            # left for the next close, or a collection once this writer is gone
            log.warning("straw: cannot release holds %s: %s", sorted(chosen), e)
            return
        self._holds -= chosen

    def _check_open(self) -> None:
        self._check_process()  # first: a forked child is refused before any lock
        if self.closed:
            raise Closed(f"store of run {self.run_id!r} at {self.root} is closed; open a new "
                         "SharedFilesystemStore")

    @staticmethod
    def _check_submission_id(submission_id: object) -> None:
        if not isinstance(submission_id, str):
            raise TypeError(f"submission_id must be a str, got {type(submission_id).__name__}")
        if not submission_id or len(submission_id) > 1024:
            raise ValueError("submission_id must be a non-empty str of at most 1024 characters")

    def _normalize(self, pub: object, i: int, where: str | None = None, *,
                   earlier: Sequence[bytes] = (),
                   members: Sequence[tuple[RecordRef, RecordInfo]] = ()) -> _Pub:
        """Validate one publication; returns its records, dependencies and digest.

        The digest is layout-independent: it hashes each record's id, codec, metadata,
        token count and payload hash, and each dependency's *logical digest*, the same
        whether the dependency is a reference or the index of a publication of the same
        call (whose digest is known: publications are normalised in order), and the same
        for a ``record_set`` of records as for a publication of those records."""
        where = where or f"publications[{i}]"
        if not isinstance(pub, Publication):
            raise TypeError(f"{where} must be a straw.Publication, got {type(pub).__name__}")
        if isinstance(pub.records, (str, bytes)) or not isinstance(pub.records, Sequence):
            raise TypeError(f"{where}.records must be a list of straw.Record")
        seen: set[str] = set()
        recs = []
        ident: list[Any] = []
        own_bytes = 0
        pub_tokens = 0
        for j, r in enumerate(pub.records):
            rw = f"{where}.records[{j}]"
            if not isinstance(r, Record):
                raise TypeError(f"{rw} must be a straw.Record, got {type(r).__name__}")
            if not isinstance(r.record_id, str):
                raise TypeError(f"{rw}.record_id must be a str, got {type(r.record_id).__name__}")
            if not r.record_id or len(r.record_id) > 1024:
                raise InvalidRecordId(f"{rw}.record_id must be a non-empty str of at most "
                                      f"1024 chars, got {short_repr(r.record_id)}")
            if r.record_id in seen:
                raise ValueError(f"{rw}.record_id {r.record_id!r} is a duplicate; record ids "
                                 "must be unique within a publication")
            seen.add(r.record_id)
            if not isinstance(r.codec, str):
                raise TypeError(f"{rw}.codec must be a str, got {type(r.codec).__name__}")
            if r.codec not in self.codecs:
                hint = "" if NAME_RE.match(r.codec) else " (not a valid codec name)"
                raise UnknownCodec(
                    f"{rw}.codec {r.codec!r} is not registered{hint}; open the store with "
                    f"codecs=({r.codec!r},) (built-ins: {', '.join(BUILTIN_CODECS)})"
                )
            if r.tokens is not None:  # None means "no token count": stored as 0
                check_u64(f"{rw}.tokens", r.tokens)  # unsigned, as straw-queue's
            tokens = r.tokens or 0
            meta = canonical_metadata(r.metadata, rw)
            view = payload_view(r.payload, rw)
            if self.enforce_limits and view.nbytes > self.max_record_bytes:
                raise ResourceLimitExceeded(
                    f"{rw}.payload holds {view.nbytes} bytes, more than max_record_bytes="
                    f"{self.max_record_bytes} of this store; open it with a larger "
                    "max_record_bytes, or split the payload")
            h = xxhash.xxh3_128_digest(view)
            recs.append((r.record_id, r.codec, meta, tokens, view, h))
            ident.append([r.record_id, r.codec, meta, _ident_tokens(tokens), h])
            own_bytes += view.nbytes
            pub_tokens += tokens
        member_rows = []
        pub_bytes = own_bytes
        for m, info in members:
            meta = canonical_metadata(info.metadata, f"record {info.record_id!r}")
            h = bytes.fromhex(info.checksum)
            ident.append([info.record_id, info.codec, meta, _ident_tokens(info.tokens or 0), h])
            pub_bytes += info.length
            pub_tokens += info.tokens or 0
            seg = m.segment
            member_rows.append([seg.path, seg.offset, seg.size, bytes.fromhex(seg.checksum),
                                m.ordinal, info.record_id, info.codec, meta, info.tokens,
                                info.length, h])
        deps: list[Any] = []
        dep_ident: list[Any] = []
        if isinstance(pub.dependencies, (str, bytes, RecordSetRef)) or \
                not isinstance(pub.dependencies, Sequence):
            raise TypeError(f"{where}.dependencies must be a list of RecordSetRef (or "
                            "indices of earlier publications of a publish_many call)")
        for k, d in enumerate(pub.dependencies):
            dw = f"{where}.dependencies[{k}]"
            if isinstance(d, int) and not isinstance(d, bool):
                if not 0 <= d < i:
                    # straw-queue's phrase first (its callers match it), then ours.
                    raise LocalDependencyOrder(
                        f"Local dependencies must precede publication: {dw} = {d} must "
                        "index an earlier publication of this call ("
                        + (f"0..{i - 1}" if i else "there is none before the first")
                        + "); list each publication after the ones it depends on")
                deps.append(d)
                dep_ident.append(earlier[d].hex())
            elif isinstance(d, RecordSetRef):
                d = self._session._canonical(d)
                d.check()
                if d.run_id != self.run_id:
                    raise InvalidReference(f"{dw} belongs to run {d.run_id!r}; dependencies "
                                           f"must be in this store's run {self.run_id!r}")
                deps.append(d)
                dep_ident.append(d.digest)
            else:
                raise TypeError(f"{dw} must be a RecordSetRef or an int index, got "
                                f"{type(d).__name__}")
        digest = xxhash.xxh3_128_digest(msgpack.packb([ident, dep_ident], use_bin_type=True))
        return _Pub(recs, deps, digest, member_rows, list(members), own_bytes, pub_bytes,
                    pub_tokens)

    # --- retention (D1-D4) ----------------------------------------------------------------
    def retain(self, owner: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        """Make ``refs`` (and, transitively, their dependencies) the durable roots of
        this run's ``owner``, replacing its previous roots (another run's owner of the same
        name is a different owner).  ``InvalidReference`` if one was already
        reclaimed.  Retain a successor before releasing its predecessor."""
        self._check_open()
        check_owner(owner)
        items = _listed(refs)
        checked = self._checked(items, "refs")  # in-pool aliases resolved to their packs
        # D4: what an owner retains must exist; the references are resolved and checked
        # once for both uses (twice cost a tenth of a checkpoint restore's 10,000)
        self._check_all_published(items, "refs", checked)
        self.catalog.retain(owner, [(r.segment.path, r.segment.offset) for r in checked])

    def release(self, owner: str, *,
                only_if: Sequence[RecordSetRef | RecordRef] | None = None) -> bool:
        """Drop this run's ``owner``.  Returns False (and changes nothing) if this run has
        no such owner (another run's owner of that name is never touched).  Pins left
        behind by a crashed reader of this run (``publication:pin:...``, or ``pin:...`` in pools
        written before) can be released here.  ``only_if`` (ours): release it only if it
        retains exactly these references, checked atomically under the catalog's lock;
        ``OwnerMismatch`` otherwise, nothing released.  For a caller that learned the
        owner's name from a record someone could edit (an archive index): a name edited to
        another owner releases nothing."""
        self._check_open()
        if not isinstance(owner, str):
            raise TypeError(f"owner must be a str, got {type(owner).__name__}")
        if owner.startswith(RESERVED_OWNER_PREFIXES) and not owner.startswith(PIN_OWNER_PREFIX):
            # "reserved": straw-queue's word, which its callers match
            raise ValueError(f"owner {owner!r} uses a reserved prefix: it belongs to straw "
                             "itself (a queue's owner: release its data through the "
                             "coordinator)")
        expected = None if only_if is None else self._extents(only_if, "only_if")
        return self.catalog.release(owner, only_if=expected)

    def release_publications(self, refs: Iterable[RecordSetRef]) -> int:
        """Drop the staging protection of fresh publications and of what they depend on,
        transitively (straw-queue's rule: releasing a result releases the tensors it
        references; retain first what must live on, and release only after every submit
        naming any of them was acknowledged: SPEC ``release_publications``).  A dependency
        that another staged publication, an owner or a pin still reaches stays protected
        through it.  Returns how many of ``refs`` were still staged."""
        self._check_open()
        checked = self._checked(refs, "refs")
        named = [(r.segment.path, r.segment.offset) for r in checked]
        deps = self.staged_dependencies([r.segment for r in checked])
        return self.catalog.unstage(named, dependencies=deps)

    def staged_dependencies(self, segs: Iterable[SegmentRef],
                            known: Mapping[Extent, Sequence[SegmentRef]] | None = None
                            ) -> set[Extent]:
        """The extents of this run that ``segs`` depend on, transitively, and that may
        still be staged (``segs`` themselves left out): what dropping their staging drops
        too.  The walk reads checked manifests (cached by the session; ``known``: what
        some of ``segs`` need, recorded when their manifests were checked, so they are not
        read again) and stops at an extent already unstaged (its own dependencies went
        with it), at another run's (its staging is that run's) and at one it cannot read:
        that branch keeps its staging, which only ever keeps data longer."""
        self._check_process()
        st = self.catalog.state
        known = known or {}
        start = {(s.path, s.offset) for s in segs}
        todo = list(segs)
        seen: set[Extent] = set()
        out: set[Extent] = set()
        while todo:
            seg = todo.pop()
            e = (seg.path, seg.offset)
            if e in seen or seg.run_id != self.run_id:
                continue
            seen.add(e)
            if not st.may_be_staged(e):
                continue  # (a named one too: what it needs went when it was unstaged)
            needs = known.get(e)
            if needs is None:
                try:
                    needs = self._session.needs(seg)
                except (StrawError, OSError):
                    continue
            if e not in start:
                out.add(e)
            todo.extend(needs)
        return out

    def cached_needs(self, seg: SegmentRef) -> list[SegmentRef] | None:
        """What ``seg``'s publication needs if the store's session checked its manifest
        already (no I/O), else None (``ReadSession.cached_needs``)."""
        self._check_process()
        return self._session.cached_needs(seg)

    def pin(self, refs: Iterable[RecordSetRef | RecordRef], *, owner: str | None = None
            ) -> Pin:
        """``with store.pin(refs):`` — a durable reader owner held for the block (named
        ``owner``, else ``publication:pin:host:pid:<uuid>``).  A reader that dies inside the block
        leaves its pin for an operator to ``release``: nothing is reclaimed under a
        reader that may be alive."""
        self._check_open()
        if owner is not None:
            check_owner(owner)
        items = _listed(refs)
        return Pin(self, self._extents(items, "refs"), items, owner)

    def collect_garbage(self) -> dict[str, Any]:
        """Reclaim this run's sealed packs that no owner, pin or staged publication of any
        run reaches (D4): tombstone them durably, then unlink them (D3).  Packs of other
        runs sharing the root are never deleted.  First, packs a writer left open are
        sealed in the catalog on its behalf when that writer is dead (its lock is free;
        ``straw.recovery``), as are this store's own packs abandoned after an I/O error.
        Every read session of this process on this pool then drops its cached descriptors
        of the reclaimed packs, so that the reclaimed bytes are free when this returns.
        Returns straw-queue's counts (``reclaimed_files``, ``reclaimed_bytes``,
        ``tombstones``: packs tombstoned now, ``retained_packs``, ``open_packs``,
        ``owners``: this run's roots, as straw-queue counts them: named owners that hold
        something (a queue's, once its tasks hold no input, does not) and publications
        still staged in sealed packs) and, in addition, the tombstoned paths
        (``tombstoned``), interrupted collections it finished (``finished_interrupted``),
        the retained packs' paths (``retained_pack_paths``) and owners' names
        (``owner_names``), the packs sealed for dead writers (``sealed_for_dead_writers``)
        and the damage their recovery found (``damaged``).  It also drops the preparation
        holds of writers it finds dead (``straw.pool.hold_owners``)."""
        self._check_open()
        with self._write_lock:
            if self._writer is not None:
                self._writer.seal_abandoned()
                self._writer.seal_if_full()  # no later publication would add to it
        on_behalf, damaged = seal_dead_writers(self.fs, self.root, self.catalog, self.clock,
                                              run=self.run_id)
        result = self.catalog.collect()
        hold_owners.release_holds_of_dead_writers(self.fs, self.root, self.catalog, self.clock,
                                            result["owner_names"], live_writer=self.writer_id)
        drop_reclaimed(self._session.real_root,
                       result["tombstoned"] + result["finished_interrupted"])
        result["sealed_for_dead_writers"] = on_behalf
        result["damaged"] = [d.as_dict() for d in damaged]
        return result

    def repair_catalog(self) -> list[dict[str, Any]]:
        """Operator repair of a damaged catalog (after ``CorruptData`` naming this call).

        Each damaged frame's bytes are copied to a durable side file in the pool root
        (``CATALOG.damaged-<offset>-<n>``) and replaced in place, so only the damaged
        transaction is lost; every later transaction is kept.  Returns one report per
        damaged frame (``offset``, ``lost_bytes``, ``side_file``); empty if nothing was
        damaged.  Afterwards ``collect_garbage`` raises ``UnsafeRecovery`` on every client
        until ``confirm_catalog_repair()``: re-retain what must live first (a lost
        ``retain`` would otherwise let the collector reclaim what it protected)."""
        self._check_open()
        return self.catalog.repair()

    def confirm_catalog_repair(self) -> list[str]:
        """The operator's say that collection may act on the repaired catalog again (a
        durable catalog operation, so every client sees it; a separate call rather than
        a ``collect_garbage`` flag, so that no routine collection loop can confirm by
        accident).  Returns the side files of the repairs confirmed."""
        self._check_open()
        return self.catalog.confirm_repairs()

    def owners(self) -> list[str]:
        """The names of this run's owners (applications', pins, queues)."""
        self._check_process()
        with self.catalog.locked() as st:
            return sorted(st.run_owners(self.run_id))

    def _extents(self, refs: Iterable[Any], where: str) -> list[Extent]:
        return [(r.segment.path, r.segment.offset) for r in self._checked(refs, where)]

    def _checked(self, refs: Iterable[Any], where: str) -> list[RecordSetRef | RecordRef]:
        """``refs`` with in-pool aliases resolved, each structurally checked and of this
        run (``TypeError``/``InvalidReference`` naming ``where[i]`` otherwise)."""
        if isinstance(refs, (RecordSetRef, RecordRef, str, bytes)):
            raise TypeError(f"{where} must be a list of references, not a single one")
        out = []
        for i, r in enumerate(refs):
            if not isinstance(r, (RecordSetRef, RecordRef)):
                raise TypeError(f"{where}[{i}] must be a RecordSetRef or RecordRef, got "
                                f"{type(r).__name__}")
            r = self._session._canonical(r)  # an in-pool alias names its pack's identity
            r.check()
            if r.segment.run_id != self.run_id:
                raise InvalidReference(f"{where}[{i}] belongs to run {r.segment.run_id!r}, "
                                       f"this store is run {self.run_id!r}")
            out.append(r)
        return out

    def _check_all_published(self, refs: Sequence[RecordSetRef | RecordRef], where: str,
                             checked: Sequence[RecordSetRef | RecordRef] | None = None
                             ) -> None:
        """Each of ``refs`` (checked by ``_extents`` already) must name a publication: what
        an owner retains must exist (D4).  Confirmed in bulk (``confirm_published``: a
        read per run of neighbouring extents); what that does not confirm is checked one by
        one, which raises the error naming it."""
        self._check_process()
        # ``checked``: ``refs`` as ``_checked`` returned them (resolved already)
        canonical = checked if checked is not None else [self._session._canonical(r)
                                                         for r in refs]
        segs = [r.segment for r in canonical]
        for i, ok in enumerate(self._session.confirm_published(segs)):
            if not ok:
                self.check_published(refs[i], f"{where}[{i}]")

    # --- reading ------------------------------------------------------------------------
    def read(self, ref: RecordSetRef) -> Iterator[Record]:
        """The publication's records, checked against the reference (D6), as an iterator
        (``next(store.read(ref)).payload`` is ``bytes``).  It reads through the store's
        own read session, which lives as long as the store (straw-queue opens one per
        iterator; ours is cached across calls).  A bad reference or damaged extent fails
        at the call (``ReadSession.read``)."""
        self._check_process()
        return self._session.read(ref)

    def read_record(self, ref: RecordRef) -> Record:
        """One record (the manifest ordinal reads back as the manifest record)."""
        self._check_process()
        return self._session.read_record(ref)

    def manifest(self, ref: RecordSetRef) -> dict[str, Any]:
        """straw-queue's manifest dict: ``version``, ``digest``, ``records`` (RecordRef
        dicts) and ``dependencies`` (RecordSetRef dicts)."""
        self._check_process()
        return self._session.manifest(ref)

    def checked_manifest(self, ref: RecordSetRef) -> Manifest:
        """straw's own view of a publication's checked manifest (``straw.refs.Manifest``:
        submission id, record entries, dependencies, record references)."""
        self._check_process()
        return self._session.checked_manifest(ref)

    def validate(self, ref: RecordSetRef, *, task_id: str | None = None,
                 attempt_id: str | None = None) -> tuple[RecordRef, ...]:
        """Check the whole publication; its record references (``ReadSession.validate``)."""
        self._check_process()
        return self._session.validate(ref, task_id=task_id, attempt_id=attempt_id)

    def read_session(self) -> ReadSession:
        """A scoped reader with its own cache of open packs and checked manifests:
        ``with store.read_session() as reader:``."""
        self._check_process()
        retries, backoff = self._visibility
        return ReadSession(self.fs, self.root, self.run_id, self.clock,
                           visibility_retries=retries, visibility_backoff=backoff,
                           pack_status=self._pack_status, pool_id=self.pool_id,
                           backend=self.backend)

    def check_published(self, ref: RecordSetRef | RecordRef | SegmentRef,
                        where: str = "ref") -> None:
        """``InvalidReference`` (naming ``where``) unless ``ref`` names a publication of
        this pool: the frame at its offset is an extent of its size and checksum.  Asked
        before a reference is retained, pinned or depended on (one small read)."""
        self._check_process()
        try:
            self._session.check_published(ref.segment if isinstance(ref, RecordRef) else ref)
        except InvalidReference as e:  # the same class (an ExtentMismatch stays one)
            raise type(e)(f"{where}: {e}") from None

    def check_published_many(self, refs: Sequence[RecordSetRef | RecordRef], where: str
                             ) -> None:
        """``check_published(ref, where)`` for each of ``refs`` (structurally checked and of
        this run, as a coordinator's arguments are), their frame headers confirmed in
        bulk (``ReadSession.confirm_published``: one read per run of neighbouring extents,
        none for a manifest checked already); what that does not confirm is checked one by
        one by ``check_published``, which raises the same error, naming ``where``, as
        before.  A refill's 64 fresh prompt inputs cost a read or two, not 64."""
        self._check_process()
        canonical = [self._session._canonical(r) for r in refs]
        for r, ok in zip(refs, self._session.confirm_published([c.segment for c in canonical]),
                         strict=True):
            if not ok:
                self.check_published(r, where)

    def inspect_segment(self, ref: SegmentRef, *, verify_payload: bool = False
                        ) -> dict[str, Any]:
        """straw-queue's description of one extent: ``version``, ``run_id``,
        ``segment_id`` and ``records``: per record its ``envelope`` (``envelope_dict``)
        and ``offset`` (of its payload, from the extent's start), the manifest record
        last.  The manifest is always checked; ``verify_payload`` checks the whole extent
        (``CorruptData`` if damaged)."""
        self._check_process()
        if not isinstance(ref, SegmentRef):
            raise TypeError(f"inspect_segment takes a SegmentRef (e.g. ref.manifest.segment "
                            f"or record_ref.segment), got {type(ref).__name__}")
        ref = self._session._canonical(ref)
        ext = self._session.extent(ref)  # checks the reference first
        if verify_payload:
            self._session._read_extent(ref)
        records = [{"offset": off - ref.offset, "envelope": envelope_dict(info)}
                   for info, off in zip(ext.local, ext.offsets, strict=True)]
        # our manifest sits before the payloads (straw-queue's after them): its offset
        records.append({"offset": framing.HEADER_SIZE + EXTENT_PREFIX.size,
                        "envelope": envelope_dict(ext.manifest_info)})
        return {"version": 1, "run_id": ref.run_id,
                "segment_id": ref.segment_id, "records": records}

    def read_range(self, ref: RecordRef, start: int, stop: int, *, chunk_bytes: int,
                   checksums: Sequence[str]) -> bytearray:
        """Bytes [start, stop) of a record, checked against the caller's chunk checksums
        (``ReadSession.read_range``), through the store's read session."""
        self._check_process()
        return self._session.read_range(ref, start, stop, chunk_bytes=chunk_bytes,
                                        checksums=checksums)

    def read_tensor_range(self, ref: RecordRef, start: int, stop: int, *,
                          expected: Mapping[str, Any] | None = None
                          ) -> tuple[dict[str, Any], bytearray]:
        """``(envelope, bytes [start, stop))`` of a ``tensor.v1`` record, checked against
        its own chunk checksums (``ReadSession.read_tensor_range``)."""
        self._check_process()
        return self._session.read_tensor_range(ref, start, stop, expected=expected)

    # --- writers: receipts and retirement ----------------------------------------------
    def publication_receipt(self, writer_id: str, *, api: str, submission_id: str
                            ) -> list[RecordSetRef] | list[RecordRef] | None:
        """What writer ``writer_id`` of this run published under ``submission_id`` through
        ``api`` (``"records"``: write_records, ``"record_set"``, ``"publish"``:
        publish/publish_many), e.g. after a lost reply; None if nothing was
        (``ValueError`` if the run has no such writer, as straw-queue).  Reads only:
        it renews no protection (an old result may be collected already).  A writer whose
        store is open elsewhere is read without its lock: what it acknowledged is
        returned; if nothing is found ``WriterBusy`` is raised, since the request may
        still be in flight there (ask again once that store closed).  A retired writer
        can still be asked."""
        self._check_process()
        check_name("writer_id", writer_id)
        if api not in _API_CALLS:
            raise ValueError(f"api must be one of {', '.join(sorted(_API_CALLS))}, got "
                             f"{api!r}")
        self._check_submission_id(submission_id)
        if writer_id == self.writer_id:
            with self._write_lock:
                self._check_open()
                if self._writer is not None:
                    known = self._writer.index.get((api, submission_id))
                    return _receipt(known, api)
        try:
            with self._other_writer(writer_id) as (rel_dir, writer_dir):
                if not self.fs.exists(writer_dir):
                    if writer_id == self.writer_id:
                        return None  # this store's own writer, which published nothing
                    # straw-queue: an unknown writer is a ValueError (a wrong id), not
                    # "nothing published" (a writer creates its directory durably before
                    # its first publication is acknowledged)
                    raise ValueError(
                        f"run {self.run_id!r} has no writer {writer_id!r} at {self.root}: "
                        "it never published here; pass the writer_id of the store that "
                        "sent the request (store.writer_id)")
                history = recover_writer(self.fs, self.root, self.run_id, rel_dir,
                                         self.catalog, incarnations(self.fs, writer_dir))
        except WriterBusy as busy:
            return _receipt(self._live_writer_receipt(writer_id, api, submission_id, busy),
                            api)
        return _receipt(history.index.get((api, submission_id)), api)

    def _live_writer_receipt(self, writer_id: str, api: str, submission_id: str,
                             busy: WriterBusy) -> Submission:
        """A live writer's acknowledged publication: durable and immutable in its packs,
        so reading it needs no lock; its absence proves nothing (``busy`` is raised)."""
        rel_dir = f"runs/{self.run_id}/writers/{writer_id}"
        try:
            history = recover_writer(self.fs, self.root, self.run_id, rel_dir, self.catalog,
                                     incarnations(self.fs, os.path.join(self.root, rel_dir)),
                                     live=True)
        except CorruptData:
            raise busy from None  # a frame being written: cannot tell yet
        known = history.index.get((api, submission_id))
        if known is None:
            raise WriterBusy(f"{busy}: it has published nothing durable under {api} "
                             f"submission {submission_id!r} yet, and the request may still "
                             "be in flight there") from None
        return known

    def retire_writer(self, writer_id: str, *, policy: str = "recover"
                      ) -> list[RecordSetRef] | list[Any]:
        """Fence writer ``writer_id`` of this run for good: a store that later tries to
        publish as it raises ``WriterFenced`` (publish with a new writer).  Its open packs
        are sealed in the catalog on its behalf.  ``policy="recover"`` returns its
        results still staged (published, not yet released or adopted: yours to retain
        or release); ``"abandon"`` returns nothing and leaves every owner and staging as
        it is.  ``WriterBusy`` while a live store holds that writer."""
        self._check_process()
        check_name("writer_id", writer_id)
        if policy not in ("recover", "abandon"):
            raise ValueError(f"policy must be 'recover' or 'abandon', got {policy!r}")
        if writer_id == self.writer_id and self._writer is not None:
            raise WriterBusy(f"writer {writer_id!r} is this store's own, live writer; close "
                             "the store first (or retire it from another store)")
        with self._other_writer(writer_id) as (rel_dir, writer_dir):
            if not self.fs.exists(writer_dir):
                raise ValueError(f"run {self.run_id!r} has no writer {writer_id!r} at "
                                 f"{self.root}")
            history = recover_writer(self.fs, self.root, self.run_id, rel_dir, self.catalog,
                                     incarnations(self.fs, writer_dir))
            self.fs.write_file_durable(os.path.join(writer_dir, RETIRED), json.dumps(
                {"retired_by": self.writer_id, "at": self.clock.now()}).encode())
            self.catalog.seal_if_open(history.packs, prefix=f"{rel_dir}/")
            # its failed requests will never be retried: their holds go (both policies)
            hold_owners.release_all(self.catalog, hold_owners.holds_of(self.catalog, writer_id))
        if policy == "abandon":
            return []
        staged: list[Any] = []
        with self.catalog.locked() as st:
            for sub in history.index.values():
                live = []
                for r in sub.refs:
                    info = st.packs.get(r.path)
                    if info is not None and not info.tombstoned \
                            and r.offset not in info.unstaged:
                        live.append(r)
                if len(live) == len(sub.refs):  # as publication_receipt reports them
                    staged.extend(_receipt(sub, sub.api) or ())
        return staged

    @contextlib.contextmanager
    def _other_writer(self, writer_id: str) -> Iterator[tuple[str, str]]:
        """Hold writer ``writer_id``'s lock for a moment (``WriterBusy`` if a live store
        holds it): its packs are then written by nobody."""
        rel_dir = f"runs/{self.run_id}/writers/{writer_id}"
        writer_dir = os.path.join(self.root, rel_dir)
        if not self.fs.exists(writer_dir):
            yield rel_dir, writer_dir
            return
        fd, holder_desc = role_lock.take(self.fs, os.path.join(writer_dir, "LOCK"), self.clock,
                                      purpose=f"store of writer {self.writer_id} asking")
        if fd is None:
            raise WriterBusy(f"writer {writer_id!r} of run {self.run_id!r} is in use by "
                             f"{holder_desc}; retry once it is closed")
        try:
            yield rel_dir, writer_dir
        finally:
            role_lock.release(self.fs, fd)

    def _pack_status(self, path: str) -> PackStatus | None:
        """What the catalog knows of pack ``path``, read fresh under the pool lock; None
        if it cannot tell.  Reads ask only after a read failed, to tell a final pack
        (nothing to wait for) from another client's visibility lag."""
        if self.closed or not self.fs.probe(self.catalog.path):
            return None
        w = self._writer
        pack = w.pack if w is not None else None
        if pack is not None and w is not None and w.pack_rel == path:
            # this store's own open pack: written through this client, so a short or
            # zeroed read is damage, never another client's visibility lag
            return PackStatus("own", frozenset(e.offset for e in list(pack.entries)))
        try:
            with self.catalog.locked() as st:
                info = st.packs.get(path)
                if info is None:
                    return PackStatus("unknown")
                return PackStatus("tombstoned" if info.tombstoned else info.state,
                                  frozenset(info.offsets))
        except (StrawError, OSError):
            return None

    # --- inspection ---------------------------------------------------------------------
    def disk_usage(self) -> dict[str, int]:
        """Pack files and bytes of this run on disk (for demos and operators)."""
        self._check_process()
        files = 0
        total = 0
        run_dir = os.path.join(self.root, "runs", self.run_id)
        stack = [run_dir]
        while stack:
            d = stack.pop()
            try:
                names = self.fs.listdir(d)
            except FileNotFoundError:
                continue
            for name in names:
                p = os.path.join(d, name)
                st = self.fs.stat(p)
                if st.is_dir:
                    stack.append(p)
                elif name.endswith(PACK_SUFFIXES):
                    files += 1
                    total += st.size
        return {"pack_files": files, "bytes": total}

    def writer_info(self) -> Mapping[str, Any] | None:
        """This store's writer (once it published or looked a submission up): writer id,
        incarnation, open pack, and ``damaged``: the damaged extents its recovery of
        earlier incarnations found and did not index (pack, offset, reason)."""
        self._check_process()
        return self._writer.describe() if self._writer else None


def _receipt(known: Submission | None, api: str) -> list[Any] | None:
    """A submission as ``publication_receipt`` reports it: None unless published through
    ``api``; record references for ``write_records``."""
    if known is None or known.api != api:
        return None
    if api == "records":
        (ref,) = known.refs
        return [RecordRef(ref.segment, i) for i in range(ref.records)]
    return list(known.refs)


# Owner names straw uses itself live under the two prefixes straw-queue 0.1.6 also
# reserves ("queue:" and "publication:"), so that no name a straw-queue caller can use
# (it refuses those two) meets one of ours: a coordinator owns ``queue:<ns>/<id>``, an
# unnamed pin is ``publication:pin:<host>:<pid>:<uuid>``.  Every other name ("pin:...",
# "checkpoint:...", "staged:...", which straw-queue callers do use) is the application's.
# Pools written before this rule may hold unnamed pins called ``pin:<host>:<pid>:<uuid>``:
# they stay ordinary owners (they protect their data until released, as before), and
# ``release`` drops them like any application owner.
RESERVED_OWNER_PREFIXES = ("queue:", "publication:")
# An unnamed pin left behind by a reader that died: ``release`` may drop it (an operator
# cleaning up), ``retain`` may not create one.
PIN_OWNER_PREFIX = "publication:pin:"


def check_owner(owner: object) -> str:
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, got {type(owner).__name__}")
    if not owner or len(owner) > 1024:
        raise ValueError("owner must be a non-empty str of at most 1024 characters")
    if owner.startswith(RESERVED_OWNER_PREFIXES):
        raise ValueError(
            f"owner {owner!r} uses a reserved prefix ({', '.join(RESERVED_OWNER_PREFIXES)}: "
            "straw's own queue and pin owners); choose another name"
        )
    return owner


def _sequence(value: Any) -> Sequence[Any]:
    """``value`` as a sequence to look through for dependencies, or () if it is none."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return ()
    return value


def _listed(refs: Any) -> Any:
    """``refs`` as a list, so that it can be walked twice (a single reference is left as
    it is, for ``_extents`` to refuse)."""
    if isinstance(refs, (RecordSetRef, RecordRef, str, bytes)):
        return refs
    return list(refs)


class Pin:
    """A reader's durable protection, held while the ``with`` block runs."""

    def __init__(self, store: SharedFilesystemStore, extents: list[Extent],
                 refs: Sequence[RecordSetRef | RecordRef] = (), owner: str | None = None
                 ) -> None:
        self.store = store
        self.extents = extents
        self.refs = refs
        self.owner = owner or (f"{PIN_OWNER_PREFIX}{socket.gethostname()}:{os.getpid()}:"
                               f"{uuid.uuid4().hex}")
        self.held = False

    def __enter__(self) -> Pin:
        self.store._check_process()
        self.store._check_all_published(self.refs, "refs")
        self.store.catalog.retain(self.owner, self.extents)
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        # a forked child leaving the block leaves the parent's pin alone (straw.process)
        if self.held and not self.store._in_forked_child():
            self.store.catalog.release(self.owner)
            self.held = False


__all__ = ["SharedFilesystemStore", "BUILTIN_CODECS", "MAX_RECORDS", "Pin", "StorageUnavailable"]
