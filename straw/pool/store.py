"""``SharedFilesystemStore``: publish immutable publications into packs; read them back
checked, from any client of the pool.

Pool layout::

    <root>/ONLINE_GC             present once a store opened the pool with online_gc=True
    <root>/POOL                  format marker (UnsupportedSchema if newer) and the
                                 pool's id (``pool_id``, written once by its creator)
    <root>/runs/<run_id>/...     writers, their incarnations and packs (straw.pool.writer),
                                 queues (straw.coordinator)
    <root>/CATALOG               owners, packs, tombstones of every run (straw.catalog)

Several runs may share one root and are isolated: owners (and pins, and queues) belong to
a run, so a store sees and changes only its own run's owners, and its ``collect_garbage``
reclaims only its own run's packs; reachability is pool-wide, so no run reclaims what
another retains.

The store validates every input before any byte is written (``TypeError``/``ValueError``
naming the field; counts and sizes are ints within 64 bits, bools refused, see
``straw.pool.arguments``), lays publications out as extents (``straw.pool.pack``), writes a
``publish_many`` batch with one ``writev`` and one data sync, and returns references only
after that sync (D1).  Submission ids are the idempotency ids (D7): a retry with the same
id and content returns the original references, different content raises
``IdempotencyConflict``; the index survives writer restarts (``straw.pool.writer``).  Reads
go through ``straw.reader.ReadSession`` (D6); after a failed read it may ask the catalog
whether the pack is final (``_pack_status``).  A reference that is retained, pinned or
depended on must name a publication of the pool (``check_published``: one small read of
its frame header), else ``InvalidReference`` before anything is written.

The class states the store's contract and delegates, one concern per part it holds:
``Publisher`` (``straw.pool.publisher``: publication and idempotency), ``Retention``
(``straw.pool.retention``: owners, pins, staging, holds) and ``WriterReceipts``
(``straw.pool.receipts``: other writers' receipts and retirement); ``straw.pool.opening``
opens the pool and ``straw.pool.collection`` runs its collection.  The store keeps the
state they share: the writer's slot, the write lock, the read session and the catalog.

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

import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..backend import FilesystemBackend
from ..clock import Clock, SystemClock
from ..durable import framing
from ..errors import Closed, InvalidReference, StorageUnavailable
from ..fs import Filesystem, PosixFS
from ..process import ProcessBound
from ..read.extents import envelope_dict
from ..read.session import ReadSession
from ..read.visibility import PackStatus
from . import hold_owners
from .arguments import BUILTIN_CODECS, MANIFEST_CODECS, PublicationRules, check_options
from .catalog.catalog import Catalog
from .catalog.state import Extent
from .collection import collect, disk_usage, pack_status
from .opening import check_backend, mark_online_gc, open_pool
from .pack import EXTENT_PREFIX
from .publisher import Publisher
from .receipts import WriterReceipts
from .records import Manifest, Publication, Record
from .refs import RecordRef, RecordSetRef, SegmentRef, check_name
from .retention import Pin, Retention
from .writer import WriterIncarnation

DEFAULT_SEGMENT_TARGET = 256 * 1024 * 1024
DEFAULT_RESERVE = 64 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = 16 * 1024**3  # straw-queue's default; enforced on request
DEFAULT_MAX_BUFFER_BYTES = 512 * 1024**2
# straw-queue 0.1.6's records per segment (payload records plus one manifest per
# publication), which its callers batch ``publish_many`` by.  Neither it nor straw refuses
# a larger call (straw's extents have no record-count bound); the constant is the batching
# hint, with straw-queue's value, so that callers sizing batches by it behave the same.
MAX_RECORDS = 10_000


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
        extra = check_options(segment_target_bytes, max_record_bytes, max_buffer_bytes,
                              reserve_bytes, visibility_retries, visibility_backoff,
                              online_gc, enforce_limits, codecs)
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
        self.backend = check_backend(self.fs, self.root, backend)
        self.fs = self.backend.filesystem(self.fs)  # its sync hook and count (fault, metrics)
        self.pool_id: str | None = open_pool(self.fs, self.root, self.clock, self._visibility)
        if online_gc:
            mark_online_gc(self.fs, self.root)
        self._session = ReadSession(self.fs, self.root, self.run_id, self.clock,
                                    visibility_retries=visibility_retries,
                                    visibility_backoff=visibility_backoff,
                                    pack_status=self._pack_status, pool_id=self.pool_id,
                                    backend=self.backend)
        self._writer: WriterIncarnation | None = None
        self._write_lock = threading.Lock()
        self.catalog = Catalog(self.fs, self.root, self.run_id)  # owners belong to the run
        # its parts: retention (with the writer's holds), publication, writer receipts
        self._retention = Retention(self)
        rules = PublicationRules(self.run_id, self.codecs, enforce_limits, max_record_bytes,
                                 self._session._canonical)
        self._publisher = Publisher(self, rules, self._retention)
        self._receipts = WriterReceipts(self)
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
        m = dict(self._publisher.metrics)
        m["publish_seconds"] = list(m["publish_seconds"])
        m["buffer_bytes"] = 0
        return m

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
                    self._retention.drop_holds()
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
        return self._publisher.publish_many(publications, submission_id=submission_id)

    def write_records(self, records: Sequence[Record], *, submission_id: str
                      ) -> tuple[RecordRef, ...]:
        """Write records durably without publishing them as a set: one extent, whose
        records are ordinals 0..n-1 of it.  Name them in a publication later with
        ``record_set``.  Staged like every publication until ``release_publications``
        (of them, or of a record set naming them) or a durable owner takes over."""
        return self._publisher.write_records(records, submission_id=submission_id)

    def record_set(self, refs: Sequence[RecordRef], *, submission_id: str,
                   dependencies: Sequence[RecordSetRef] = ()) -> RecordSetRef:
        """Publish records that already exist (``RecordRef``s, e.g. of ``write_records``)
        as one publication, without copying their bytes: an extent holding only a
        manifest that names them (and ``dependencies``).  They (and the dependencies)
        are retained through it for as long as it is (D4).  Its digest is the one a
        publication of the same records and dependencies has."""
        return self._publisher.record_set(refs, submission_id=submission_id,
                                          dependencies=dependencies)

    def lookup_submission(self, submission_id: str) -> tuple[RecordSetRef, ...] | None:
        """The references published under ``submission_id`` by this writer id (across its
        restarts; a tuple, as ``publish_many`` returns them), or None (through
        publish/publish_many if it was, else through record_set, else write_records:
        ``publication_receipt`` asks for one)."""
        return self._publisher.lookup_submission(submission_id)

    def _ensure_writer(self) -> WriterIncarnation:
        if self._writer is None:
            self._writer = WriterIncarnation(
                self.fs, self.root, self.run_id, self.writer_id, self.clock, self.catalog,
                segment_target_bytes=self.segment_target_bytes,
                reserve_bytes=self.reserve_bytes,
            )
            # a predecessor's holds are this incarnation's now (it may be the retrier)
            self._retention.holds = hold_owners.holds_of(self.catalog, self.writer_id)
        return self._writer

    def _check_open(self) -> None:
        self._check_process()  # first: a forked child is refused before any lock
        if self.closed:
            raise Closed(f"store of run {self.run_id!r} at {self.root} is closed; open a new "
                         "SharedFilesystemStore")

    # --- retention (D1-D4) ----------------------------------------------------------------
    def retain(self, owner: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        """Make ``refs`` (and, transitively, their dependencies) the durable roots of
        this run's ``owner``, replacing its previous roots (another run's owner of the same
        name is a different owner).  ``InvalidReference`` if one was already
        reclaimed.  Retain a successor before releasing its predecessor."""
        self._retention.retain(owner, refs)

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
        return self._retention.release(owner, only_if=only_if)

    def release_publications(self, refs: Iterable[RecordSetRef]) -> int:
        """Drop the staging protection of fresh publications and of what they depend on,
        transitively (straw-queue's rule: releasing a result releases the tensors it
        references; retain first what must live on, and release only after every submit
        naming any of them was acknowledged: SPEC ``release_publications``).  A dependency
        that another staged publication, an owner or a pin still reaches stays protected
        through it.  Returns how many of ``refs`` were still staged."""
        return self._retention.release_publications(refs)

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
        return self._retention.staged_dependencies(segs, known)

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
        return self._retention.pin(refs, owner)

    def owners(self) -> list[str]:
        """The names of this run's owners (applications', pins, queues)."""
        return self._retention.owners()

    def hold(self, key: str, refs: Iterable[RecordSetRef | RecordRef]) -> None:
        """Retain ``refs`` for as long as this store's writer lives, under the hold owner
        of ``key`` (``straw.pool.hold_owners``; taking it again replaces its roots).  It goes with
        ``release_hold(key)``, with this store's ``close``, or with a collection once this
        writer is dead.  For a step that must keep data until a name of its own exists
        (an archive's index): a crash before that name leaves nothing retained for ever."""
        self._retention.hold(key, refs)

    def release_hold(self, key: str) -> bool:
        """Drop the hold of ``key`` taken by ``hold``; False if this store holds none."""
        return self._retention.release_hold(key)

    # --- collection and repair ------------------------------------------------------------
    def collect_garbage(self) -> dict[str, Any]:
        """Reclaim this run's sealed packs that no owner, pin or staged publication of any
        run reaches (D4): tombstone them durably, then unlink them (D3).  Packs of other
        runs sharing the root are never deleted.  First, packs a writer left open are
        sealed in the catalog on its behalf when that writer is dead (its lock is free;
        ``straw.pool.recovery``), as are this store's own packs abandoned after an I/O error.
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
        return collect(self)

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
        """straw's own view of a publication's checked manifest (``straw.pool.records.Manifest``:
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
        return self._receipts.publication_receipt(writer_id, api=api,
                                                     submission_id=submission_id)

    def retire_writer(self, writer_id: str, *, policy: str = "recover"
                      ) -> list[RecordSetRef] | list[Any]:
        """Fence writer ``writer_id`` of this run for good: a store that later tries to
        publish as it raises ``WriterFenced`` (publish with a new writer).  Its open packs
        are sealed in the catalog on its behalf.  ``policy="recover"`` returns its
        results still staged (published, not yet released or adopted: yours to retain
        or release); ``"abandon"`` returns nothing and leaves every owner and staging as
        it is.  ``WriterBusy`` while a live store holds that writer."""
        return self._receipts.retire_writer(writer_id, policy=policy)

    def _pack_status(self, path: str) -> PackStatus | None:
        """What the catalog knows of pack ``path`` (``straw.pool.collection.pack_status``)."""
        return pack_status(self, path)

    # --- inspection ---------------------------------------------------------------------
    def disk_usage(self) -> dict[str, int]:
        """Pack files and bytes of this run on disk (for demos and operators)."""
        self._check_process()
        return disk_usage(self.fs, self.root, self.run_id)

    def writer_info(self) -> Mapping[str, Any] | None:
        """This store's writer (once it published or looked a submission up): writer id,
        incarnation, open pack, and ``damaged``: the damaged extents its recovery of
        earlier incarnations found and did not index (pack, offset, reason)."""
        self._check_process()
        return self._writer.describe() if self._writer else None


__all__ = ["SharedFilesystemStore", "BUILTIN_CODECS", "MAX_RECORDS", "Pin", "StorageUnavailable"]
