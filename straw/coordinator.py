"""``Coordinator``: the single writer of one queue's journal.

Layout under the pool root (``Q`` = ``runs/<run_id>/queues/<namespace>/<queue_id>``)::

    Q/epochs/e-<n>          one file per epoch, created exclusively; it reads "started"
                            once the epoch's start record is durable in the journal
    Q/epochs/e-<n>.lock     flocked by epoch n's coordinator while it lives; its text names
                            it (host, pid, since)
    Q/journal/              segments and snapshots (straw.journal)

A queue belongs to the run of its store, like its catalog owner ``queue:<ns>/<id>`` (an
owner of that run): coordinators of runs sharing a root with the same ``queue_id`` serve
different queues, and no run can recover, lease or fence another run's queue.  (Before,
queues lived at ``queues/<namespace>/<queue_id>`` for the whole root; a coordinator that
finds such a directory and no queue of its run refuses to start rather than silently
open an empty queue beside it.)

Every call follows the same path: check the arguments; adopt any data the transaction
names under the queue's owner in the catalog (D2: retain before journal; a reference must
name a publication of the pool, ``store.check_published``, so the queue never roots or
journals a fabricated one — checked at adoption, after an idempotent retry was answered
from the journal, D7); then, under the
coordinator's mutex, validate against the state, apply the transaction to the in-memory
``QueueState`` and enqueue it in the journal; then wait, outside the mutex, until its
group is durable (group commit: concurrent calls share one fsync) and reply.  An error
before the enqueue leaves the journal unchanged.  Argument checks raise ``TypeError`` or
``ValueError`` naming the argument (``straw.checks``): everything the journal stores as an
integer (priorities, scheduling keys, attempts, cursors, tokens, counts) is range-checked
to 64 bits and refuses bools, and metadata is checked JSON (``canonical_metadata``), all
before anything is adopted or journaled.

Exclusivity and fencing (D8).  Every coordinator holds the lock of its own epoch for its
whole life.  A new coordinator looks at the *latest* epoch's lock: held means that
coordinator is alive (serving, or paused), and the newcomer fails at once naming it —
unless ``takeover=True`` says the holder is paused or partitioned and must be fenced.  (An
older, paused coordinator still holding an older epoch's lock does not count: it is fenced
already.)  ``recover=True`` opens an existing queue: it creates the next epoch file
exclusively (durably) *before* reading the journal, then replays snapshot + suffix (D9),
writes an epoch record revoking every older lease (durable before service), and replaces
the queue owner's roots in the catalog under the new epoch.  After every journal sync the
coordinator checks that no newer epoch file exists before it replies; an old coordinator
that was paused and resumes therefore never acknowledges anything (its callers get
``IndeterminateCommit``, later calls ``Fenced``), and its catalog updates carry its old
epoch, which the catalog ignores.

Damaged or missing journal data fails closed (D6).  Once the new epoch's start record is
durable, its epoch file is marked *started* (durably); recovery passes the newest started
epoch to ``journal.recover``, so a journal that lost every segment of it is
``CorruptData``, never an older state.  A corrupt journal makes ``recover=True`` raise
``CorruptData`` naming the file and offset; nothing is cut or deleted (there is no repair
path: restore the journal from a backup).

Leases carry the epoch; deadlines are in memory (recovery revokes all leases anyway).
Expired leases are journaled as ``expire`` when noticed (acquire, heartbeat, complete).

Fork safety (``straw.process``).  A coordinator belongs to the process that opened it: its
epoch lock, its journal and its in-memory queue state are the parent's after a fork (the
child's copy of the lock descriptor shares the parent's open file description: it would
not keep the child out, and its unlock would release the parent's lock).  In a forked
child every method raises ``ForkedProcess`` before taking any lock; ``close()`` only
closes the child's copies of the descriptors.  Opening a coordinator in a child on a
store the child inherited is refused before anything is created (a new epoch file would
fence the parent).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgpack
import xxhash

from . import holder
from . import journal as journal_mod
from .catalog import Announcement, Extent
from .catalog_roots import RootSet
from .checks import check_count, check_int, check_seconds, short_repr
from .clock import Clock
from .errors import (
    Fenced,
    IdempotencyConflict,
    IndeterminateCommit,
    InvalidReference,
    LeaseExpired,
    ResourceLimitExceeded,
    StaleAttempt,
    StorageUnavailable,
    UnsafeRecovery,
    UnsupportedSchema,
)
from .fs import Filesystem
from .pack import storage_error
from .process import OPEN_QUEUE_IN_CHILD, ProcessBound, close_quietly
from .queue_state import (
    COMPLETED,
    LEASED,
    PENDING,
    TERMINAL,
    QueueState,
    RefTuple,
    bulk_objects,
)
from .queue_types import (
    INT64,
    AcquireResult,
    Assignment,
    BatchInfo,
    Commit,
    CommitPage,
    ConsumerState,
    ConsumerToken,
    Lease,
    Limits,
    ReadLease,
    Receipt,
    SubmitResult,
    TaskSpec,
    TaskStatus,
)
from .refs import NAME_RE, RecordSetRef, canonical_metadata
from .siblings import DEFAULT_GROUP_WAIT
from .store import SharedFilesystemStore

_EPOCH_RE = re.compile(r"^e-([0-9]{6,})\Z")
_STARTED = b"started\n"  # an epoch file's content once its epoch-start record is durable
DEFAULT_CONSUMER = "training"


def queue_dir(root: str, run_id: str, namespace: str, queue_id: str) -> str:
    """The directory of a run's queue (queues belong to a run)."""
    return os.path.join(root, "runs", run_id, "queues", namespace, queue_id)


def _ref_tuple(ref: RecordSetRef) -> RefTuple:
    return (ref.path, ref.offset, ref.size, ref.checksum, ref.digest, ref.records)


def _digest(value: Any) -> str:
    return xxhash.xxh3_128_hexdigest(msgpack.packb(value, use_bin_type=True))


class Coordinator(ProcessBound):
    """The coordinator of queue ``queue_id`` in ``namespace`` of ``store``'s pool."""

    _process_state = "its epoch lock, journal and queue state"
    _process_remedy = OPEN_QUEUE_IN_CHILD

    def __init__(
        self,
        store: SharedFilesystemStore,
        *,
        queue_id: str = "rollout",
        namespace: str = "default",
        recover: bool = False,
        lease_seconds: float = 60.0,
        clock: Clock | None = None,
        limits: Limits | None = None,
        takeover: bool = False,
        consumer_id: str = DEFAULT_CONSUMER,
        snapshot_every: int = 20_000,
        segment_target_bytes: int = 64 << 20,
        group_wait: float = DEFAULT_GROUP_WAIT,
    ) -> None:
        self._bind_process()
        if not isinstance(store, SharedFilesystemStore):
            raise TypeError(f"store must be a SharedFilesystemStore, got {type(store).__name__}")
        store._check_process()  # an inherited store: refused before any epoch is created
        for name, value in (("queue_id", queue_id), ("namespace", namespace)):
            if not isinstance(value, str) or not NAME_RE.match(value):
                raise ValueError(f"{name} {short_repr(value)} must be 1-128 letters, digits, "
                                 "'.', '_' or '-'")
        check_seconds("lease_seconds", lease_seconds, positive=True)
        check_seconds("group_wait", group_wait, positive=False)
        check_count("snapshot_every", snapshot_every, minimum=1)
        check_count("segment_target_bytes", segment_target_bytes, minimum=1)
        _check_id("consumer_id", consumer_id)
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be a straw Limits, got {type(limits).__name__}")
        self.store = store
        self.fs = store.fs
        self.queue_id = queue_id
        self.namespace = namespace
        self.owner = f"queue:{namespace}/{queue_id}"
        self.lease_seconds = float(lease_seconds)
        self.clock = clock or store.clock
        self.limits = limits or Limits()
        self.consumer_id = consumer_id
        self.snapshot_every = snapshot_every
        self.segment_target_bytes = segment_target_bytes
        self.group_wait = group_wait
        self.dir = queue_dir(store.root, store.run_id, namespace, queue_id)
        self.epochs_dir = os.path.join(self.dir, "epochs")
        self.journal_dir = os.path.join(self.dir, "journal")
        self._mutex = threading.RLock()
        self._deadlines: dict[str, float] = {}
        self._rooted = RootSet()  # the queue owner's roots as this coordinator knows them
        self._adding: Counter[Extent] = Counter()
        self._unstage: set[Extent] = set()
        self._broken: BaseException | None = None
        self._closed = False
        self._last_seq = 0
        self._seq_commits: dict[int, int] = {}
        self._durable_commits = 0
        self._since_snapshot = 0
        self.snapshot_failures = 0
        self._refuse_legacy_layout()
        try:
            self.fs.makedirs_durable(self.epochs_dir)
            self.fs.makedirs_durable(self.journal_dir)
        except OSError as e:
            raise storage_error(e, f"cannot create queue directory {self.dir}") from e
        self._lock_fd: int | None = None
        try:
            self._open(recover, takeover)
        except BaseException:
            self._release_lock()
            raise

    def _refuse_legacy_layout(self) -> None:
        """A queue of the former root-wide layout is nobody's run's: refuse to start an
        empty queue of this run beside it (its owner keeps its data retained)."""
        old = os.path.join(self.store.root, "queues", self.namespace, self.queue_id)
        if self.fs.exists(self.epochs_dir) or not self.fs.exists(old):
            return
        raise UnsupportedSchema(
            f"queue {self.namespace}/{self.queue_id} exists at {old}, the root-wide layout of "
            f"an older straw; queues now belong to a run. If it is run {self.store.run_id!r}'s "
            f"queue, stop its coordinators and move the directory to {self.dir}"
        )

    # --- exclusivity, epochs, recovery (D8, D9) ------------------------------------------
    def _check_latest_is_dead(self, latest: int, takeover: bool) -> None:
        """Refuse to start while the latest epoch's coordinator lives (naming it)."""
        fd, holder_desc = holder.take(self.fs, self._epoch_path(latest) + ".lock", self.clock)
        holder.release(self.fs, fd)  # we only looked: it was free, so that one is gone
        if fd is None and not takeover:
            raise UnsafeRecovery(
                f"queue {self.namespace}/{self.queue_id} is served by {holder_desc} (epoch "
                f"{latest}). Use that coordinator; or, if it is paused or partitioned and must "
                "be replaced, open with recover=True, takeover=True (it will be fenced)"
            )

    def _release_lock(self) -> None:
        holder.release(self.fs, self._lock_fd)
        self._lock_fd = None

    def _process_subject(self) -> str:
        epoch = getattr(self, "epoch", "?")
        return f"Coordinator of queue {self.namespace}/{self.queue_id} (epoch {epoch})"

    def _drop_inherited(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        close_quietly(self.fs, fd)

    def _epoch_path(self, epoch: int) -> str:
        return os.path.join(self.epochs_dir, f"e-{epoch:06d}")

    def _open(self, recover: bool, takeover: bool) -> None:
        existing = [int(m.group(1)) for n in self.fs.listdir(self.epochs_dir)
                    if (m := _EPOCH_RE.match(n))]
        if existing:
            self._check_latest_is_dead(max(existing), takeover and recover)
            if not recover:
                raise UnsafeRecovery(
                    f"queue {self.namespace}/{self.queue_id} already exists (epoch "
                    f"{max(existing)}). Make sure its coordinator is stopped, then open it "
                    "with recover=True"
                )
        self.epoch = (max(existing) if existing else 0) + 1
        # our epoch's lock first, then its marker: whoever sees the marker sees it held
        self._lock_fd, _ = holder.take(self.fs, self._epoch_path(self.epoch) + ".lock",
                                       self.clock)
        if self._lock_fd is None:
            raise UnsafeRecovery(f"another coordinator of {self.namespace}/{self.queue_id} is "
                                 f"taking epoch {self.epoch} right now; only one may recover")
        try:
            fd = self.fs.open(self._epoch_path(self.epoch), write=True, create=True,
                              exclusive=True)
            self.fs.fsync(fd)
            self.fs.close(fd)
            self.fs.fsync_dir(self.epochs_dir)  # D8: the new epoch is durable first
        except FileExistsError:
            raise UnsafeRecovery(
                f"another coordinator of {self.namespace}/{self.queue_id} took epoch "
                f"{self.epoch} at the same time; only one may recover"
            ) from None
        recovered = journal_mod.recover(self.fs, self.journal_dir,
                                        started_epoch=self._newest_started(existing))
        self.state = replay(recovered)
        self.recovery_stats = dict(recovered.stats)
        self.journal = journal_mod.Journal(
            self.fs, self.journal_dir, epoch=self.epoch, recovered=recovered,
            clock=self.clock, fence=self._fence_check, group_wait=self.group_wait,
            segment_target_bytes=self.segment_target_bytes,
        )
        self._mark_started()
        # D9: revoke older leases, durably, before serving anyone
        self._commit_now({"t": "epoch", "epoch": self.epoch})
        self._durable_commits = len(self.state.commits)
        # Claim the queue owner for our epoch (older coordinators' catalog updates are
        # ignored from now on).  Its roots already cover the recovered state: everything a
        # durable transaction names was adopted before it was journaled (D2), and only a
        # replace at collect_garbage removes roots — of data no longer needed.
        if not self.store.catalog.adopt(self.owner, self.epoch, add=()):
            raise Fenced(f"queue {self.owner} was taken over by a newer coordinator")
        with self.store.catalog.locked() as st:
            roots = st.owners.get((self.store.run_id, self.owner))
            self._rooted = roots.copy() if roots is not None else RootSet()
        self._retired = self.state.retirement_cursor(self.consumer_id)

    def _mark_started(self) -> None:
        """Our epoch-start record is durable: say so, durably, in our epoch file, so that
        a later recovery that finds no valid segment of this epoch (or of a newer one)
        knows they were lost (``CorruptData``) instead of recovering an older epoch."""
        try:
            fd = self.fs.open(self._epoch_path(self.epoch), write=True)
            try:
                self.fs.writev(fd, [_STARTED], 0)
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
        except OSError as e:
            raise storage_error(e, f"queue {self.owner}: cannot mark epoch {self.epoch} "
                                "started") from e

    def _newest_started(self, epochs: Iterable[int]) -> int:
        """The newest of ``epochs`` whose file says it started (0 if none): newest first,
        so this reads one or two small files.  An epoch file without the mark (its
        coordinator never started, or crashed before the mark was durable) does not count."""
        for epoch in sorted(epochs, reverse=True):
            path = self._epoch_path(epoch)
            try:
                fd = self.fs.open(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise storage_error(e, f"cannot open epoch file {path}") from e
            try:
                mark = self.fs.read_to_end(fd, 0, len(_STARTED) + 1)
            except OSError as e:
                raise storage_error(e, f"cannot read epoch file {path}") from e
            finally:
                close_quietly(self.fs, fd)
            if mark == _STARTED:
                return epoch
        return 0

    def _fence_check(self) -> None:
        """Raise ``Fenced`` if a newer epoch exists (checked after every sync, before any
        reply: an old coordinator that resumes acknowledges nothing)."""
        if not self.fs.probe(self._epoch_path(self.epoch + 1)):
            return
        raise Fenced(f"queue {self.owner}: epoch {self.epoch + 1} exists; coordinator "
                     f"epoch {self.epoch} is fenced")

    # --- the commit path ----------------------------------------------------------------
    def _check_usable(self) -> None:
        self._check_process()
        if self._closed:
            raise ValueError(f"coordinator of {self.owner} is closed")
        if self._broken is not None:
            raise Fenced(f"coordinator of {self.owner} (epoch {self.epoch}) stopped after "
                         f"{self._broken!r}; open a new one with recover=True")

    def _adopt(self, refs: Iterable[RecordSetRef],
               announced: Announcement | None = None) -> list[Extent]:
        """D2: retain data under the queue owner before any transaction naming it is
        journaled; each reference must name a publication (``InvalidReference``
        otherwise: the queue never roots a fabricated one).  Returns the extents this call
        registered as in flight (release them with ``_done_adopting``)."""
        refs = list(refs)
        for ref in refs:
            self.store.check_published(ref, f"queue {self.owner}")
        todo = list(dict.fromkeys((r.path, r.offset) for r in refs))
        with self._mutex:
            self._check_usable()
            for e in todo:
                self._adding[e] += 1
            new = [e for e in todo if e not in self._rooted]
        if new:
            try:
                ok = self.store.catalog.adopt(self.owner, self.epoch, add=new,
                                              announced=announced)
            except BaseException:
                self._done_adopting(todo)
                raise
            if not ok:
                self._done_adopting(todo)
                self._fail(Fenced(f"queue {self.owner}: a newer coordinator owns it"))
            with self._mutex:
                self._rooted.update(new)
        return todo

    def _done_adopting(self, extents: Iterable[Extent]) -> None:
        with self._mutex:
            for e in extents:
                self._adding[e] -= 1
                if self._adding[e] <= 0:
                    del self._adding[e]

    def _enqueue(self, txn: dict[str, Any]) -> int:
        """Apply and enqueue (call with the mutex held): journal order = apply order."""
        self.state.apply(txn)
        seq = self.journal.enqueue(msgpack.packb(txn, use_bin_type=True))
        self._last_seq = seq
        self._seq_commits[seq] = len(self.state.commits)
        self._since_snapshot += 1
        return seq

    def _wait(self, seq: int, adopted: Iterable[Extent] = ()) -> None:
        try:
            self.journal.wait(seq)
        except BaseException as e:
            self._fail(e)
        with self._mutex:
            done = [s for s in self._seq_commits if s <= seq]
            for s in done:
                self._durable_commits = max(self._durable_commits, self._seq_commits.pop(s))
            # staging of data the queue adopted can go once the entry is durable (D2)
            self._unstage.update(adopted)
            snap = self._since_snapshot >= self.snapshot_every
        if snap:
            # this caller's transaction is already durable: a failed snapshot must not be
            # reported as its failure (the journal stays usable; a later one retries)
            try:
                self.snapshot()
            except Fenced:
                raise
            except Exception:  # noqa: BLE001 - counted, retried at the next threshold
                self.snapshot_failures += 1

    def _fail(self, exc: BaseException) -> None:
        with self._mutex:
            if self._broken is None:
                self._broken = exc
        if isinstance(exc, (IndeterminateCommit, Fenced)):
            raise exc
        raise IndeterminateCommit(
            f"queue {self.owner}: the transaction may or may not be durable ({exc!r}); "
            "recover the queue and look the request up before retrying"
        ) from exc

    def _commit_now(self, txn: dict[str, Any]) -> None:
        with self._mutex:
            seq = self._enqueue(txn)
        self._wait(seq)

    def snapshot(self) -> None:
        """Write a snapshot now (recovery then reads it plus a short journal suffix)."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            state = msgpack.packb(self.state.to_snapshot(), use_bin_type=True)
            self.journal.snapshot(state)
            self._since_snapshot = 0

    # --- validation helpers -------------------------------------------------------------
    def _check_ref(self, ref: object, where: str) -> RecordSetRef:
        if not isinstance(ref, RecordSetRef):
            raise TypeError(f"{where} must be a RecordSetRef, got {type(ref).__name__}")
        ref.check()
        if ref.run_id != self.store.run_id:
            raise InvalidReference(f"{where} belongs to run {ref.run_id!r}, the queue's store "
                                   f"is run {self.store.run_id!r}")
        return ref

    def _meta(self, metadata: object, where: str) -> Any:
        text = canonical_metadata(metadata, where)
        if len(text) > self.limits.max_metadata_bytes:
            raise ResourceLimitExceeded(
                f"{where}.metadata is {len(text)} bytes; the limit is "
                f"{self.limits.max_metadata_bytes} (Limits.max_metadata_bytes)")
        return json.loads(text)

    def _task(self, task_id: object) -> Any:
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        task = self.state.tasks.get(task_id)
        if task is None:
            raise ValueError(f"queue {self.owner}: unknown task id {task_id!r}")
        return task

    def _check_lease(self, lease: object, *, allow_expired: bool = False) -> Any:
        """The task of a current lease (mutex held); StaleAttempt/LeaseExpired otherwise."""
        lease = _check_lease_fields(lease, "lease")
        if lease.queue_id != self.queue_id:
            raise ValueError(f"lease of queue {lease.queue_id!r} given to queue "
                             f"{self.queue_id!r}")
        if lease.epoch != self.epoch:
            raise StaleAttempt(
                f"lease of task {lease.task_id!r} attempt {lease.attempt} was granted by "
                f"coordinator epoch {lease.epoch}; the queue is at epoch {self.epoch}. Drop "
                "the work; the task was returned to the queue")
        task = self._task(lease.task_id)
        if task.status != LEASED or task.lease is None or task.lease[0] != lease.attempt \
                or task.lease[1] != lease.worker_id:
            raise StaleAttempt(
                f"task {lease.task_id!r} attempt {lease.attempt} is no longer leased to "
                f"{lease.worker_id!r} (status {task.status}, attempt {task.attempt})")
        if not allow_expired and self.clock.now() > self._deadlines.get(lease.task_id, 0.0):
            # journaled as an expiry by the next acquire; the right to commit ends now
            raise LeaseExpired(
                f"lease of task {lease.task_id!r} attempt {lease.attempt} expired; renew "
                "leases with heartbeat before their deadline")
        return task

    def _expire_locked(self, task: Any) -> int:
        self._deadlines.pop(task.task_id, None)
        return self._enqueue({"t": "expire", "task": task.task_id, "attempt": task.attempt})

    def _expire_due(self) -> int | None:
        """Journal the expiry of every lease past its deadline (mutex held)."""
        now = self.clock.now()
        seq = None
        for tid, deadline in list(self._deadlines.items()):
            if deadline < now:
                task = self.state.tasks[tid]
                if task.status == LEASED:
                    seq = self._expire_locked(task)
                else:
                    del self._deadlines[tid]
        return seq

    def _lease_of(self, task: Any) -> Lease:
        attempt, worker, epoch = task.lease
        return Lease(self.queue_id, task.task_id, attempt, worker, epoch,
                     self._deadlines.get(task.task_id, 0.0))

    def _spec_of(self, task: Any) -> TaskSpec:
        return TaskSpec(task.task_id, self._to_ref(task.input), task.metadata, task.priority,
                        task.key, task.max_attempts, task.control)

    def _to_ref(self, t: RefTuple | None) -> RecordSetRef | None:
        if t is None:
            return None
        return RecordSetRef(self.store.run_id, *t)

    # --- tasks --------------------------------------------------------------------------
    def submit_tasks(self, request_id: str, tasks: Sequence[TaskSpec], *,
                     producer_id: str | None = None,
                     producer_state: Mapping[str, Any] | None = None) -> SubmitResult:
        """Submit tasks atomically.  A retry with the same ``request_id`` and content
        returns the original result; different content raises ``IdempotencyConflict``.
        ``producer_state`` (small JSON) is saved in the same transaction."""
        self._check_process()
        _check_id("request_id", request_id)
        if isinstance(tasks, TaskSpec) or not isinstance(tasks, Sequence):
            raise TypeError("tasks must be a list of TaskSpec")
        if len(tasks) > self.limits.max_tasks_per_request:
            raise ResourceLimitExceeded(
                f"{len(tasks)} tasks in one request; the limit is "
                f"{self.limits.max_tasks_per_request} (Limits.max_tasks_per_request)")
        rows = []
        seen: set[str] = set()
        for i, spec in enumerate(tasks):
            w = f"tasks[{i}]"
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"{w} must be a TaskSpec, got {type(spec).__name__}")
            _check_id(f"{w}.task_id", spec.task_id)
            if spec.task_id in seen:
                raise ValueError(f"{w}.task_id {spec.task_id!r} appears twice in the request")
            seen.add(spec.task_id)
            inp = None if spec.input_ref is None else _ref_tuple(
                self._check_ref(spec.input_ref, f"{w}.input_ref"))
            for name in ("priority", "scheduling_key"):
                _check_int64(f"{w}.{name}", getattr(spec, name))
            check_count(f"{w}.max_attempts", spec.max_attempts, minimum=1)
            if spec.control is not None and not isinstance(spec.control, str):
                raise TypeError(f"{w}.control must be None or a str")
            rows.append([spec.task_id, list(inp) if inp else None,
                         self._meta(spec.metadata, w), spec.priority, spec.scheduling_key,
                         spec.max_attempts, spec.control])
        producer = None
        if producer_id is not None:
            _check_id("producer_id", producer_id)
            producer = [producer_id, self._meta(producer_state or {}, "producer_state")]
        digest = _digest([rows, producer])
        with self._mutex:
            self._check_usable()
            known = self.state.requests.get(request_id)
        if known is not None:
            return self._replay_request(request_id, digest, known)
        adopted = self._adopt([t.input_ref for t in tasks if t.input_ref is not None])
        try:
            with self._mutex:
                self._check_usable()
                known = self.state.requests.get(request_id)
                if known is not None:
                    seq = -1  # a concurrent retry got there first: replayed below
                elif self.state.sealed:
                    raise ValueError(f"queue {self.owner}: input is sealed; no more tasks")
                else:
                    for r in rows:
                        if r[0] in self.state.tasks:
                            raise ValueError(f"queue {self.owner}: task id {r[0]!r} already "
                                             "exists (submitted by another request)")
                    if self.state.pending_count + len(rows) > self.limits.max_pending_tasks:
                        raise ResourceLimitExceeded(
                            f"queue {self.owner} holds {self.state.pending_count} pending "
                            f"tasks; the limit is {self.limits.max_pending_tasks}")
                    seq = self._enqueue({"t": "submit", "req": request_id, "digest": digest,
                                         "tasks": rows, "producer": producer})
        finally:
            self._done_adopting(adopted)
        if known is not None:  # outside the mutex: replaying waits for the original
            return self._replay_request(request_id, digest, known)
        self._wait(seq, adopted)
        return SubmitResult(request_id, tuple(r[0] for r in rows))

    def _replay_request(self, request_id: str, digest: str,
                        known: tuple[str, tuple[str, ...]]) -> SubmitResult:
        if known[0] != digest:
            raise IdempotencyConflict(
                f"request_id {request_id!r} was already used for different tasks; use a new "
                "request_id for new content")
        self._wait(self._last_seq)  # the original may still be in flight
        return SubmitResult(request_id, known[1])

    def acquire(self, worker_id: str, max_tasks: int = 1, *, task_prefix: str | None = None,
                task_ids: Sequence[str] | None = None,
                control: str | None = None) -> AcquireResult:
        """Lease up to ``max_tasks`` pending tasks in scheduling order."""
        self._check_process()
        _check_id("worker_id", worker_id)
        check_count("max_tasks", max_tasks, minimum=1)
        if task_prefix is not None and not isinstance(task_prefix, str):
            raise TypeError(f"task_prefix must be None or a str, got {type(task_prefix).__name__}")
        if isinstance(task_ids, (str, bytes)):  # a str would lease its characters
            raise TypeError("task_ids must be a list of task ids, not one str")
        if control is not None and not isinstance(control, str):
            raise TypeError(f"control must be None or a str, got {type(control).__name__}")
        with self.journal.incoming(), self._mutex:
            self._check_usable()
            last = self._expire_due()
            st = self.state
            held = sum(1 for t in self._deadlines
                       if (lease := st.tasks[t].lease) is not None and lease[1] == worker_id)
            lagging = (self.limits.max_unconsumed_results is not None and
                       len(st.commits) - st.retirement_cursor(self.consumer_id)
                       >= self.limits.max_unconsumed_results)
            if held >= self.limits.max_leases_per_worker or lagging:
                status = "backpressured"
                chosen = []
            else:
                chosen = self._choose(max_tasks, task_prefix, task_ids, control,
                                      self.limits.max_leases_per_worker - held)
                status = "acquired" if chosen else self._idle_status()
            if chosen:
                grants = [[t.task_id, t.attempt + 1] for t in chosen]
                last = self._enqueue({"t": "lease", "epoch": self.epoch, "worker": worker_id,
                                      "grants": grants})
                deadline = self.clock.now() + self.lease_seconds
                for t in chosen:
                    self._deadlines[t.task_id] = deadline
                out = tuple(Assignment(self._spec_of(t), self._lease_of(t)) for t in chosen)
            else:
                out = ()
        if last is not None:
            self._wait(last)
        return AcquireResult(status, out)

    def _choose(self, n: int, prefix: str | None, task_ids: Sequence[str] | None,
                control: str | None, room: int) -> list[Any]:
        n = min(n, room)
        out: list[Any] = []
        if task_ids is not None:
            for tid in dict.fromkeys(task_ids):  # a repeated id is one task, leased once
                task = self._task(tid)
                if task.status == PENDING and task.control == control and len(out) < n:
                    out.append(task)
            return out
        return self.state.best_pending(control, n, prefix)

    def _idle_status(self) -> str:
        st = self.state
        if not st.sealed:
            return "empty"
        if st.pending_count == 0 and st.leased_count == 0:
            return "end_of_input"
        return "draining"

    def heartbeat(self, leases: Sequence[Lease]) -> list[Lease]:
        """Renew leases; returns them with new deadlines.  ``StaleAttempt`` (or
        ``LeaseExpired``) if any is no longer current — the others are renewed first."""
        self._check_process()
        if isinstance(leases, Lease) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        for i, lease in enumerate(leases):  # all checked before any deadline moves
            _check_lease_fields(lease, f"leases[{i}]")
        renewed, stale = [], []
        try:
            self._fence_check()  # a fenced coordinator must not keep workers busy
        except Fenced as e:
            self._fail(e)
        with self._mutex:
            self._check_usable()
            for lease in leases:
                try:
                    task = self._check_lease(lease)
                except StaleAttempt as e:
                    stale.append(e)
                    continue
                self._deadlines[task.task_id] = self.clock.now() + self.lease_seconds
                renewed.append(self._lease_of(task))
        if stale:
            raise stale[0]
        return renewed

    def complete_task(self, lease: Lease, *, submission_id: str, result_ref: RecordSetRef,
                      result_digest: str | None = None) -> Receipt:
        """Accept the result of a leased attempt, exactly once (receipt).  A retry with the
        same ``submission_id`` and result returns the original receipt, even after the
        lease ended; different content raises ``IdempotencyConflict``.  The result's
        records must name the lease's task and attempt in their metadata
        (``task_id``, ``attempt``)."""
        self._check_process()
        _check_id("submission_id", submission_id)
        ref = self._check_ref(result_ref, "result_ref")
        if result_digest is not None and not isinstance(result_digest, str):
            raise TypeError(f"result_digest must be None or a str, got "
                            f"{type(result_digest).__name__}")
        if result_digest is not None and result_digest != ref.digest:
            raise ValueError(f"result_digest {result_digest!r} differs from the reference's "
                             f"digest {ref.digest!r}")
        _check_lease_fields(lease, "lease")
        key = [lease.task_id, lease.attempt, list(_ref_tuple(ref))]
        # siblings: announced to the catalog and the journal, so that concurrent
        # completions share one catalog fsync and one journal sync (group commit)
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, done, adopted = self._complete(lease, submission_id, ref, key, announced)
        self._wait(seq, adopted)
        if done is not None:
            return done
        return self._receipt(self.state.submissions[submission_id])

    def _complete(self, lease: Lease, submission_id: str, ref: RecordSetRef,
                  key: list[Any], announced: Announcement
                  ) -> tuple[int, Receipt | None, list[Extent]]:
        """complete_task up to the enqueue: (sequence number to wait for, the original
        receipt of a retry or None, the extents adopted)."""
        with self._mutex:
            self._check_usable()
            done = self._completed_receipt(submission_id, key)
            if done is None:
                self._check_lease(lease, allow_expired=True)
        if done is not None:
            return self._last_seq, done, []
        self._check_result_names_attempt(ref, lease)
        adopted = self._adopt([ref], announced)
        try:
            with self._mutex:
                self._check_usable()
                done = self._completed_receipt(submission_id, key)
                if done is None:
                    task = self._check_lease(lease)
                    seq = self._enqueue({"t": "complete", "task": task.task_id,
                                         "attempt": lease.attempt, "sub": submission_id,
                                         "result": list(_ref_tuple(ref)), "digest": ref.digest,
                                         "epoch": self.epoch, "meta": None})
                    self._deadlines.pop(task.task_id, None)
                else:
                    seq = self._last_seq
        finally:
            self._done_adopting(adopted)
        return seq, done, adopted

    def _completed_receipt(self, submission_id: str, key: list[Any]) -> Receipt | None:
        pos = self.state.submissions.get(submission_id)
        if pos is None:
            return None
        rec = self.state.commits[pos]
        if [rec.task_id, rec.attempt, list(rec.result)] != key:
            raise IdempotencyConflict(
                f"submission_id {submission_id!r} already accepted task {rec.task_id!r} "
                f"attempt {rec.attempt} with another result; use a new submission_id")
        return self._receipt(pos)

    def _receipt(self, pos: int) -> Receipt:
        rec = self.state.commits[pos]
        ref = self._to_ref(rec.result)
        assert ref is not None
        return Receipt(self.queue_id, rec.task_id, rec.attempt, rec.submission_id, pos,
                       rec.epoch, ref)

    def _check_result_names_attempt(self, ref: RecordSetRef, lease: Lease) -> None:
        manifest = self.store.manifest(ref)
        named = False
        for info in manifest.records:
            meta = info.metadata
            if "task_id" in meta or "attempt" in meta:
                if meta.get("task_id") != lease.task_id or meta.get("attempt") != lease.attempt:
                    raise ValueError(
                        f"result record {info.record_id!r} names task "
                        f"{meta.get('task_id')!r} attempt {meta.get('attempt')!r}, but the "
                        f"lease is task {lease.task_id!r} attempt {lease.attempt}")
                named = True
        if not named:
            raise ValueError(
                "the result's records must name the lease in their metadata: publish them "
                f"with metadata={{'task_id': {lease.task_id!r}, 'attempt': {lease.attempt}}}")

    def fail_task(self, lease: Lease, *, error: str | None = None,
                  retry: bool = True) -> TaskStatus:
        """The attempt failed: the task returns to the queue while its attempt budget
        lasts (``retry=False`` fails it for good)."""
        self._check_process()
        if error is not None and not isinstance(error, str):
            raise TypeError("error must be a str")
        with self._mutex:
            self._check_usable()
            task = self._check_lease(lease)
            final = (not retry) or task.failures + 1 >= task.max_attempts
            seq = self._enqueue({"t": "fail", "task": task.task_id, "attempt": lease.attempt,
                                 "error": error, "final": final})
            self._deadlines.pop(task.task_id, None)
        self._wait(seq)
        return self.task_status(lease.task_id)

    def yield_tasks(self, updates: Sequence[Mapping[str, Any]], *,
                    request_id: str) -> SubmitResult:
        """Return leased tasks with continuation inputs, atomically for the batch, without
        spending a retry.  Each update: ``lease``, ``input_ref``, and optionally
        ``priority``, ``scheduling_key``, ``metadata``."""
        self._check_process()
        _check_id("request_id", request_id)
        rows = []
        for i, u in enumerate(updates):
            w = f"updates[{i}]"
            if not isinstance(u, Mapping):
                raise TypeError(f"{w} must be a dict")
            lease = _check_lease_fields(u.get("lease"), f"{w}['lease']")
            inp = u.get("input_ref")
            ref = None if inp is None else self._check_ref(inp, f"{w}['input_ref']")
            # everything that enters the digest is checked first (no OverflowError there)
            prio, key, meta = u.get("priority"), u.get("scheduling_key"), u.get("metadata")
            for name, v in (("priority", prio), ("scheduling_key", key)):
                if v is not None:
                    check_int(f"{w}[{name!r}]", v)
            meta = None if meta is None else self._meta(meta, w)
            rows.append((lease, ref, prio, key, meta))
        digest = _digest([[r[0].task_id, r[0].attempt, list(_ref_tuple(r[1])) if r[1] else None,
                           r[2], r[3], r[4]] for r in rows])
        with self._mutex:
            self._check_usable()
            known = self.state.requests.get(request_id)
        if known is not None:
            return self._replay_request(request_id, digest, known)
        adopted = self._adopt([r[1] for r in rows if r[1] is not None])
        try:
            with self._mutex:
                self._check_usable()
                txn_rows = []
                for lease, ref, prio, key, meta in rows:
                    task = self._check_lease(lease)
                    prio = task.priority if prio is None else prio
                    key = task.key if key is None else key
                    meta = task.metadata if meta is None else meta
                    new_input = list(_ref_tuple(ref)) if ref is not None else (
                        list(task.input) if task.input else None)
                    txn_rows.append([task.task_id, lease.attempt, new_input, prio, key, meta])
                seq = self._enqueue({"t": "yield", "req": request_id, "digest": digest,
                                     "updates": txn_rows})
                for r in txn_rows:
                    self._deadlines.pop(r[0], None)
        finally:
            self._done_adopting(adopted)
        self._wait(seq, adopted)
        return SubmitResult(request_id, tuple(r[0] for r in txn_rows))

    def release_tasks(self, leases: Sequence[Lease]) -> None:
        """Give leased tasks back unfinished, without spending a retry."""
        self._check_process()
        if isinstance(leases, Lease) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        with self._mutex:
            self._check_usable()
            rows = [[self._check_lease(lease, allow_expired=True).task_id, lease.attempt]
                    for lease in leases]
            if not rows:
                return
            seq = self._enqueue({"t": "release", "leases": rows})
            for tid, _ in rows:
                self._deadlines.pop(tid, None)
        self._wait(seq)

    def cancel_task(self, task_id: str) -> bool:
        """Cancel a pending or leased task (its lease can no longer commit; a reader keeps
        its protection, D5).  Returns False if the task was already terminal."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            task = self._task(task_id)
            if task.status in TERMINAL:
                return False
            seq = self._enqueue({"t": "cancel", "task": task_id})
            self._deadlines.pop(task_id, None)
        self._wait(seq)
        return True

    def seal_input(self) -> None:
        """No more submissions: ``acquire`` answers ``end_of_input`` once all are done."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            if self.state.sealed:
                return
            seq = self._enqueue({"t": "seal"})
        self._wait(seq)

    # --- reading ------------------------------------------------------------------------
    def read_commits(self, cursor: int = 0, limit: int = 100) -> CommitPage:
        """Accepted results from position ``cursor`` on (only durable ones)."""
        self._check_process()
        check_count("cursor", cursor)
        check_count("limit", limit, minimum=1)
        with self._mutex:
            end = self._durable_commits
            recs = self.state.commits[cursor:min(end, cursor + limit)]
            out = []
            for i, rec in enumerate(recs):
                ref = self._to_ref(rec.result)
                assert ref is not None
                out.append(Commit(cursor + i, rec.task_id, rec.attempt, rec.submission_id,
                                  ref, rec.metadata or {}))
        return CommitPage(tuple(out), cursor + len(out), end)

    def lookup_submission(self, submission_id: str) -> Receipt | None:
        """The receipt of a completion by its submission id (after a lost reply)."""
        self._check_process()
        _check_id("submission_id", submission_id)
        with self._mutex:
            pos = self.state.submissions.get(submission_id)
            if pos is None or pos >= self._durable_commits:
                return None
            return self._receipt(pos)

    def task_status(self, task_id: str) -> TaskStatus:
        self._check_process()
        with self._mutex:
            task = self._task(task_id)
            return TaskStatus(task.task_id, task.status, task.attempt, task.failures,
                              task.max_attempts,
                              self._lease_of(task) if task.lease else None, task.position,
                              self._to_ref(task.input), task.last_error)

    def pending_tasks(self, limit: int | None = None) -> list[str]:
        """Pending task ids in scheduling order."""
        self._check_process()
        if limit is not None:
            check_count("limit", limit)
        with self._mutex:
            return self.state.pending_in_order(limit)

    # --- readers (D5) -------------------------------------------------------------------
    def outstanding_reads(self) -> list[ReadLease]:
        self._check_process()
        with self._mutex:
            out = []
            for (w, t, a), ref in sorted(self.state.reads.items()):
                r = self._to_ref(ref)
                assert r is not None
                out.append(ReadLease(w, t, a, r))
            return out

    def release_task_reads(self, task_id: str, attempt: int | None = None) -> int:
        """A supervisor confirmed these readers finished: drop their protection."""
        self._check_process()
        if attempt is not None:
            check_count("attempt", attempt)
        with self._mutex:
            self._check_usable()
            self._task(task_id)
            n = sum(1 for k in self.state.reads if k[1] == task_id and
                    (attempt is None or k[2] == attempt))
            if not n:
                return 0
            seq = self._enqueue({"t": "reads", "task": task_id, "attempt": attempt})
        self._wait(seq)
        return n

    def retire_worker(self, worker_id: str) -> int:
        """The worker is confirmed dead or finished: drop all its read protections."""
        self._check_process()
        _check_id("worker_id", worker_id)
        with self._mutex:
            self._check_usable()
            n = sum(1 for k in self.state.reads if k[0] == worker_id)
            if not n:
                return 0
            seq = self._enqueue({"t": "retire", "worker": worker_id})
        self._wait(seq)
        return n

    # --- consumers ----------------------------------------------------------------------
    def open_consumer(self, consumer_id: str = DEFAULT_CONSUMER) -> ConsumerToken:
        """Open (or take over) a consumer: the new token makes older ones stale."""
        self._check_process()
        _check_id("consumer_id", consumer_id)
        with self._mutex:
            self._check_usable()
            c = self.state.consumers.get(consumer_id)
            token = (c.token if c else 0) + 1
            seq = self._enqueue({"t": "cons_open", "consumer": consumer_id, "token": token})
        self._wait(seq)
        return ConsumerToken(consumer_id, token)

    def save_consumer_state(self, token: ConsumerToken, *, fetch_cursor: int,
                            processed_cursor: int, state_ref: RecordSetRef | None = None,
                            finished_batches: Sequence[str] = ()) -> ConsumerState:
        """Durably record how far the consumer fetched and processed, and its state."""
        self._check_process()
        if not isinstance(token, ConsumerToken):
            raise TypeError(f"expected a ConsumerToken, got {type(token).__name__}")
        _check_id("token.consumer_id", token.consumer_id)
        check_count("token.token", token.token)
        ref = None if state_ref is None else self._check_ref(state_ref, "state_ref")
        for name, v in (("fetch_cursor", fetch_cursor), ("processed_cursor", processed_cursor)):
            check_count(name, v)
        if isinstance(finished_batches, (str, bytes)):
            raise TypeError("finished_batches must be a list of batch ids, not one str")
        for i, b in enumerate(finished_batches):
            _check_id(f"finished_batches[{i}]", b)
        if processed_cursor > fetch_cursor:
            raise ValueError("processed_cursor cannot pass fetch_cursor")
        adopted = self._adopt([ref] if ref else [])
        try:
            with self._mutex:
                self._check_usable()
                c = self.state.consumers.get(token.consumer_id)
                if c is None or c.token != token.token:
                    raise Fenced(f"consumer {token.consumer_id!r} token {token.token} is not "
                                 "current (another open_consumer took over)")
                if fetch_cursor > self._durable_commits:
                    raise ValueError(f"fetch_cursor {fetch_cursor} is past the commit log "
                                     f"({self._durable_commits} durable commits)")
                floor = self._retired if token.consumer_id == self.consumer_id else 0
                if processed_cursor < c.processed and processed_cursor < floor:
                    raise ValueError(
                        f"processed_cursor {processed_cursor} rewinds below retired history "
                        f"({floor}); register a checkpoint to keep results for a rewind")
                for b in finished_batches:
                    if b not in self.state.batches:
                        raise ValueError(f"unknown batch {b!r}")
                seq = self._enqueue({"t": "cons_save", "consumer": token.consumer_id,
                                     "token": token.token, "fetch": fetch_cursor,
                                     "processed": processed_cursor,
                                     "state": list(_ref_tuple(ref)) if ref else None,
                                     "finished": list(finished_batches)})
        finally:
            self._done_adopting(adopted)
        self._wait(seq, adopted)
        state = self.load_consumer_state(token.consumer_id)
        assert state is not None
        return state

    def load_consumer_state(self, consumer_id: str = DEFAULT_CONSUMER) -> ConsumerState | None:
        self._check_process()
        with self._mutex:
            c = self.state.consumers.get(consumer_id)
            if c is None:
                return None
            return ConsumerState(consumer_id, c.token, c.fetch, c.processed,
                                 self._to_ref(c.state), c.finished)

    # --- batches and checkpoints --------------------------------------------------------
    def plan_batch(self, batch_id: str, positions: Sequence[int]) -> BatchInfo:
        self._check_process()
        _check_id("batch_id", batch_id)
        if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence):
            raise TypeError("positions must be a list of commit positions")
        pos = [check_count(f"positions[{i}]", p) for i, p in enumerate(positions)]
        with self._mutex:
            self._check_usable()
            if batch_id in self.state.batches:
                b = self.state.batches[batch_id]
                if list(b.positions) != pos:
                    raise IdempotencyConflict(f"batch {batch_id!r} was planned with other "
                                              "positions")
                return self.get_batch(batch_id)
            if any(p < 0 or p >= self._durable_commits for p in pos):
                raise ValueError(f"batch positions must be durable commits "
                                 f"(0..{self._durable_commits - 1})")
            open_batches = sum(1 for b in self.state.batches.values() if not b.finished)
            if open_batches >= self.limits.max_ready_batches:
                raise ResourceLimitExceeded(f"{open_batches} unfinished batches; the limit is "
                                            f"{self.limits.max_ready_batches}")
            seq = self._enqueue({"t": "batch_plan", "batch": batch_id, "positions": pos})
        self._wait(seq)
        return self.get_batch(batch_id)

    def batch_ready(self, batch_id: str, batch_ref: RecordSetRef) -> BatchInfo:
        self._check_process()
        _check_id("batch_id", batch_id)
        ref = self._check_ref(batch_ref, "batch_ref")
        with self._mutex:
            b = self.state.batches.get(batch_id)
            if b is None:
                raise ValueError(f"unknown batch {batch_id!r}; plan it first")
            if b.ref is not None:
                if b.ref != _ref_tuple(ref):
                    raise IdempotencyConflict(f"batch {batch_id!r} is ready with another ref")
                return self.get_batch(batch_id)
        adopted = self._adopt([ref])
        try:
            with self._mutex:
                self._check_usable()
                seq = self._enqueue({"t": "batch_ready", "batch": batch_id,
                                     "ref": list(_ref_tuple(ref))})
        finally:
            self._done_adopting(adopted)
        self._wait(seq, adopted)
        return self.get_batch(batch_id)

    def get_batch(self, batch_id: str) -> BatchInfo:
        self._check_process()
        with self._mutex:
            b = self.state.batches.get(batch_id)
            if b is None:
                raise ValueError(f"unknown batch {batch_id!r}")
            return BatchInfo(batch_id, b.positions, self._to_ref(b.ref), b.ref is not None,
                             b.finished)

    def register_checkpoint(self, checkpoint_id: str, ref: RecordSetRef | None = None, *,
                            cursor: int) -> None:
        """Keep ``ref`` and every result from commit ``cursor`` on until released (a
        consumer may rewind to ``cursor`` when it restores this checkpoint).  Registering
        the same id again replaces it (retain the new one before the old goes)."""
        self._check_process()
        _check_id("checkpoint_id", checkpoint_id)
        check_count("cursor", cursor)
        r = None if ref is None else self._check_ref(ref, "ref")
        adopted = self._adopt([r] if r else [])
        try:
            with self._mutex:
                self._check_usable()
                floor = self._retired  # results below it are no longer retained
                if not isinstance(cursor, int) or cursor < 0 or cursor > self._durable_commits:
                    raise ValueError("cursor must be a durable commit position")
                if cursor < floor:
                    raise InvalidReference(
                        f"checkpoint cursor {cursor} is below retired history ({floor}): those "
                        "results may already be reclaimed")
                seq = self._enqueue({"t": "ckpt", "id": checkpoint_id,
                                     "ref": list(_ref_tuple(r)) if r else None,
                                     "cursor": cursor})
        finally:
            self._done_adopting(adopted)
        self._wait(seq, adopted)

    def release_checkpoint(self, checkpoint_id: str) -> bool:
        self._check_process()
        with self._mutex:
            self._check_usable()
            if checkpoint_id not in self.state.checkpoints:
                return False
            seq = self._enqueue({"t": "ckpt_release", "id": checkpoint_id})
        self._wait(seq)
        return True

    # --- garbage, metrics, close --------------------------------------------------------
    def _live_extents(self) -> set[Extent]:
        return {(r[0], r[1]) for r in self.state.live_refs(self.consumer_id)}

    def collect_garbage(self) -> dict[str, Any]:
        """Retire the roots of acknowledged history (results processed by the consumer and
        not kept by a checkpoint, inputs of finished tasks without readers), drop the
        staging of adopted data, then collect the pool."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            live = self._live_extents() | set(self._adding)
            unstage = set(self._unstage)
            # the mutex is held across the catalog update so no adoption interleaves
            if not self.store.catalog.adopt(self.owner, self.epoch, replace=live,
                                            unstage=unstage):
                self._fail(Fenced(f"queue {self.owner}: a newer coordinator owns it"))
            self._rooted = RootSet(live)
            self._unstage -= unstage
            self._retired = self.state.retirement_cursor(self.consumer_id)
        return self.store.collect_garbage()

    def metrics(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            st = self.state
            counts = st.tasks.status_counts()  # never loads recovered history
            return {
                "queue": self.owner, "epoch": self.epoch,
                "pending": st.pending_count, "leased": st.leased_count,
                "completed": counts.get(COMPLETED, 0), "failed": counts.get("failed", 0),
                "cancelled": counts.get("cancelled", 0), "commits": len(st.commits),
                "durable_commits": self._durable_commits, "outstanding_reads": len(st.reads),
                "sealed": st.sealed, "journal": self.journal.metrics(),
                "recovery": self.recovery_stats,
            }

    def close(self) -> None:
        """Stop serving (leases stay until a recovery revokes them).  Idempotent.  In a
        forked child it does not raise and only closes the child's copies of the
        descriptors (the epoch lock and the journal are the parent's)."""
        if self._closed:
            return
        self._closed = True
        if self._in_forked_child():
            self._drop_inherited()
            self.journal.close()  # child-safe: closes only its copy too
            return
        try:
            self.journal.close()
        finally:
            self._release_lock()

    def __enter__(self) -> Coordinator:
        self._check_process()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay(recovered: journal_mod.Recovered) -> QueueState:
    """The queue state of a recovered journal: its snapshot plus the suffix (D9)."""
    # snapshot and suffix: many long-lived objects at once (promoted if many)
    large = recovered.snapshot is not None and len(recovered.snapshot) >= 1 << 20
    with bulk_objects(promote=large):
        if recovered.snapshot is not None:
            state = QueueState.from_snapshot(_unpack_snapshot(recovered.snapshot))
        else:
            state = QueueState()
        for txn in recovered.transactions:
            state.apply(msgpack.unpackb(txn, raw=False))
    return state


def read_state(fs: Filesystem, queue_dir: str) -> QueueState:
    """A queue's state read without becoming its coordinator: no epoch, no lock, nothing
    written (``journal.recover`` only fsyncs the newest segment).  For operator views
    (``straw inspect``); leases in it are whatever the journal last recorded."""
    return replay(journal_mod.recover(fs, os.path.join(queue_dir, "journal")))


def _unpack_snapshot(data: bytes | memoryview) -> dict[str, Any]:
    with bulk_objects():  # see QueueState.from_snapshot
        return msgpack.unpackb(data, raw=False)  # type: ignore[no-any-return]


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value or len(value) > 1024:
        raise ValueError(f"{name} must be a non-empty str of at most 1024 characters")


def _check_int64(name: str, value: object) -> None:
    check_int(name, value, *INT64)


def _check_lease_fields(lease: object, where: str) -> Lease:
    """A Lease whose fields have the types leases have (what a caller may have rebuilt
    from a dict): TypeError/ValueError naming the field otherwise."""
    if not isinstance(lease, Lease):
        raise TypeError(f"{where} must be a Lease, got {type(lease).__name__}")
    for name in ("queue_id", "task_id", "worker_id"):
        if not isinstance(getattr(lease, name), str):
            raise TypeError(f"{where}.{name} must be a str, got "
                            f"{type(getattr(lease, name)).__name__}")
    check_count(f"{where}.attempt", lease.attempt)
    check_count(f"{where}.epoch", lease.epoch)
    return lease


__all__ = ["Coordinator", "StorageUnavailable", "read_state", "replay"]
