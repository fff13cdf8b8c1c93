"""``SharedFilesystemStore``: publish immutable publications into packs; read them back
checked, from any client of the pool.

Pool layout::

    <root>/POOL                  format marker (UnsupportedSchema if newer)
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
``close()``/``__exit__`` in a child do not raise and touch nothing of the parent's (no
seal, no unlock, no write); the child's copies of the descriptors are closed already at
the fork.  A store opened in the child (with its own ``writer_id`` if it publishes)
works normally.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgpack
import xxhash

from .backend import FilesystemBackend
from .catalog import Catalog, Extent
from .checks import check_count, check_seconds
from .clock import Clock, SystemClock
from .errors import (
    IdempotencyConflict,
    InvalidReference,
    StorageUnavailable,
    StrawError,
    UnsupportedSchema,
)
from .fs import Filesystem, PosixFS
from .pack import encode_extent, storage_error
from .process import ProcessBound
from .reader import PackStatus, ReadSession, drop_reclaimed
from .recovery import seal_dead_writers
from .refs import (
    NAME_RE,
    Manifest,
    Publication,
    Record,
    RecordRef,
    RecordSetRef,
    canonical_metadata,
    check_name,
    payload_view,
)
from .writer import Submission, WriterIncarnation

BUILTIN_CODECS = ("bytes.v1", "json.v1", "tensor.v1", "sample.v1")
POOL_FORMAT = 1
DEFAULT_SEGMENT_TARGET = 256 * 1024 * 1024
DEFAULT_RESERVE = 64 * 1024 * 1024

_Normalized = tuple[list[tuple[str, str, str, "int | None", memoryview, bytes]], list[Any], bytes]


class SharedFilesystemStore(ProcessBound):
    """A pool client: publishes as writer ``writer_id`` and reads anything of its run.

    Parameters: ``root`` (pool directory, created if missing), ``run_id`` (the job),
    ``codecs`` (codec names in addition to the built-ins ``bytes.v1``, ``json.v1``,
    ``tensor.v1``, ``sample.v1``), ``segment_target_bytes`` (pack rotation target, not a
    hard limit), ``writer_id`` (stable name of this writer: submission ids are scoped to
    it and survive its restarts; concurrent writers need distinct ids), ``fs`` (the
    ``Filesystem``, default ``PosixFS``), ``clock``, ``reserve_bytes`` (space reserved
    ahead in packs, less on a nearly full disk; 0 disables),
    ``visibility_retries``/``visibility_backoff`` (bounded retries when another client's
    data is not visible yet), ``backend`` (a ``straw.backend.FilesystemBackend``: the
    storage profile and deployment declaration, verified against the live mount before
    anything is written)."""

    _process_state = "its writer lock, open pack, catalog position and open files"

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        codecs: Iterable[str] = (),
        segment_target_bytes: int = DEFAULT_SEGMENT_TARGET,
        writer_id: str = "default",
        fs: Filesystem | None = None,
        clock: Clock | None = None,
        reserve_bytes: int = DEFAULT_RESERVE,
        visibility_retries: int = 8,
        visibility_backoff: float = 0.05,
        backend: FilesystemBackend | None = None,
    ) -> None:
        self._bind_process()
        self.run_id = check_name("run_id", run_id)
        self.writer_id = check_name("writer_id", writer_id)
        check_count("segment_target_bytes", segment_target_bytes, minimum=1)
        check_count("reserve_bytes", reserve_bytes)
        check_count("visibility_retries", visibility_retries)
        check_seconds("visibility_backoff", visibility_backoff, positive=False)
        if isinstance(codecs, str):
            raise TypeError("codecs must be an iterable of codec names, not one str")
        extra = set()
        for c in codecs:
            extra.add(check_name("codec name", c))
        self.codecs = frozenset(BUILTIN_CODECS) | extra
        self.fs = fs or PosixFS()
        self.clock = clock or SystemClock()
        self.root = os.path.abspath(os.fspath(root))
        self.segment_target_bytes = segment_target_bytes
        self.reserve_bytes = reserve_bytes
        self._visibility = (visibility_retries, visibility_backoff)
        self.backend = self._check_backend(backend)
        self.fs = self.backend.filesystem(self.fs)  # its sync hook and count (fault, metrics)
        self._init_pool()
        self._session = ReadSession(self.fs, self.root, self.run_id, self.clock,
                                    visibility_retries=visibility_retries,
                                    visibility_backoff=visibility_backoff,
                                    pack_status=self._pack_status)
        self._writer: WriterIncarnation | None = None
        self._write_lock = threading.Lock()
        self.catalog = Catalog(self.fs, self.root, self.run_id)  # owners belong to the run
        self.closed = False

    # --- pool ---------------------------------------------------------------------------
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
        """Create the pool marker once and check its format.

        The marker is created exclusively (never renamed over a name other clients may
        have cached) and its content is fixed, so a marker that a crash left empty or torn
        is simply rewritten in place — concurrent repairers write the same bytes."""
        marker = os.path.join(self.root, "POOL")
        body = json.dumps({"format": "straw-pool", "version": POOL_FORMAT}).encode()
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
                        self.fs.writev(fd, [body], 0)
                        self.fs.fsync(fd)
                    finally:
                        self.fs.close(fd)
                    self.fs.fsync_dir(self.root)
                    continue
                try:
                    info = json.loads(data)
                except ValueError:
                    info = None
                if isinstance(info, dict):
                    break
                # empty, zeros or torn: our own creation was cut short by a crash
                fd = self.fs.open(marker, write=True)
                try:
                    self.fs.truncate(fd, 0)
                    self.fs.writev(fd, [body], 0)
                    self.fs.fsync(fd)
                finally:
                    self.fs.close(fd)
            else:
                raise StorageUnavailable(f"pool marker {marker} did not become readable")
        except OSError as e:
            raise storage_error(e, f"cannot open pool {self.root}") from e
        if info.get("format") != "straw-pool" or not isinstance(info.get("version"), int):
            raise UnsupportedSchema(f"{marker} is not a straw pool marker: {info!r}")
        if info["version"] > POOL_FORMAT:
            raise UnsupportedSchema(
                f"pool {self.root} has format version {info['version']}; this straw reads "
                f"up to {POOL_FORMAT}. Upgrade straw"
            )

    # --- fork safety (straw.process) ---------------------------------------------------
    def _process_subject(self) -> str:
        return (f"SharedFilesystemStore of run {self.run_id!r} (writer {self.writer_id!r}) "
                f"at {self.root}")

    def _drop_inherited(self) -> None:
        for part in (self._writer, self._session, self.catalog):
            if part is not None:
                part._drop_inherited()

    # --- context manager ----------------------------------------------------------------
    def __enter__(self) -> SharedFilesystemStore:
        self._check_process()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Seal the open pack, release the writer, close files.  Idempotent.  In a forked
        child it does not raise and only closes the child's copies of the descriptors:
        the pack, the writer lock and the catalog are the parent's."""
        if self.closed:
            return
        self.closed = True
        if self._in_forked_child():
            self._drop_inherited()  # no lock taken: another thread may have held it
            return
        try:
            with self._write_lock:
                if self._writer is not None:
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
                     submission_id: str) -> list[RecordSetRef]:
        """Several publications in one durable write, one reference each.  A dependency
        is a ``RecordSetRef`` or the index of an earlier publication of this call."""
        self._check_process()
        self._check_submission_id(submission_id)
        if isinstance(publications, (str, bytes)) or not isinstance(publications, Sequence):
            raise TypeError("publications must be a list of straw.Publication")
        normalized = [self._normalize(p, i, len(publications)) for i, p in
                      enumerate(publications)]
        digests = tuple(n[2] for n in normalized)
        with self._write_lock:
            self._check_open()
            writer = self._ensure_writer()
            known = writer.index.get(submission_id)
            if known is not None:
                if known.digests != digests:
                    raise IdempotencyConflict(
                        f"submission_id {submission_id!r} was already used by writer "
                        f"{self.writer_id!r} for different content; use a new submission_id "
                        "for new content"
                    )
                return list(known.refs)
            self._check_dependencies(normalized)
            refs = self._write(writer, submission_id, normalized)
            writer.index[submission_id] = Submission(digests, tuple(refs))
            return refs

    def lookup_submission(self, submission_id: str) -> list[RecordSetRef] | None:
        """The references published under ``submission_id`` by this writer id (across its
        restarts), or None."""
        self._check_process()
        self._check_submission_id(submission_id)
        with self._write_lock:
            self._check_open()
            known = self._ensure_writer().index.get(submission_id)
        return list(known.refs) if known else None

    def _write(self, writer: WriterIncarnation, submission_id: str,
               normalized: list[_Normalized]) -> list[RecordSetRef]:
        estimate = sum(sum(len(r[4]) for r in recs) + 1024 for recs, _, _ in normalized)
        start = writer.next_offset(estimate)
        pos = start
        extents = []
        placed: list[RecordSetRef] = []
        edges: list[tuple[Extent, list[Extent]]] = []
        with_edges = set(self.catalog.state.edges)  # extents known to have dependencies
        for i, (recs, deps, digest) in enumerate(normalized):
            dep_rows = []
            dep_refs = [placed[d] if isinstance(d, int) else d for d in deps]
            for ref in dep_refs:
                dep_rows.append([ref.path, ref.offset, ref.size, bytes.fromhex(ref.checksum),
                                 bytes.fromhex(ref.digest), ref.records])
            # D1/D4: dependencies are retained (as edges of this staged extent) before its
            # bytes are written.  Edges that cannot matter are skipped: a dependency in the
            # same pack with no dependencies of its own is protected by the pack itself.
            targets = [(r.path, r.offset) for r in dep_refs]
            if any(p != writer.pack_rel or (p, o) in with_edges for p, o in targets):
                edges.append(((writer.pack_rel, pos), targets))
                with_edges.add((writer.pack_rel, pos))
            ext = encode_extent(run_id=self.run_id, submission_id=submission_id, index=i,
                                count=len(normalized), digest=digest, records=recs,
                                dependencies=dep_rows, offset=pos, group_start=start)
            extents.append(ext)
            placed.append(RecordSetRef(self.run_id, writer.pack_rel, pos, ext.entry.size,
                                       ext.entry.checksum.hex(), digest.hex(), len(recs)))
            pos += ext.entry.size
        if edges:
            self.catalog.record_edges(edges)
        return writer.append(extents)

    def _check_dependencies(self, normalized: list[_Normalized]) -> None:
        """D1/D4: every dependency must name a publication of the pool (checked after the
        idempotency lookup, so a retry is answered as the original was, D7)."""
        for i, (_, deps, _) in enumerate(normalized):
            for k, d in enumerate(deps):
                if isinstance(d, RecordSetRef):
                    self.check_published(d, f"publications[{i}].dependencies[{k}]")

    def _ensure_writer(self) -> WriterIncarnation:
        if self._writer is None:
            self._writer = WriterIncarnation(
                self.fs, self.root, self.run_id, self.writer_id, self.clock, self.catalog,
                segment_target_bytes=self.segment_target_bytes,
                reserve_bytes=self.reserve_bytes,
            )
        return self._writer

    def _check_open(self) -> None:
        self._check_process()  # first: a forked child is refused before any lock
        if self.closed:
            raise ValueError(f"store of run {self.run_id!r} at {self.root} is closed")

    @staticmethod
    def _check_submission_id(submission_id: object) -> None:
        if not isinstance(submission_id, str):
            raise TypeError(f"submission_id must be a str, got {type(submission_id).__name__}")
        if not submission_id or len(submission_id) > 1024:
            raise ValueError("submission_id must be a non-empty str of at most 1024 characters")

    def _normalize(self, pub: object, i: int, n: int) -> _Normalized:
        """Validate one publication; returns its records, dependencies and digest."""
        where = f"publications[{i}]"
        if not isinstance(pub, Publication):
            raise TypeError(f"{where} must be a straw.Publication, got {type(pub).__name__}")
        if isinstance(pub.records, (str, bytes)) or not isinstance(pub.records, Sequence):
            raise TypeError(f"{where}.records must be a list of straw.Record")
        seen: set[str] = set()
        recs = []
        ident: list[Any] = []
        for j, r in enumerate(pub.records):
            rw = f"{where}.records[{j}]"
            if not isinstance(r, Record):
                raise TypeError(f"{rw} must be a straw.Record, got {type(r).__name__}")
            if not isinstance(r.record_id, str):
                raise TypeError(f"{rw}.record_id must be a str, got {type(r.record_id).__name__}")
            if not r.record_id or len(r.record_id) > 1024:
                raise ValueError(f"{rw}.record_id must be a non-empty str of at most 1024 chars")
            if r.record_id in seen:
                raise ValueError(f"{rw}.record_id {r.record_id!r} is a duplicate; record ids "
                                 "must be unique within a publication")
            seen.add(r.record_id)
            if not isinstance(r.codec, str):
                raise TypeError(f"{rw}.codec must be a str, got {type(r.codec).__name__}")
            if r.codec not in self.codecs:
                hint = "" if NAME_RE.match(r.codec) else " (not a valid codec name)"
                raise ValueError(
                    f"{rw}.codec {r.codec!r} is not registered{hint}; open the store with "
                    f"codecs=({r.codec!r},) (built-ins: {', '.join(BUILTIN_CODECS)})"
                )
            if r.tokens is not None:  # None means "no token count"
                check_count(f"{rw}.tokens", r.tokens)
            meta = canonical_metadata(r.metadata, rw)
            view = payload_view(r.payload, rw)
            h = xxhash.xxh3_128_digest(view)
            recs.append((r.record_id, r.codec, meta, r.tokens, view, h))
            ident.append([r.record_id, r.codec, meta, r.tokens, h])
        deps: list[Any] = []
        dep_ident: list[Any] = []
        for k, d in enumerate(pub.dependencies):
            dw = f"{where}.dependencies[{k}]"
            if isinstance(d, int) and not isinstance(d, bool):
                if not 0 <= d < i:
                    raise ValueError(f"{dw} = {d} must index an earlier publication of this "
                                     f"call (0..{i - 1})")
                deps.append(d)
                dep_ident.append(["#", d])
            elif isinstance(d, RecordSetRef):
                d.check()
                if d.run_id != self.run_id:
                    raise InvalidReference(f"{dw} belongs to run {d.run_id!r}; dependencies "
                                           f"must be in this store's run {self.run_id!r}")
                deps.append(d)
                dep_ident.append([d.path, d.offset, d.checksum])
            else:
                raise TypeError(f"{dw} must be a RecordSetRef or an int index, got "
                                f"{type(d).__name__}")
        digest = xxhash.xxh3_128_digest(msgpack.packb([ident, dep_ident], use_bin_type=True))
        return recs, deps, digest

    # --- retention (D1-D4) ----------------------------------------------------------------
    def retain(self, owner: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        """Make ``refs`` (and, transitively, their dependencies) the durable roots of
        this run's ``owner``, replacing its previous roots (another run's owner of the same
        name is a different owner).  ``InvalidReference`` if one was already
        reclaimed.  Retain a successor before releasing its predecessor."""
        self._check_open()
        check_owner(owner)
        items = _listed(refs)
        extents = self._extents(items, "refs")
        self._check_all_published(items, "refs")
        self.catalog.retain(owner, extents)

    def release(self, owner: str) -> bool:
        """Drop this run's ``owner``.  Returns False (and changes nothing) if this run has
        no such owner (another run's owner of that name is never touched).  Pins left
        behind by a crashed reader of this run (``pin:...``) can be released here."""
        self._check_open()
        if not isinstance(owner, str):
            raise TypeError(f"owner must be a str, got {type(owner).__name__}")
        if owner.startswith(INTERNAL_OWNER_PREFIXES):
            raise ValueError(f"owner {owner!r} belongs to straw itself (queue or staging)")
        return self.catalog.release(owner)

    def release_publications(self, refs: Iterable[RecordSetRef]) -> int:
        """Drop the staging protection of fresh publications (adopt them with ``retain``
        first if they must live on).  Returns how many were still staged."""
        self._check_open()
        return self.catalog.unstage(self._extents(refs, "refs"))

    def pin(self, refs: Iterable[RecordSetRef | RecordRef]) -> Pin:
        """``with store.pin(refs):`` — a durable reader owner held for the block.  A
        reader that dies inside the block leaves its pin (``pin:host:pid:...``) for an
        operator to ``release``: nothing is reclaimed under a reader that may be alive."""
        self._check_open()
        items = _listed(refs)
        return Pin(self, self._extents(items, "refs"), items)

    def collect_garbage(self) -> dict[str, Any]:
        """Reclaim this run's sealed packs that no owner, pin or staged publication of any
        run reaches (D4): tombstone them durably, then unlink them (D3).  Packs of other
        runs sharing the root are never deleted.  First, packs a writer left open are
        sealed in the catalog on its behalf when that writer is dead (its lock is free;
        ``straw.recovery``), as are this store's own packs abandoned after an I/O error.
        Every read session of this process on this pool then drops its cached descriptors
        of the reclaimed packs, so that the reclaimed bytes are free when this returns.
        Returns the reclaimed files and bytes, the tombstoned paths, interrupted
        collections it finished, this run's packs and owners still retained, the packs
        sealed for dead writers (``sealed_for_dead_writers``) and the damage their
        recovery found (``damaged``)."""
        self._check_open()
        with self._write_lock:
            if self._writer is not None:
                self._writer.seal_abandoned()
        on_behalf, damaged = seal_dead_writers(self.fs, self.root, self.catalog, self.clock,
                                              run=self.run_id)
        result = self.catalog.collect()
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
        if isinstance(refs, (RecordSetRef, RecordRef, str, bytes)):
            raise TypeError(f"{where} must be a list of references, not a single one")
        out = []
        for i, r in enumerate(refs):
            if isinstance(r, RecordRef):
                r = r.record_set
            if not isinstance(r, RecordSetRef):
                raise TypeError(f"{where}[{i}] must be a RecordSetRef, got {type(r).__name__}")
            r.check()
            if r.run_id != self.run_id:
                raise InvalidReference(f"{where}[{i}] belongs to run {r.run_id!r}, this store "
                                       f"is run {self.run_id!r}")
            out.append((r.path, r.offset))
        return out

    def _check_all_published(self, refs: Sequence[RecordSetRef | RecordRef], where: str
                             ) -> None:
        """Each of ``refs`` (checked by ``_extents`` already) must name a publication: what
        an owner retains must exist (D4)."""
        for i, r in enumerate(refs):
            self.check_published(r.record_set if isinstance(r, RecordRef) else r,
                                 f"{where}[{i}]")

    # --- reading ------------------------------------------------------------------------
    def read(self, ref: RecordSetRef) -> list[Record]:
        """The publication's records, checked against the reference (D6)."""
        self._check_process()
        return self._session.read(ref)

    def read_record(self, record_ref: RecordRef) -> Record:
        self._check_process()
        return self._session.read_record(record_ref)

    def manifest(self, ref: RecordSetRef) -> Manifest:
        self._check_process()
        return self._session.manifest(ref)

    def validate(self, ref: RecordSetRef) -> tuple[RecordRef, ...]:
        self._check_process()
        return self._session.validate(ref)

    def read_session(self) -> ReadSession:
        """A scoped reader with its own cache of open packs and checked manifests."""
        self._check_process()
        retries, backoff = self._visibility
        return ReadSession(self.fs, self.root, self.run_id, self.clock,
                           visibility_retries=retries, visibility_backoff=backoff,
                           pack_status=self._pack_status)

    def check_published(self, ref: RecordSetRef, where: str = "ref") -> None:
        """``InvalidReference`` (naming ``where``) unless ``ref`` names a publication of
        this pool: the frame at its offset is an extent of its size and checksum.  Asked
        before a reference is retained, pinned or depended on (one small read)."""
        self._check_process()
        try:
            self._session.check_published(ref)
        except InvalidReference as e:
            raise InvalidReference(f"{where}: {e}") from None

    def _pack_status(self, path: str) -> PackStatus | None:
        """What the catalog knows of pack ``path``, read fresh under the pool lock; None
        if it cannot tell.  Reads ask only after a read failed, to tell a final pack
        (nothing to wait for) from another client's visibility lag."""
        if self.closed or not self.fs.probe(self.catalog.path):
            return None
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
                elif name.endswith(".strw"):
                    files += 1
                    total += st.size
        return {"pack_files": files, "bytes": total}

    def writer_info(self) -> Mapping[str, Any] | None:
        """This store's writer (once it published or looked a submission up): writer id,
        incarnation, open pack, and ``damaged``: the damaged extents its recovery of
        earlier incarnations found and did not index (pack, offset, reason)."""
        self._check_process()
        return self._writer.describe() if self._writer else None


# Owner names straw uses itself: applications cannot retain under them.
INTERNAL_OWNER_PREFIXES = ("queue:", "staged:", "checkpoint:")
RESERVED_OWNER_PREFIXES = INTERNAL_OWNER_PREFIXES + ("pin:",)


def check_owner(owner: object) -> str:
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, got {type(owner).__name__}")
    if not owner or len(owner) > 1024:
        raise ValueError("owner must be a non-empty str of at most 1024 characters")
    if owner.startswith(RESERVED_OWNER_PREFIXES):
        raise ValueError(
            f"owner {owner!r} uses a reserved prefix ({', '.join(RESERVED_OWNER_PREFIXES)}); "
            "choose another name"
        )
    return owner


def _listed(refs: Any) -> Any:
    """``refs`` as a list, so that it can be walked twice (a single reference is left as
    it is, for ``_extents`` to refuse)."""
    if isinstance(refs, (RecordSetRef, RecordRef, str, bytes)):
        return refs
    return list(refs)


class Pin:
    """A reader's durable protection, held while the ``with`` block runs."""

    def __init__(self, store: SharedFilesystemStore, extents: list[Extent],
                 refs: Sequence[RecordSetRef | RecordRef] = ()) -> None:
        self.store = store
        self.extents = extents
        self.refs = refs
        self.owner = f"pin:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
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


__all__ = ["SharedFilesystemStore", "BUILTIN_CODECS", "Pin", "StorageUnavailable"]
