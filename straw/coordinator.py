"""``Coordinator``: the single writer of one queue's journal.

Layout under the pool root (``Q`` = ``runs/<run_id>/queues/<namespace>/<queue_id>``)::

    Q/epochs/e-<n>          one file per epoch, created exclusively; it reads "started"
                            once the epoch's start record is durable in the journal
    Q/epochs/e-<n>.lock     flocked by epoch n's coordinator while it lives; its text names
                            it (host, pid, since)
    Q/journal/              segments and snapshots (straw.journal)
    Q/history/              history segments named by the journal snapshot (straw.history)

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
child every method, ``close()`` too, raises ``ForkedProcess`` before taking any lock
(``__exit__`` there does not raise; ``straw.process``).  Opening a coordinator in a child on a
store the child inherited is refused before anything is created (a new epoch file would
fence the parent).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import resource
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgpack
import xxhash

from . import holder
from . import journal as journal_mod
from .catalog import Announcement, Extent, run_prefix
from .catalog_roots import RootSet
from .checks import check_count, check_int, check_seconds, check_u64, check_usage_total, short_repr
from .clock import Clock
from .errors import (
    Closed,
    Fenced,
    IdempotencyConflict,
    IndeterminateCommit,
    InvalidReference,
    LeaseExpired,
    NotAnInteger,
    ResourceLimitExceeded,
    StaleAttempt,
    StorageUnavailable,
    StrawError,
    UnsafeRecovery,
    UnsupportedSchema,
)
from .fs import Filesystem
from .history import History
from .pack import storage_error
from .process import OPEN_QUEUE_IN_CHILD, ProcessBound, close_quietly
from .protocol import (
    INT64,
    AcquireResult,
    Assignment,
    CommitPage,
    CommitReceipt,
    Lease,
    Limits,
    TaskSpec,
    unenforced,
)
from .queue_marker import QueueMarker
from .queue_names import check_queue_id, queue_dir_name
from .queue_state import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LEASED,
    PENDING,
    TERMINAL,
    QueueState,
    RefTuple,
    bulk_objects,
)
from .refs import (
    NAME_RE,
    Record,
    RecordSetRef,
    SegmentRef,
    canonical_metadata,
    record_sets_in,
    ref_from_tuple,
    ref_identity,
    ref_to_tuple,
)
from .siblings import DEFAULT_GROUP_WAIT
from .store import SharedFilesystemStore

_EPOCH_RE = re.compile(r"^e-([0-9]{6,})\Z")
_STARTED = b"started\n"  # an epoch file's content once its epoch-start record is durable
DEFAULT_CONSUMER = "training"
_ID_MEMO_SIZE = 1 << 16  # derived attempt ids and tokens remembered (see Coordinator._derived)


def queue_dir(root: str, run_id: str, namespace: str, queue_id: str) -> str:
    """The directory of a run's queue (queues belong to a run; ``queue_dir_name`` maps an
    id such as ``run:ab`` to one safe path component)."""
    return os.path.join(root, "runs", run_id, "queues", namespace, queue_dir_name(queue_id))


# adopted extents: each one's segment and, when its checked manifest was at hand (a result's,
# at completion), what it needs (``ReadSession.needs``), so a collection's walk over the
# dependencies (SPEC release_publications) does not read it again
_Adopted = dict[Extent, tuple[SegmentRef, list[SegmentRef] | None]]


def _ref_tuple(ref: RecordSetRef) -> RefTuple:
    return ref_to_tuple(ref)  # the one stored form (straw.refs)


def _digest(value: Any) -> str:
    return xxhash.xxh3_128_hexdigest(msgpack.packb(value, use_bin_type=True))


class _CallableClock:
    """A straw-queue clock (a callable returning seconds, ``time.monotonic`` by default) as
    a ``Clock``; it is itself callable, like the clock straw-queue's coordinator exposes."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn = fn

    def now(self) -> float:
        return float(self._fn())

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def __call__(self) -> float:
        return self.now()


# namespace=False/True (straw-queue) name these namespaces; a str names its own
NAMESPACE_FALSE = "default"
NAMESPACE_TRUE = "namespaced"


class Coordinator(ProcessBound):
    """The coordinator of queue ``queue_id`` in ``namespace`` of ``store``'s pool.

    straw-queue 0.1.6's constructor: ``namespace`` False (the run's default namespace) or
    True (a namespace of its own, beside the default one), or the name of a namespace;
    ``exclusive_owner`` describes the external guarantee that this is the queue's only
    coordinator (recorded with the epoch lock: a second coordinator's error quotes it; the
    lock itself enforces exclusivity either way); ``clock`` is a callable returning seconds
    (it times lease deadlines, which live in memory) or a ``straw.clock.Clock`` (then it
    also stamps the journal).  straw's additions: ``takeover`` (fence a paused holder),
    ``consumer_id``, ``snapshot_every``, ``segment_target_bytes``, ``group_wait``,
    ``recovery_spends_budget``.

    A recovery (``recover=True``, ``takeover=True``) revokes every lease of the older
    epoch.  With ``recovery_spends_budget`` (the default, straw-queue's rule) each
    revocation spends one unit of its task's ``max_attempts``, like an expiry: a leased
    attempt was made, so ``max_attempts=1`` means at most one, and a task leased across
    ``max_attempts`` coordinator crashes ends ``failed``.  ``False`` returns revoked tasks
    to pending unspent (the rollout layer's choice: a job preempted every day must not
    fail its in-flight prompts).  The policy is journaled with the new epoch (spec Q6)."""

    _process_state = "its epoch lock, journal and queue state"
    _process_remedy = OPEN_QUEUE_IN_CHILD

    def __init__(
        self,
        store: SharedFilesystemStore,
        *,
        queue_id: str = "rollout",
        namespace: bool | str = False,
        exclusive_owner: str | None = None,
        recover: bool = False,
        limits: Limits | None = None,
        lease_seconds: float = 300,
        clock: Clock | Callable[[], float] | None = None,
        takeover: bool = False,
        consumer_id: str = DEFAULT_CONSUMER,
        # a recovery replays at most this many transactions after the snapshot: ~30 us
        # of CPU each (5,015 cost 0.16 s), so 20,000 made a fresh open up to ~0.6 s,
        # while a snapshot moving 5,000 completions to history costs ~45 ms (issue 13)
        snapshot_every: int = 5_000,
        segment_target_bytes: int = 64 << 20,
        group_wait: float = DEFAULT_GROUP_WAIT,
        enforce_limits: bool = False,
        recovery_spends_budget: bool = True,
    ) -> None:
        self._bind_process()
        if not isinstance(store, SharedFilesystemStore):
            raise TypeError(f"store must be a SharedFilesystemStore, got {type(store).__name__}")
        store._check_process()  # an inherited store: refused before any epoch is created
        if isinstance(namespace, bool):
            namespace = NAMESPACE_TRUE if namespace else NAMESPACE_FALSE
        if exclusive_owner is not None and (not isinstance(exclusive_owner, str)
                                            or not exclusive_owner.strip()):
            # straw-queue's class for a missing single-owner guarantee (None is ours: the
            # epoch lock enforces exclusivity without a description)
            raise UnsafeRecovery(f"exclusive_owner {short_repr(exclusive_owner)} must "
                                 "describe, in a non-empty str, what makes this the queue's "
                                 "only coordinator (or leave it out)")
        check_queue_id(queue_id)
        if not isinstance(namespace, str) or not NAME_RE.match(namespace):
            raise ValueError(f"namespace {short_repr(namespace)} must be 1-128 letters, "
                             "digits, '.', '_' or '-'")
        check_seconds("lease_seconds", lease_seconds, positive=True)
        check_seconds("group_wait", group_wait, positive=False)
        check_count("snapshot_every", snapshot_every, minimum=1)
        check_count("segment_target_bytes", segment_target_bytes, minimum=1)
        _check_id("consumer_id", consumer_id)
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be a straw Limits, got {type(limits).__name__}")
        for flag, setting in (("enforce_limits", enforce_limits),
                              ("recovery_spends_budget", recovery_spends_budget)):
            if not isinstance(setting, bool):
                raise TypeError(f"{flag} must be a bool, got {type(setting).__name__}")
        self.recovery_spends_budget = recovery_spends_budget
        self.store = store
        self.fs = store.fs
        self.queue_id = queue_id
        self.namespace = namespace
        self.owner = f"queue:{namespace}/{queue_id}"
        # the constant head of every derived name's hashed text (see _id)
        self._id_head = json.dumps([store.run_id, namespace, queue_id],
                                   separators=(",", ":"))[:-1] + ","
        self._id_memo: dict[tuple[Any, ...], str] = {}
        self.lease_seconds = float(lease_seconds)
        self.exclusive_owner = exclusive_owner
        # deadlines follow the caller's clock; the journal and lock stamps a wall clock
        if clock is None:
            self.clock: Clock = store.clock
            self._wall: Clock = store.clock
        elif hasattr(clock, "now"):
            self.clock = self._wall = clock  # type: ignore[assignment]
        elif callable(clock):
            self.clock, self._wall = _CallableClock(clock), store.clock
        else:
            raise TypeError(f"clock must be a callable returning seconds or a straw Clock, "
                            f"got {type(clock).__name__}")
        self.limits = limits or Limits()
        # straw-queue 0.1.6 keeps Limits as fields that reject and throttle nothing, and its
        # callers pass small values relying on that: its fields are enforced only with
        # enforce_limits=True (ours, an addition); otherwise they are carried (``limits``).
        # straw's own bounds are enforced either way (``protocol.unenforced``).
        self._bounds = self.limits if enforce_limits else unenforced(self.limits)
        self._enforce_limits = enforce_limits
        self.consumer_id = consumer_id
        self.snapshot_every = snapshot_every
        self.segment_target_bytes = segment_target_bytes
        self.group_wait = group_wait
        self.dir = queue_dir(store.root, store.run_id, namespace, queue_id)
        self.epochs_dir = os.path.join(self.dir, "epochs")
        self.journal_dir = os.path.join(self.dir, "journal")
        self.history_dir = os.path.join(self.dir, "history")
        # straw-queue's ``queues/<digest>/run.json``, which its callers probe (queue_marker)
        self._marker = (QueueMarker(self.fs, store.root, run_id=store.run_id,
                                    queue_id=queue_id, namespace=namespace)
                        if namespace == NAMESPACE_TRUE else None)
        self._mutex = threading.RLock()
        self._deadlines: dict[str, float] = {}
        self._rooted = RootSet()  # the queue owner's roots as this coordinator knows them
        self._adding: Counter[Extent] = Counter()
        # adopted extents whose staging (and their dependencies', SPEC
        # release_publications) the next collection drops (``_Adopted``)
        self._unstage: _Adopted = {}
        # (retirement cursor, commits, sparse) of a recovered journal whose results'
        # staging the next collection drops (see _open)
        self._recovered_results: tuple[int, int, frozenset[int]] | None = None
        self._broken: BaseException | None = None
        self._closed = False
        self._last_seq = 0
        self._seq_commits: dict[int, int] = {}
        self._durable_commits = 0
        self._since_snapshot = 0
        self.snapshot_failures = 0
        # consumer id -> (token, exclusive owner): this process's open consumers
        self._consumer_owners: dict[str, tuple[str, str]] = {}
        self._draining = False  # drain(): no more acquisitions or submissions here
        self._complete_seconds: deque[float] = deque(maxlen=1024)
        self._cpu_started = time.process_time()
        self.recovery_seconds = 0.0
        self._refuse_legacy_layout()
        try:
            self.fs.makedirs_durable(self.epochs_dir)
            self.fs.makedirs_durable(self.journal_dir)
        except OSError as e:
            raise storage_error(e, f"cannot create queue directory {self.dir}") from e
        self._lock_fd: int | None = None
        self._fence_path: tuple[int, str] | None = None  # (epoch, the next epoch's file)
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
        fd, holder_desc = holder.take(self.fs, self._epoch_path(latest) + ".lock", self._wall)
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
        epoch = getattr(self, "_epoch", "?")
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
        if self._marker is not None:  # durable before the queue's first epoch
            self._marker.open(recover=recover, queue_exists=bool(existing),
                              lease_seconds=self.lease_seconds)
        self._epoch = (max(existing) if existing else 0) + 1
        # our epoch's lock first, then its marker: whoever sees the marker sees it held
        self._lock_fd, _ = holder.take(self.fs, self._epoch_path(self._epoch) + ".lock",
                                       self._wall, purpose=self.exclusive_owner or "")
        if self._lock_fd is None:
            raise UnsafeRecovery(f"another coordinator of {self.namespace}/{self.queue_id} is "
                                 f"taking epoch {self._epoch} right now; only one may recover")
        try:
            fd = self.fs.open(self._epoch_path(self._epoch), write=True, create=True,
                              exclusive=True)
            self.fs.fsync(fd)
            self.fs.close(fd)
            self.fs.fsync_dir(self.epochs_dir)  # D8: the new epoch is durable first
        except FileExistsError:
            raise UnsafeRecovery(
                f"another coordinator of {self.namespace}/{self.queue_id} took epoch "
                f"{self._epoch} at the same time; only one may recover"
            ) from None
        started = time.perf_counter()
        recovered = journal_mod.recover(self.fs, self.journal_dir,
                                        started_epoch=self._newest_started(existing))
        self.state = replay(recovered, self.fs, self.history_dir)
        self.recovery_seconds = time.perf_counter() - started
        self.recovery_stats = dict(recovered.stats)
        self.journal = journal_mod.Journal(
            self.fs, self.journal_dir, epoch=self._epoch, recovered=recovered,
            clock=self._wall, fence=self._fence_check, group_wait=self.group_wait,
            segment_target_bytes=self.segment_target_bytes,
        )
        self._mark_started()
        # D9: revoke older leases, durably, before serving anyone
        self._commit_now({"t": "epoch", "epoch": self._epoch,
                          "spend": self.recovery_spends_budget})
        self._durable_commits = len(self.state.commits)
        # Claim the queue owner for our epoch (older coordinators' catalog updates are
        # ignored from now on).  Its roots already cover the recovered state: everything a
        # durable transaction names was adopted before it was journaled (D2), and only a
        # replace at collect_garbage removes roots — of data no longer needed.
        if not self.store.catalog.adopt(self.owner, self._epoch, add=()):
            raise Fenced(f"queue {self.owner} was taken over by a newer coordinator")
        with self.store.catalog.locked() as st:
            roots = st.owners.get((self.store.run_id, self.owner))
            self._rooted = roots.copy() if roots is not None else RootSet()
        # Staging of what the recovered journal names and the queue roots can go at the
        # next collection, as it would have after the previous coordinator's (it may have
        # stopped before collecting): that journal is durable, so D2 holds.  The results
        # of its unretired commits are looked up at that collection, not here: after a
        # long job they are most of the history (read from history segments, seconds per
        # million), and an open must cost the live state (issue 13).  Their positions are
        # recorded now, so the collection unstages exactly what this journal named.
        # (membership in the root set, not a set of it: it holds every unretired result)
        run = self.store.run_id
        self._unstage = {e: (ref_from_tuple(run, r).segment, None)
                         for r in self.state.live_refs(self.consumer_id, results=False)
                         if (e := (r[0], r[1])) in self._rooted}
        self._recovered_results = (
            self.state.retirement_cursor(self.consumer_id), len(self.state.commits),
            self.state.retired_sparse(self.consumer_id))
        # What this coordinator's last collection released (results below the cursor, and
        # the positions): read_commits refuses them.  Nothing is known released at start:
        # a crash may have come before the collection (a reference read_commits returns
        # then may name reclaimed data, which the read reports).  Rewinds do not rely on
        # it: they retain whatever acknowledged history the queue does not root.
        self._released: _Released = (0, frozenset())

    def _mark_started(self) -> None:
        """Our epoch-start record is durable: say so, durably, in our epoch file, so that
        a later recovery that finds no valid segment of this epoch (or of a newer one)
        knows they were lost (``CorruptData``) instead of recovering an older epoch."""
        try:
            fd = self.fs.open(self._epoch_path(self._epoch), write=True)
            try:
                self.fs.writev(fd, [_STARTED], 0)
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
        except OSError as e:
            raise storage_error(e, f"queue {self.owner}: cannot mark epoch {self._epoch} "
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
        # the next epoch's path, formatted once per epoch (this runs after every sync)
        fence = self._fence_path
        if fence is None or fence[0] != self._epoch:
            fence = self._fence_path = (self._epoch, self._epoch_path(self._epoch + 1))
        if not self.fs.probe(fence[1]):
            return
        raise Fenced(f"queue {self.owner}: epoch {self._epoch + 1} exists; coordinator "
                     f"epoch {self._epoch} is fenced")

    # --- the commit path ----------------------------------------------------------------
    def _check_usable(self) -> None:
        self._check_process()
        if self._closed:
            raise Closed(f"coordinator of {self.owner} is closed; open a new Coordinator")
        if self._broken is not None:
            raise Fenced(f"coordinator of {self.owner} (epoch {self._epoch}) stopped after "
                         f"{self._broken!r}; open a new one with recover=True")

    def _adopt(self, refs: Iterable[RecordSetRef],
               announced: Announcement | None = None) -> _Adopted:
        """D2: retain data under the queue owner before any transaction naming it is
        journaled; each reference must name a publication (``InvalidReference``
        otherwise: the queue never roots a fabricated one).  Returns the extents this call
        registered as in flight (release them with ``_done_adopting``), as ``_Adopted``."""
        refs = list(refs)
        # each distinct reference once (D2 unchanged: an equal reference names the same
        # extent, size and checksum, so its answer is the same): tasks seeded by a
        # restore often share one prompt input, a read each was a tenth of the seed;
        # their frame headers are confirmed in bulk, one read per run of neighbouring
        # extents (a refill's fresh inputs), and what that does not confirm is checked
        # one by one, with the same error as before
        self.store.check_published_many(list(dict.fromkeys(refs)), f"queue {self.owner}")
        todo: _Adopted = {(r.path, r.offset): (r.segment, self.store.cached_needs(r.segment))
                          for r in refs}
        with self._mutex:
            self._check_usable()
            for e in todo:
                self._adding[e] += 1
            new = [e for e in todo if e not in self._rooted]
        if new:
            try:
                ok = self.store.catalog.adopt(self.owner, self._epoch, add=new,
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

    def _wait(self, seq: int, adopted: _Adopted | None = None) -> None:
        try:
            self.journal.wait(seq)
        except BaseException as e:
            self._fail(e)
        with self._mutex:
            done = [s for s in self._seq_commits if s <= seq]
            for s in done:
                self._durable_commits = max(self._durable_commits, self._seq_commits.pop(s))
            # staging of data the queue adopted can go once the entry is durable (D2)
            self._unstage.update(adopted or {})
            snap = self._since_snapshot >= self.snapshot_every
        if snap:
            # this caller's transaction is already durable: a failed snapshot must not be
            # reported as its failure (the journal stays usable; a later one retries)
            try:
                self._write_snapshot()
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

    def _write_snapshot(self) -> None:
        """Write a journal snapshot now (recovery then reads it plus a short suffix).
        History first (D9, spec H1): what became history since the last snapshot goes to
        a durable history segment, and the snapshot carries only the live state and the
        segments' manifest; segments it no longer names are deleted only once it is
        durable and the fence passed (``Journal.snapshot`` returned)."""
        with self._mutex:
            self._check_usable()
            delta = self.state.history_delta()
            history = self.state.history
            if delta.size():
                try:
                    history = (history or History(self.fs, self.history_dir)).extended(
                        delta, self._epoch, self._last_seq)
                except OSError as e:
                    raise storage_error(e, f"queue {self.owner}: history segment not "
                                        "written") from e
                self.state.install_history(history, delta)
            state = msgpack.packb(self.state.to_snapshot(), use_bin_type=True)
            self.journal.snapshot(state)
            self._since_snapshot = 0
            if history is not None:
                history.cleanup(self._epoch)

    # --- validation helpers -------------------------------------------------------------
    def _check_ref(self, ref: object, where: str) -> RecordSetRef:
        # straw-queue takes a reference's dict form (``asdict(ref)``, e.g. one that came
        # back from task_status or over RPC) wherever it takes a reference
        if isinstance(ref, Mapping):
            ref = RecordSetRef.from_dict(ref)
        if not isinstance(ref, RecordSetRef):
            raise TypeError(f"{where} must be a RecordSetRef (or its dict form), got "
                            f"{type(ref).__name__}")
        ref.check()
        if ref.run_id != self.store.run_id:
            raise InvalidReference(f"{where} belongs to run {ref.run_id!r}, the queue's store "
                                   f"is run {self.store.run_id!r}")
        return ref

    def _meta(self, metadata: object, where: str) -> Any:
        text = canonical_metadata(metadata, where)
        if len(text) > self._bounds.metadata_bytes:
            raise ResourceLimitExceeded(
                f"{where}.metadata is {len(text)} bytes; the limit is "
                f"{self.limits.metadata_bytes} (Limits.metadata_bytes)")
        return json.loads(text)

    def _task(self, task_id: object) -> Any:
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        task = self.state.tasks.get(task_id)
        if task is None:
            raise ValueError(f"queue {self.owner}: unknown task id {task_id!r}")
        return task

    def _id(self, *parts: Any) -> str:
        """A name derived from this queue's identity (run, namespace, queue) and ``parts``:
        the same in every process and after recovery, distinct across queues and runs.
        The hashed text is ``json.dumps([run, namespace, queue, *parts])``; its constant
        head is encoded once (``_id_head``), which gives the same text."""
        key = self._id_head + json.dumps(parts, separators=(",", ":"))[1:]
        return hashlib.sha256(key.encode()).hexdigest()

    def _derived(self, parts: tuple[Any, ...], size: int) -> str:
        """``_id(*parts)[:size]``, remembered: every lease check derives its attempt id and
        token again, and hashing them was a visible part of a completion's cost.  The
        memo only saves the hashing (the values are pure functions of ``parts``); it is
        bounded by starting afresh when full."""
        got = self._id_memo.get(parts)
        if got is None:
            if len(self._id_memo) >= _ID_MEMO_SIZE:
                self._id_memo.clear()
            got = self._id_memo[parts] = self._id(*parts)[:size]
        return got

    def _attempt_id(self, task_id: str, generation: int) -> str:
        # generations are never reused (lease grants are journaled), so neither is this
        return self._derived(("attempt", task_id, generation), 32)

    def _token(self, attempt_id: str, worker_id: str, epoch: int) -> str:
        # binds the lease's fields: a lease edited by hand (another worker, another epoch)
        # is not current; it is a checksum, not a secret
        return self._derived(("lease", attempt_id, worker_id, epoch), 64)

    def _check_lease(self, lease: object, *, allow_expired: bool = False,
                     where: str = "lease") -> Any:
        """The task of a current lease (mutex held); StaleAttempt/LeaseExpired otherwise."""
        lease = _check_lease_fields(lease, where)
        if lease.queue_id != self.queue_id or lease.run_id != self.store.run_id:
            # another queue's lease authorises nothing here: stale, as straw-queue answers
            # it, so a heartbeat reports it per lease rather than failing the whole call
            raise StaleAttempt(f"{where} of queue {lease.queue_id!r} (run {lease.run_id!r}) "
                               f"given to queue {self.queue_id!r} (run "
                               f"{self.store.run_id!r}): drop the work, or pass the lease "
                               "to the coordinator of the queue that granted it")
        if lease.coordinator_epoch != str(self._epoch):
            raise StaleAttempt(
                f"lease of task {lease.task_id!r} attempt {lease.attempt_id} was granted by "
                f"coordinator epoch {lease.coordinator_epoch}; the queue is at epoch "
                f"{self._epoch}. Drop the work; the task was returned to the queue")
        task = self.state.tasks.get(lease.task_id)
        if task is None:
            # a lease naming a task the queue does not know (a task id edited, or another
            # queue's lease) authorises nothing: stale, as straw-queue answers it, so a
            # heartbeat or release reports it per lease and never fails the whole call
            raise StaleAttempt(
                f"lease of task {lease.task_id!r} attempt {lease.attempt_id}: queue "
                f"{self.owner} has no such task; drop the work (pass the lease that "
                "acquire returned, unedited)")
        current = (task.status == LEASED and task.lease is not None
                   and task.lease[0] == lease.generation and task.lease[1] == lease.worker_id)
        if not current or lease.attempt_id != self._attempt_id(task.task_id, lease.generation) \
                or lease.token != self._token(lease.attempt_id, lease.worker_id, self._epoch):
            raise StaleAttempt(
                f"task {lease.task_id!r} attempt {lease.attempt_id} (generation "
                f"{lease.generation}) is no longer leased to {lease.worker_id!r} (status "
                f"{task.status}, generation {task.attempt})")
        if not allow_expired and self.clock.now() > self._deadlines.get(lease.task_id, 0.0):
            # journaled as an expiry by the next acquire; the right to commit ends now
            raise LeaseExpired(
                f"lease of task {lease.task_id!r} attempt {lease.attempt_id} expired; renew "
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

    def _lease_from(self, task_id: str, generation: int, worker_id: str, epoch: int) -> Lease:
        attempt_id = self._attempt_id(task_id, generation)
        return Lease(self.store.run_id, self.queue_id, task_id, attempt_id, generation,
                     str(epoch), self._token(attempt_id, worker_id, epoch), worker_id)

    def _lease_of(self, task: Any) -> Lease:
        generation, worker, epoch = task.lease
        return self._lease_from(task.task_id, generation, worker, epoch)

    def _spec_of(self, task: Any) -> TaskSpec:
        records, nbytes, tokens = task.estimates
        return TaskSpec(task.task_id, self._to_ref(task.input), task.metadata,
                        task.allow_empty, task.max_attempts, records, nbytes, tokens,
                        task.control, task.priority, task.key)

    def _to_ref(self, t: RefTuple | None) -> RecordSetRef | None:
        if t is None:
            return None
        return ref_from_tuple(self.store.run_id, t)

    def _known(self, request_id: str, digest: str, kind: str) -> tuple[str, ...] | None:
        """The reply of an earlier request with this id (mutex held): D7, a retry is
        answered from the state; another content under the id is a conflict."""
        known = self.state.requests.get(request_id)
        if known is None:
            return None
        if known[0] != digest:
            raise IdempotencyConflict(
                f"queue {self.owner}: request_id {request_id!r} was already used for other "
                f"content (this is a {kind}); use a new request_id for new content")
        return known[1]

    def _replayed(self, result: tuple[str, ...]) -> tuple[str, ...]:
        """Answer a retry once the original is durable (it may still be in flight)."""
        self._wait(self._last_seq)
        return result

    def _request_id(self, request_id: object, *, optional: bool = False) -> str | None:
        if request_id is None and optional:
            return None
        _check_id("request_id", request_id)
        return request_id  # type: ignore[return-value]

    # --- tasks --------------------------------------------------------------------------
    def submit_tasks(self, request_id: str, tasks: Sequence[TaskSpec], *,
                     producer_id: str | None = None,
                     producer_state: Mapping[str, Any] | None = None) -> list[str]:
        """Submit tasks atomically; returns their ids.  A retry with the same
        ``request_id`` and content returns the original ids; different content raises
        ``IdempotencyConflict`` (so does a task id another request submitted).
        ``producer_state`` (small JSON, ``producer_state(producer_id)`` reads it back) is
        saved in the same journal transaction: a producer's cursor advances exactly when
        its tasks exist."""
        self._check_process()
        _check_id("request_id", request_id)
        if isinstance(tasks, TaskSpec) or not isinstance(tasks, Sequence):
            raise TypeError("tasks must be a list of TaskSpec")
        if len(tasks) > self._bounds.max_tasks_per_request:
            raise ResourceLimitExceeded(
                f"{len(tasks)} tasks in one request; the limit is "
                f"{self.limits.max_tasks_per_request} (Limits.max_tasks_per_request)")
        rows = []
        seen: set[str] = set()
        for i, spec in enumerate(tasks):
            rows.append(self._task_row(f"tasks[{i}]", spec, seen))
        producer = None
        # references in a producer's state (its continuation: a cursor's record, an RNG
        # state) are queue roots while the state is the producer's latest, as a consumer's
        # state_ref is (straw-queue keeps them too); retained before the journal (D2)
        held: list[RecordSetRef] = []
        if producer_id is not None:
            _check_id("producer_id", producer_id)
            plain, found = record_sets_in(producer_state or {})
            held = [self._check_ref(r, "producer_state reference") for r in found]
            producer = [producer_id, self._meta(plain, "producer_state")]
        elif producer_state is not None:
            raise ValueError("producer_state needs a producer_id to be saved under")
        digest = _digest(["submit", rows, producer])
        with self._mutex:
            self._check_usable()
            known = self._known(request_id, digest, "submit")
        if known is not None:
            return list(self._replayed(known))
        adopted = self._adopt([self._check_ref(t.input_ref, "input_ref") for t in tasks
                               if t.input_ref is not None] + held)
        try:
            with self._mutex:
                self._check_usable()
                known = self._known(request_id, digest, "submit")
                if known is not None:
                    seq = -1  # a concurrent retry got there first: replayed below
                elif self.state.sealed or self._draining:
                    raise ValueError(f"queue {self.owner}: input is sealed or draining; no "
                                     "more tasks")
                else:
                    for r in rows:
                        if r[0] in self.state.tasks:
                            raise IdempotencyConflict(
                                f"queue {self.owner}: task id {r[0]!r} already exists "
                                "(submitted by another request); task ids are new within a "
                                "queue")
                    if self.state.pending_count + len(rows) > self._bounds.pending_tasks:
                        raise ResourceLimitExceeded(
                            f"queue {self.owner} holds {self.state.pending_count} pending "
                            f"tasks; the limit is {self.limits.pending_tasks} "
                            "(Limits.pending_tasks)")
                    seq = self._enqueue({"t": "submit", "req": request_id, "digest": digest,
                                         "tasks": rows, "producer": producer})
        finally:
            self._done_adopting(adopted)
        if known is not None:  # outside the mutex: replaying waits for the original
            return list(self._replayed(known))
        self._wait(seq, adopted)
        return [r[0] for r in rows]

    def _task_row(self, w: str, spec: object, seen: set[str]) -> list[Any]:
        """A TaskSpec checked and as its journal row (see ``straw.queue_state``)."""
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"{w} must be a TaskSpec, got {type(spec).__name__}")
        _check_id(f"{w}.task_id", spec.task_id)
        if spec.task_id in seen:
            raise IdempotencyConflict(f"{w}.task_id {spec.task_id!r} appears twice in the "
                                      "request; task ids are new within a queue")
        seen.add(spec.task_id)
        inp = None if spec.input_ref is None else _ref_tuple(
            self._check_ref(spec.input_ref, f"{w}.input_ref"))
        for name in ("priority", "scheduling_key"):
            _check_int64(f"{w}.{name}", getattr(spec, name))
        check_count(f"{w}.max_attempts", spec.max_attempts, minimum=1)
        for name in ("allow_empty", "control"):
            if not isinstance(getattr(spec, name), bool):
                raise TypeError(f"{w}.{name} must be a bool, got "
                                f"{type(getattr(spec, name)).__name__}")
        # unsigned 64-bit, as straw-queue's; sums of them are checked where reported
        est = [check_u64(f"{w}.estimated_{n}", getattr(spec, f"estimated_{n}"))
               for n in ("records", "bytes", "tokens")]
        if spec.control and any(est):
            raise ValueError(f"{w} is a control task: its estimated_records, estimated_bytes "
                             "and estimated_tokens must be 0 (control tasks reserve no "
                             "production)")
        return [spec.task_id, list(inp) if inp else None, self._meta(spec.metadata, w),
                spec.priority, spec.scheduling_key, spec.max_attempts, spec.control,
                spec.allow_empty, *est]

    def producer_state(self, producer_id: str) -> Any:
        """The state last saved with ``submit_tasks(..., producer_id=...)``, or None."""
        self._check_process()
        _check_id("producer_id", producer_id)
        with self._mutex:
            state = self.state.producers.get(producer_id)
        return None if state is None else json.loads(json.dumps(state))  # the caller's copy

    def acquire(self, worker_id: str, max_tasks: int = 1, *,
                task_ids: Sequence[str] | None = None, task_prefix: str | None = None,
                control: bool = False) -> AcquireResult:
        """Lease up to ``max_tasks`` pending tasks of the default lane (of the control lane
        with ``control=True``) in scheduling order; ``task_ids`` is a set filter (repeated,
        unknown or non-pending ids are skipped), ``task_prefix`` another."""
        self._check_process()
        _check_id("worker_id", worker_id)
        check_count("max_tasks", max_tasks, minimum=1)
        if task_prefix is not None and not isinstance(task_prefix, str):
            raise TypeError(f"task_prefix must be None or a str, got {type(task_prefix).__name__}")
        if isinstance(task_ids, (str, bytes)):  # a str would lease its characters
            raise TypeError("task_ids must be a list of task ids, not one str")
        if not isinstance(control, bool):
            raise TypeError(f"control must be a bool, got {type(control).__name__}")
        with self.journal.incoming(), self._mutex:
            self._check_usable()
            last = self._expire_due()
            status, chosen, grant = self._grant_locked(worker_id, max_tasks, task_ids,
                                                       task_prefix, control)
            if grant is not None:
                last = self._enqueue(grant)
            out = self._assigned(chosen)
        if last is not None:
            self._wait(last)
        return AcquireResult(status, out)

    def _grant_locked(self, worker_id: str, max_tasks: int, task_ids: Sequence[str] | None,
                      task_prefix: str | None, control: bool
                      ) -> tuple[str, list[Any], dict[str, Any] | None]:
        """acquire's choice (mutex held, expiries journaled): (status, the tasks chosen, the
        lease transaction granting them — for the caller to enqueue — or None)."""
        lim = self._bounds
        st = self.state
        held = in_lane = 0
        for t in self._deadlines:
            task = st.tasks[t]
            if task.status != LEASED or task.lease is None:
                continue
            held += task.lease[1] == worker_id
            in_lane += task.control == control
        lane_limit = lim.control_tasks if control else lim.inflight_tasks
        room = min(lim.max_leases_per_worker - held, lane_limit - in_lane)
        # the control lane drains produced work: a lagging consumer does not hold it
        lagging = (not control and lim.max_unconsumed_results is not None and
                   len(st.commits) - st.retirement_cursor(self.consumer_id)
                   >= lim.max_unconsumed_results)
        chosen: list[Any] = []
        if self._draining:  # drain(): nothing more is handed out here
            status = "draining"
        elif room <= 0 or lagging:
            status = "backpressured"
        else:
            chosen = self._choose(max_tasks, task_prefix, task_ids, control, room)
            status = "acquired" if chosen else self._idle_status()
        if not chosen:
            return status, chosen, None
        grants = [[t.task_id, t.attempt + 1] for t in chosen]
        return status, chosen, {"t": "lease", "epoch": self._epoch, "worker": worker_id,
                                "grants": grants}

    def _assigned(self, chosen: list[Any]) -> tuple[Assignment, ...]:
        """The assignments of tasks just leased (mutex held, lease applied): their
        deadlines start now."""
        deadline = self.clock.now() + self.lease_seconds
        for t in chosen:
            self._deadlines[t.task_id] = deadline
        return tuple(Assignment(self._spec_of(t), self._lease_of(t)) for t in chosen)

    def _choose(self, n: int, prefix: str | None, task_ids: Sequence[str] | None,
                control: bool, room: int) -> list[Any]:
        n = min(n, room)
        if task_ids is None:
            return self.state.best_pending(control, n, prefix)
        wanted = []
        for tid in dict.fromkeys(task_ids):  # a repeated id is one task, leased once
            if not isinstance(tid, str):
                raise TypeError(f"task_ids must hold str task ids, got {type(tid).__name__}")
            task = self.state.tasks.get(tid)
            if task is not None and task.status == PENDING and task.control == control and \
                    (prefix is None or tid.startswith(prefix)):
                wanted.append(task)
        wanted.sort(key=lambda t: t.order())  # scheduling order decides among them
        return wanted[:n]

    def _idle_status(self) -> str:
        # straw-queue's answers: ``end_of_input`` only once input is sealed and no task is
        # pending or leased (a leased one may still come back to pending); ``draining`` is
        # ``drain()``'s alone (answered before any choice is made)
        st = self.state
        if st.sealed and st.pending_count == 0 and st.leased_count == 0:
            return "end_of_input"
        return "empty"

    def heartbeat(self, leases: Sequence[Lease]) -> list[str]:
        """Renew leases.  One outcome per lease, in order: ``extended`` (its deadline moved
        on), ``LeaseExpired`` (its deadline had passed: it can no longer commit) or
        ``StaleAttempt`` (it is not current: completed, re-leased, cancelled, or of an older
        coordinator epoch).  ``Fenced`` if this coordinator is no longer the queue's."""
        self._check_process()
        if isinstance(leases, (Lease, Mapping)) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        leases = [_check_lease_fields(le, f"leases[{i}]") for i, le in enumerate(leases)]
        try:
            self._fence_check()  # a fenced coordinator must not keep workers busy
        except Fenced as e:
            self._fail(e)
        out = []
        with self._mutex:
            self._check_usable()
            for i, lease in enumerate(leases):
                try:
                    task = self._check_lease(lease, where=f"leases[{i}]")
                except LeaseExpired:
                    out.append("LeaseExpired")
                    continue
                except StaleAttempt:
                    out.append("StaleAttempt")
                    continue
                self._deadlines[task.task_id] = self.clock.now() + self.lease_seconds
                out.append("extended")
        return out

    def complete_task(self, lease: Lease, *, submission_id: str, result_ref: RecordSetRef,
                      result_digest: str | None = None) -> CommitReceipt:
        """Accept the result of a leased attempt, exactly once (receipt).  A retry with the
        same ``submission_id`` and result returns the original receipt, even after the
        lease ended; different content raises ``IdempotencyConflict``.  The result's
        records must name the lease in their metadata (``task_id``, ``attempt_id``); a
        result of no records is accepted only for a task submitted with
        ``allow_empty=True``.  ``InvalidReference`` if the result is not the attempt's or
        ``result_digest`` is not the reference's digest."""
        self._check_process()
        lease, ref, key = self._completion_args(lease, submission_id, result_ref,
                                                result_digest)
        # siblings: announced to the catalog and the journal, so that concurrent
        # completions share one catalog fsync and one journal sync (group commit)
        started = time.perf_counter()
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, done, adopted, _ = self._complete(lease, submission_id, ref, key, announced)
        self._wait(seq, adopted)
        if done is not None:
            return done
        self._complete_seconds.append(time.perf_counter() - started)
        return self._receipt(self.state.submissions[submission_id])

    def complete_and_acquire(self, lease: Lease, *, submission_id: str,
                             result_ref: RecordSetRef, result_digest: str | None = None,
                             max_tasks: int = 1, control: bool = False
                             ) -> tuple[CommitReceipt, AcquireResult]:
        """straw's addition (straw-queue has no such call): ``complete_task`` and then
        ``acquire(lease.worker_id, max_tasks, control=control)`` in ONE journal transaction,
        so a worker's loop pays one durable step per task instead of two.  Returns
        (receipt, acquire result).  The completion is checked exactly as by
        ``complete_task`` (and raises as it does, leasing nothing); the commit and the
        grant are one journal frame: a crash keeps both or neither.  A retry of an accepted
        ``submission_id`` returns the original receipt with a plain ``acquire``: a task
        granted with a reply that was lost stays leased until its deadline passes (the
        worker never saw that lease), then returns to the queue as any expired lease."""
        self._check_process()
        lease, ref, key = self._completion_args(lease, submission_id, result_ref,
                                                result_digest)
        check_count("max_tasks", max_tasks, minimum=1)
        if not isinstance(control, bool):
            raise TypeError(f"control must be a bool, got {type(control).__name__}")
        started = time.perf_counter()
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, done, adopted, got = self._complete(lease, submission_id, ref, key, announced,
                                                     then_acquire=(max_tasks, control))
        self._wait(seq, adopted)
        if done is not None:  # a retry: its grant (if any) was never seen; lease anew
            return done, self.acquire(lease.worker_id, max_tasks, control=control)
        self._complete_seconds.append(time.perf_counter() - started)
        assert got is not None
        return self._receipt(self.state.submissions[submission_id]), got

    def complete_tasks(self, items: Sequence[Mapping[str, Any]]
                       ) -> list[CommitReceipt | StrawError]:
        """straw's addition: ``complete_task`` of many leased attempts in ONE journal frame
        and one catalog adoption (a controller returning a call of 64 groups pays one
        durable step for them, not 64 shared among threads).  Each item is a dict of
        ``complete_task``'s keywords (``lease``, ``submission_id``, ``result_ref``,
        optional ``result_digest``).  Returns one outcome per item, in order: its receipt,
        or the ``StrawError`` that refused it (``StaleAttempt``, ``LeaseExpired``,
        ``InvalidReference``, ``IdempotencyConflict``, ...), exactly as ``complete_task``
        would answer it alone; a refused item does not stop the others.  The accepted
        completions are one frame: a crash keeps all of them or none, and a retry of the
        call (same submission ids) returns the same receipts.  A malformed item is a
        ``TypeError``/``ValueError`` for the whole call, before anything is written; a
        storage error is raised for the whole call (nothing was journaled: retry it)."""
        self._check_process()
        if isinstance(items, Mapping) or not isinstance(items, Sequence):
            raise TypeError("items must be a list of dicts with 'lease', 'submission_id' and "
                            "'result_ref' (optional 'result_digest')")
        args = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or not {"lease", "submission_id",
                                                     "result_ref"} <= set(item):
                raise TypeError(f"items[{i}] must be a dict with 'lease', 'submission_id' "
                                f"and 'result_ref'")
            extra = set(item) - {"lease", "submission_id", "result_ref", "result_digest"}
            if extra:
                raise TypeError(f"items[{i}] has unknown keys {sorted(extra)}")
            lease, ref, key = self._completion_args(item["lease"], item["submission_id"],
                                                    item["result_ref"], item.get("result_digest"))
            args.append((item["submission_id"], lease, ref, key))
        if not args:
            return []
        started = time.perf_counter()
        outcomes: list[CommitReceipt | StrawError | None] = [None] * len(args)
        with self.journal.incoming(), self.store.catalog.adopting_soon() as announced:
            seq, adopted = self._complete_batch(args, outcomes, announced)
        self._wait(seq, adopted)
        out: list[CommitReceipt | StrawError] = []
        for (sub, _, _, _), o in zip(args, outcomes, strict=True):
            out.append(o if o is not None else self._receipt(self.state.submissions[sub]))
        if any(o is None for o in outcomes):
            self._complete_seconds.append(time.perf_counter() - started)
        return out

    def _completion_txn(self, task_id: str, lease: Lease, submission_id: str,
                        ref: RecordSetRef) -> dict[str, Any]:
        """The journal transaction of an accepted completion (complete_task's and each
        accepted item of complete_tasks')."""
        return {"t": "complete", "task": task_id, "attempt": lease.generation,
                "sub": submission_id, "result": list(_ref_tuple(ref)), "digest": ref.digest,
                "epoch": self._epoch, "meta": {"worker": lease.worker_id}}

    def _complete_batch(self, args: list[tuple[str, Lease, RecordSetRef, list[Any]]],
                        outcomes: list[CommitReceipt | StrawError | None],
                        announced: Announcement) -> tuple[int, _Adopted]:
        """complete_tasks up to the enqueue (the steps of ``_complete`` for many items):
        fills ``outcomes`` with the receipts of retries and the errors of refused items
        (None: accepted in this call's frame); returns (sequence number, extents adopted)."""
        todo: list[tuple[int, Lease, str, RecordSetRef, list[Any], bool]] = []
        with self._mutex:
            self._check_usable()
            for i, (sub, lease, ref, key) in enumerate(args):
                try:
                    done = self._completed_receipt(sub, key)
                    if done is None:
                        allow = self._check_lease(lease, allow_expired=True).allow_empty
                except StrawError as e:
                    outcomes[i] = e
                    continue
                if done is not None:
                    outcomes[i] = done
                else:
                    todo.append((i, lease, sub, ref, key, allow))
        checked = []
        for i, lease, sub, ref, key, allow in todo:
            try:
                if key[2] != ref.digest:
                    raise InvalidReference(f"result_digest {key[2]!r} differs from the "
                                           f"reference's digest {ref.digest!r}")
                self._check_result(ref, lease, allow)
            except (StorageUnavailable, Closed):  # QuotaExceeded too
                raise  # not this item's fault: the whole call, nothing journaled
            except StrawError as e:
                outcomes[i] = e
                continue
            checked.append((i, lease, sub, ref, key))
        adopted = self._adopt([c[3] for c in checked], announced)
        seq = self._last_seq
        try:
            with self._mutex:
                self._check_usable()
                txns = []
                for i, lease, sub, ref, key in checked:
                    try:
                        done = self._completed_receipt(sub, key)
                        if done is not None:  # a concurrent call (or an earlier item)
                            outcomes[i] = done
                            continue
                        task = self._check_lease(lease)
                    except StrawError as e:
                        outcomes[i] = e
                        continue
                    txn = self._completion_txn(task.task_id, lease, sub, ref)
                    self.state.apply(txn)  # journal order = apply order (one frame)
                    self._deadlines.pop(task.task_id, None)
                    txns.append(txn)
                if txns:
                    seq = self.journal.enqueue_many(
                        [msgpack.packb(t, use_bin_type=True) for t in txns])
                    self._last_seq = seq
                    self._seq_commits[seq] = len(self.state.commits)
                    self._since_snapshot += len(txns)
        finally:
            self._done_adopting(adopted)
        return seq, adopted

    def _completion_args(self, lease: object, submission_id: object, result_ref: object,
                         result_digest: object) -> tuple[Lease, RecordSetRef, list[Any]]:
        """complete_task's argument checks: (lease, reference, idempotency key)."""
        _check_id("submission_id", submission_id)
        ref = self._check_ref(result_ref, "result_ref")
        if result_digest is not None and not isinstance(result_digest, str):
            raise TypeError(f"result_digest must be None or a str, got "
                            f"{type(result_digest).__name__}")
        lease = _check_lease_fields(lease, "lease")
        # The result's logical digest (the one claimed), not its location: a retry of a lost
        # reply that republished the same records elsewhere (another pack, a restarted
        # writer) is the same completion (D7), as in straw-queue; another digest is a
        # conflict.  A claimed digest that differs from the reference's is refused by
        # _complete unless the submission is known (then it is a conflict, as there).
        key = [lease.task_id, lease.generation,
               ref.digest if result_digest is None else result_digest]
        return lease, ref, key

    def _complete(self, lease: Lease, submission_id: str, ref: RecordSetRef,
                  key: list[Any], announced: Announcement,
                  then_acquire: tuple[int, bool] | None = None,
                  ) -> tuple[int, CommitReceipt | None, _Adopted,
                             AcquireResult | None]:
        """complete_task up to the enqueue: (sequence number to wait for, the original
        receipt of a retry or None, the extents adopted, and — with ``then_acquire``
        (max_tasks, control) — the acquire result whose grant shares the commit's frame)."""
        with self._mutex:
            self._check_usable()
            done = self._completed_receipt(submission_id, key)
            if done is None:
                allow_empty = self._check_lease(lease, allow_expired=True).allow_empty
        if done is not None:
            return self._last_seq, done, {}, None
        if key[2] != ref.digest:
            raise InvalidReference(f"result_digest {key[2]!r} differs from the "
                                   f"reference's digest {ref.digest!r}")
        self._check_result(ref, lease, allow_empty)
        adopted = self._adopt([ref], announced)
        got = None
        try:
            with self._mutex:
                self._check_usable()
                done = self._completed_receipt(submission_id, key)
                if done is None:
                    task = self._check_lease(lease)
                    txn = self._completion_txn(task.task_id, lease, submission_id, ref)
                    if then_acquire is None:
                        seq = self._enqueue(txn)
                        self._deadlines.pop(task.task_id, None)
                    else:
                        seq, got = self._complete_then_grant(txn, lease.worker_id,
                                                             *then_acquire)
                else:
                    seq = self._last_seq
        finally:
            self._done_adopting(adopted)
        return seq, done, adopted, got

    def _complete_then_grant(self, complete: dict[str, Any], worker_id: str, max_tasks: int,
                             control: bool) -> tuple[int, AcquireResult]:
        """complete_and_acquire's transaction (mutex held, the lease checked): expiries
        due are journaled first (their own frames, as acquire does), then the commit and
        the grant chosen after it as one frame (``Journal.enqueue_many``)."""
        self._expire_due()  # the completed lease is current: it is not among them
        self.state.apply(complete)
        self._deadlines.pop(complete["task"], None)
        txns = [complete]
        status, chosen, grant = self._grant_locked(worker_id, max_tasks, None, None, control)
        if grant is not None:
            self.state.apply(grant)
            txns.append(grant)
        seq = self.journal.enqueue_many([msgpack.packb(t, use_bin_type=True) for t in txns])
        self._last_seq = seq
        self._seq_commits[seq] = len(self.state.commits)
        self._since_snapshot += len(txns)
        return seq, AcquireResult(status, self._assigned(chosen))

    def _completed_receipt(self, submission_id: str, key: list[Any]) -> CommitReceipt | None:
        pos = self.state.submissions.get(submission_id)
        if pos is None:
            return None
        rec = self.state.commits[pos]
        if [rec.task_id, rec.attempt, rec.digest] != key:
            raise IdempotencyConflict(
                f"submission_id {submission_id!r} already accepted task {rec.task_id!r} "
                f"attempt {self._attempt_id(rec.task_id, rec.attempt)} with another result; "
                "use a new submission_id")
        return self._receipt(pos)

    def _receipt(self, pos: int) -> CommitReceipt:
        rec = self.state.commits[pos]
        ref = self._to_ref(rec.result)
        assert ref is not None
        return CommitReceipt(self._id("commit", pos, rec.submission_id)[:32], rec.task_id,
                             rec.submission_id, rec.digest, pos, ref)

    def _check_result(self, ref: RecordSetRef, lease: Lease, allow_empty: bool) -> None:
        """The result belongs to the lease's attempt and is within the result limits."""
        manifest = self.store.checked_manifest(ref)
        if not manifest.records:
            if not allow_empty:
                raise InvalidReference(
                    f"the result of task {lease.task_id!r} has no records; the task does not "
                    "allow an empty result (submit it with allow_empty=True)")
            return
        named = False
        nbytes = tokens = 0
        for info in manifest.records:
            nbytes += info.length
            tokens += info.tokens or 0
            meta = info.metadata
            if "task_id" in meta or "attempt_id" in meta:
                if meta.get("task_id") != lease.task_id or \
                        meta.get("attempt_id") != lease.attempt_id:
                    raise InvalidReference(
                        f"result record {info.record_id!r} names task "
                        f"{meta.get('task_id')!r} attempt {meta.get('attempt_id')!r}: it belongs "
                        f"to another attempt than the lease's (task {lease.task_id!r} attempt "
                        f"{lease.attempt_id!r}); complete each task with its own result")
                named = True
        if not named:
            raise InvalidReference(
                "the result's records must name the lease in their metadata: publish them "
                f"with metadata={{'task_id': {lease.task_id!r}, 'attempt_id': "
                f"{lease.attempt_id!r}}}")
        for what, value, limit in (("bytes", nbytes, self._bounds.max_result_bytes),
                                   ("tokens", tokens, self._bounds.max_result_tokens)):
            # unenforced (INT64_MAX, the most a Limits field holds) no result is refused:
            # a result's usage may reach 2**64-1, as in straw-queue
            if value > limit and self._enforce_limits:
                raise ResourceLimitExceeded(
                    f"the result of task {lease.task_id!r} holds {value} payload {what}; the "
                    f"limit is {limit} (Limits.max_result_{what})")

    def fail_task(self, lease: Lease, *, request_id: str | None = None, failure: Any = None,
                  retryable: bool = True) -> str:
        """The attempt failed (``failure``: JSON describing why).  The task returns to the
        queue while its attempt budget lasts (``pending``), else, or with
        ``retryable=False``, it fails for good (``failed``); returns which.  With a
        ``request_id``, a retry after a lost reply gets the same answer."""
        self._check_process()
        request_id = self._request_id(request_id, optional=True)
        if not isinstance(retryable, bool):
            raise TypeError(f"retryable must be a bool, got {type(retryable).__name__}")
        error = self._meta({"failure": failure}, "failure")["failure"]
        lease = _check_lease_fields(lease, "lease")
        digest = _digest(["fail", lease.task_id, lease.generation, lease.attempt_id, error,
                          retryable])
        with self._mutex:
            self._check_usable()
            known = None if request_id is None else self._known(request_id, digest, "fail")
            if known is None:
                task = self._check_lease(lease)
                final = (not retryable) or task.failures + 1 >= task.max_attempts
                outcome = FAILED if final else PENDING
                txn: dict[str, Any] = {"t": "fail", "task": task.task_id,
                                       "attempt": lease.generation, "error": error,
                                       "final": final}
                if request_id is not None:
                    txn.update(req=request_id, digest=digest, result=[outcome])
                seq = self._enqueue(txn)
                self._deadlines.pop(task.task_id, None)
        if known is not None:
            return self._replayed(known)[0]
        self._wait(seq)
        return outcome

    def yield_task(self, lease: Lease, *, request_id: str,
                   input_ref: RecordSetRef | None) -> str:
        """``yield_tasks`` of one lease: the task returns to pending with ``input_ref``."""
        self._check_process()
        return self.yield_tasks([{"lease": lease, "input_ref": input_ref}],
                                request_id=request_id)

    def yield_tasks(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        """Return leased tasks with continuation inputs, atomically for the batch, without
        spending a retry; returns ``pending``.  Each update: ``lease``, ``input_ref`` (None
        keeps the input), and optionally ``priority``, ``scheduling_key``, ``metadata``.
        A stale lease refuses the whole batch; a retry of the same request returns the
        same answer."""
        self._check_process()
        _check_id("request_id", request_id)
        rows = []
        for i, u in self._updates(updates):
            w = f"updates[{i}]"
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
        digest = _digest(["yield", [[r[0].task_id, r[0].generation, r[0].attempt_id,
                                     list(ref_identity(_ref_tuple(r[1]))) if r[1] else None,
                                     r[2], r[3], r[4]]
                                    for r in rows]])
        with self._mutex:
            self._check_usable()
            known = self._known(request_id, digest, "yield")
        if known is not None:
            self._replayed(known)
            return PENDING
        adopted = self._adopt([r[1] for r in rows if r[1] is not None])
        try:
            with self._mutex:
                self._check_usable()
                known = self._known(request_id, digest, "yield")
                if known is None:
                    txn_rows = []
                    for i, (lease, ref, prio, key, meta) in enumerate(rows):
                        task = self._check_lease(lease, where=f"updates[{i}]['lease']")
                        prio = task.priority if prio is None else prio
                        key = task.key if key is None else key
                        meta = task.metadata if meta is None else meta
                        new_input = list(_ref_tuple(ref)) if ref is not None else (
                            list(task.input) if task.input else None)
                        txn_rows.append([task.task_id, lease.generation, new_input, prio, key,
                                         meta])
                    seq = self._enqueue({"t": "yield", "req": request_id, "digest": digest,
                                         "updates": txn_rows})
                    for r in txn_rows:
                        self._deadlines.pop(r[0], None)
        finally:
            self._done_adopting(adopted)
        if known is not None:
            self._replayed(known)
            return PENDING
        self._wait(seq, adopted)
        return PENDING

    def _updates(self, updates: object) -> list[tuple[int, Mapping[str, Any]]]:
        if isinstance(updates, (Mapping, str, bytes)) or not isinstance(updates, Sequence):
            raise TypeError("updates must be a list of dicts with 'lease' and 'input_ref'")
        if not updates:
            raise ValueError("updates is empty: give at least one lease")
        for i, u in enumerate(updates):
            if not isinstance(u, Mapping):
                raise TypeError(f"updates[{i}] must be a dict, got {type(u).__name__}")
        return list(enumerate(updates))

    def save_task_progress(self, lease: Lease, *, request_id: str,
                           input_ref: RecordSetRef) -> str:
        """``save_task_progress_many`` of one lease."""
        self._check_process()
        return self.save_task_progress_many([{"lease": lease, "input_ref": input_ref}],
                                            request_id=request_id)

    def save_task_progress_many(self, updates: Sequence[Mapping[str, Any]], *,
                                request_id: str) -> str:
        """Make each update's ``input_ref`` (a continuation) the input of its leased task,
        atomically for the batch, keeping the leases (``yield_tasks`` ends them); returns
        ``saved``.  A later attempt (after expiry, failure or recovery) starts from it.
        What the worker read before stays protected until its attempt ends (D5)."""
        self._check_process()
        _check_id("request_id", request_id)
        rows = []
        for i, u in self._updates(updates):
            w = f"updates[{i}]"
            lease = _check_lease_fields(u.get("lease"), f"{w}['lease']")
            rows.append((lease, self._check_ref(u.get("input_ref"), f"{w}['input_ref']")))
        digest = _digest(["progress", [[le.task_id, le.generation, le.attempt_id,
                                        list(_ref_tuple(r))] for le, r in rows]])
        with self._mutex:
            self._check_usable()
            known = self._known(request_id, digest, "save_task_progress")
        if known is not None:
            return self._replayed(known)[0]
        adopted = self._adopt([r for _, r in rows])
        try:
            with self._mutex:
                self._check_usable()
                known = self._known(request_id, digest, "save_task_progress")
                if known is None:
                    txn_rows = [[self._check_lease(le, where=f"updates[{i}]['lease']").task_id,
                                 le.generation, list(_ref_tuple(r))]
                                for i, (le, r) in enumerate(rows)]
                    seq = self._enqueue({"t": "progress", "req": request_id, "digest": digest,
                                         "updates": txn_rows, "result": ["saved"]})
        finally:
            self._done_adopting(adopted)
        if known is not None:
            return self._replayed(known)[0]
        self._wait(seq, adopted)
        return "saved"

    def release_tasks(self, leases: Sequence[Lease], *,
                      request_id: str | None = None) -> list[str]:
        """Give leased tasks back unfinished, without spending a retry.  One outcome per
        lease: ``released``, or ``StaleAttempt`` for a lease that is no longer current
        (nothing to give back).  With a ``request_id`` a retry gets the same answer."""
        self._check_process()
        request_id = self._request_id(request_id, optional=True)
        if isinstance(leases, (Lease, Mapping)) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        leases = [_check_lease_fields(le, f"leases[{i}]") for i, le in enumerate(leases)]
        digest = _digest(["release", [[le.task_id, le.generation, le.attempt_id]
                                      for le in leases]])
        with self._mutex:
            self._check_usable()
            known = None if request_id is None else self._known(request_id, digest,
                                                                "release")
            if known is None:
                rows, outcomes = [], []
                for i, lease in enumerate(leases):
                    try:
                        task = self._check_lease(lease, allow_expired=True,
                                                 where=f"leases[{i}]")
                    except StaleAttempt:
                        outcomes.append("StaleAttempt")
                        continue
                    if [task.task_id, lease.generation] in rows:
                        outcomes.append("StaleAttempt")  # given twice: released once
                        continue
                    rows.append([task.task_id, lease.generation])
                    outcomes.append("released")
                seq = None
                if rows:
                    txn: dict[str, Any] = {"t": "release", "leases": rows}
                    if request_id is not None:
                        txn.update(req=request_id, digest=digest, result=outcomes)
                    seq = self._enqueue(txn)
                    for tid, _ in rows:
                        self._deadlines.pop(tid, None)
        if known is not None:
            return list(self._replayed(known))
        if seq is not None:
            self._wait(seq)
        return outcomes

    def cancel_task(self, task_id: str, *, request_id: str | None = None) -> str:
        """Cancel a pending or leased task (its lease can no longer commit; a reader keeps
        its protection, D5); returns ``cancelled``.  ``ValueError`` for an unknown or
        terminal task, except for a retry of the same request."""
        self._check_process()
        request_id = self._request_id(request_id, optional=True)
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        digest = _digest(["cancel", task_id])
        with self._mutex:
            self._check_usable()
            known = None if request_id is None else self._known(request_id, digest, "cancel")
            if known is None:
                task = self._task(task_id)
                if task.status in TERMINAL:
                    raise ValueError(f"queue {self.owner}: task {task_id!r} is already "
                                     f"{task.status}; only pending or leased tasks can be "
                                     "cancelled")
                txn: dict[str, Any] = {"t": "cancel", "task": task_id}
                if request_id is not None:
                    txn.update(req=request_id, digest=digest, result=[CANCELLED])
                seq = self._enqueue(txn)
                self._deadlines.pop(task_id, None)
        if known is not None:
            return self._replayed(known)[0]
        self._wait(seq)
        return CANCELLED

    def seal_input(self, request_id: str | None = None) -> str:
        """No more submissions: ``acquire`` answers ``end_of_input`` once all are done.
        Idempotent (a retry, under any request id, answers ``sealed``)."""
        self._check_process()
        self._request_id(request_id, optional=True)
        with self._mutex:
            self._check_usable()
            seq = None if self.state.sealed else self._enqueue({"t": "seal"})
        self._wait(self._last_seq if seq is None else seq)
        return "sealed"

    # --- reading ------------------------------------------------------------------------
    def read_commits(self, cursor: int = 0, limit: int = 100) -> CommitPage:
        """Accepted results from position ``cursor`` on (only durable ones)."""
        self._check_process()
        check_count("cursor", cursor)
        check_count("limit", limit, minimum=1)
        with self._mutex:
            end = self._durable_commits
            if cursor > end:
                raise ValueError(f"cursor {cursor} is past the commit log ({end} durable "
                                 "commits)")
            stop = min(end, cursor + limit)
            self._check_not_released(cursor, stop)
            out = tuple(self._receipt(pos) for pos in range(cursor, stop))
            st = self.state
            done = (st.sealed and st.pending_count == 0 and st.leased_count == 0
                    and stop == end == len(st.commits))
        return CommitPage(out, stop, done)

    def _check_not_released(self, start: int, stop: int) -> None:
        """Mutex held: no commit in [start, stop) was released (acknowledged by the
        designated consumer and collected): its data may be gone."""
        cursor, sparse = self._released
        gone = [start] if start < min(stop, cursor) else sorted(
            p for p in sparse if start <= p < stop)
        if gone:
            raise InvalidReference(
                f"queue {self.owner}: commit {gone[0]} was released (consumer "
                f"{self.consumer_id!r} acknowledged it and collect_garbage retired it); "
                "resume from a retained checkpoint or a live cursor")

    def lookup_submission(self, submission_id: str) -> CommitReceipt | None:
        """The receipt of a completion by its submission id (after a lost reply)."""
        self._check_process()
        _check_id("submission_id", submission_id)
        with self._mutex:
            pos = self.state.submissions.get(submission_id)
            if pos is None or pos >= self._durable_commits:
                return None
            return self._receipt(pos)

    def task_status(self, task_id: str) -> dict[str, Any] | None:
        """A task as straw-queue reports it, or None if unknown: ``state`` (pending,
        leased, completed, failed, cancelled), ``spec`` (its TaskSpec as a dict, with its
        current input), ``generation`` (leases granted), ``failures`` (budget spent),
        ``lease`` (the current lease, or the last one of a finished task, as a dict),
        ``pending_order`` and, once it failed, ``failure``.  straw adds ``position`` (the
        commit position of a completed task) and ``deadline`` (of a leased task's lease, in
        the coordinator's clock)."""
        self._check_process()
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        with self._mutex:
            task = self.state.tasks.get(task_id)
            if task is None:
                return None
            out: dict[str, Any] = {
                "failures": task.failures, "generation": task.attempt,
                "lease": None if task.lease is None else self._lease_of(task).to_dict(),
                "pending_order": task.fifo - 1,
                "spec": dataclasses.asdict(self._spec_of(task)), "state": task.status,
            }
            if task.last_error is not None:
                out["failure"] = task.last_error
            if task.position is not None:
                out["position"] = task.position
            if task.status == LEASED and task.task_id in self._deadlines:
                out["deadline"] = self._deadlines[task.task_id]  # in the coordinator's clock
            return out

    def pending_tasks(self, *, task_prefix: str | None = None,
                      min_priority: int | None = None) -> list[TaskSpec]:
        """Pending tasks (both lanes) in acquisition order, as TaskSpecs with their current
        inputs: a snapshot (coordinate a pause to act on it)."""
        self._check_process()
        if task_prefix is not None and not isinstance(task_prefix, str):
            raise TypeError(f"task_prefix must be None or a str, got {type(task_prefix).__name__}")
        if min_priority is not None:
            _check_int64("min_priority", min_priority)
        with self._mutex:
            out = []
            for tid in self.state.pending_in_order():
                task = self.state.tasks[tid]
                if task_prefix is not None and not tid.startswith(task_prefix):
                    continue
                if min_priority is not None and task.priority < min_priority:
                    continue
                out.append(self._spec_of(task))
            return out

    # --- readers (D5) -------------------------------------------------------------------
    def outstanding_reads(self) -> tuple[Lease, ...]:
        """The leases whose reads were not ended (D5: a reader's protection outlives its
        lease; only its own completion, failure or yield, ``release_task_reads`` or
        ``retire_worker`` end it)."""
        self._check_process()
        with self._mutex:
            st = self.state
            return tuple(self._lease_from(t, a, w, st.read_epochs.get((w, t, a), 0))
                         for (w, t, a) in sorted(st.reads))

    def release_task_reads(self, leases: Sequence[Lease]) -> None:
        """A supervisor confirmed that the readers of these leases finished (expired,
        cancelled or recovered leases included): drop their protection.

        As straw-queue: a lease whose attempt has no outstanding reader (released
        already, or never granted) releases nothing; a lease naming an outstanding
        reader's attempt but differing from that reader's lease (an edited task id,
        worker, generation or token) is ``StaleAttempt`` for the whole call, and nothing
        is released (D5: only the reader's own lease ends its protection)."""
        self._check_process()
        if isinstance(leases, (Lease, Mapping)) or not isinstance(leases, Sequence):
            raise TypeError("leases must be a list of Lease")
        leases = [_check_lease_fields(le, f"leases[{i}]") for i, le in enumerate(leases)]
        seq = None
        with self._mutex:
            self._check_usable()
            st = self.state
            by_attempt: dict[str, tuple[str, str, int]] | None = None
            ending = []
            for i, lease in enumerate(leases):
                key: tuple[str, str, int] | None = (lease.worker_id, lease.task_id,
                                                    lease.generation)
                if key not in st.reads or \
                        self._attempt_id(lease.task_id, lease.generation) != lease.attempt_id:
                    # not a reader's own fields: find the reader its attempt id names (the
                    # whole read set hashed once, only for such a lease)
                    if by_attempt is None:
                        by_attempt = {self._attempt_id(t, a): (w, t, a)
                                      for (w, t, a) in st.reads}
                    key = by_attempt.get(lease.attempt_id)
                if key is None:
                    continue
                w, t, a = key
                # 0: a grant recorded before its epoch was (an older snapshot); the token
                # still binds the epoch the lease states
                epoch = st.read_epochs.get(key, 0) or _int_or_none(lease.coordinator_epoch)
                if epoch is None or lease != self._lease_from(t, a, w, epoch):
                    raise StaleAttempt(
                        f"leases[{i}] (task {lease.task_id!r}, attempt {lease.attempt_id}, "
                        f"worker {lease.worker_id!r}) is not the lease of that attempt's "
                        f"reader (task {t!r}, generation {a}, worker {w!r}); nothing was "
                        "released. Pass the leases acquire or outstanding_reads returned, "
                        "unedited")
                ending.append(key)
            for _w, t, a in dict.fromkeys(ending):
                seq = self._enqueue({"t": "reads", "task": t, "attempt": a})
        if seq is not None:
            self._wait(seq)

    def retire_worker(self, worker_id: str) -> list[dict[str, Any]]:
        """The worker is confirmed stopped: its leases are revoked (each spends one unit of
        its task's budget, failure ``{"category": "WorkerLost"}``) and its read
        protections dropped.  Returns the receipts (as dicts) of its accepted results
        that the designated consumer has not processed yet, for the caller to deliver."""
        self._check_process()
        _check_id("worker_id", worker_id)
        with self._mutex:
            self._check_usable()
            st = self.state
            leased = [t for t in self._deadlines if (task := st.tasks[t]).status == LEASED
                      and task.lease is not None and task.lease[1] == worker_id]
            seq = None
            if leased or any(k[0] == worker_id for k in st.reads):
                seq = self._enqueue({"t": "retire", "worker": worker_id, "revoke": True})
                for t in leased:
                    self._deadlines.pop(t, None)
            c = st.consumers.get(self.consumer_id)
            start = c.processed if c is not None else 0
            mine = [pos for pos in range(start, self._durable_commits)
                    if (st.commits[pos].metadata or {}).get("worker") == worker_id]
            receipts = [dataclasses.asdict(self._receipt(pos)) for pos in mine]
        if seq is not None:
            self._wait(seq)
        return receipts

    # --- consumers ----------------------------------------------------------------------
    # A consumer (the designated one, ``self.consumer_id`` = "training", is the one whose
    # progress releases accepted results) has one owner at a time: ``open_consumer``
    # hands it a token that every save, plan and ready call must present.  Tokens belong
    # to this coordinator process and are not journaled (a recovered coordinator has no
    # open consumer); the saved progress is.
    def open_consumer(self, consumer_id: str, *, exclusive_owner: str,
                      takeover: bool = False) -> str:
        """Become the consumer's one owner: returns its token.  ``UnsafeRecovery`` while
        another owner has it open (close it first, or recover the queue if that owner is
        gone).  ``exclusive_owner`` says, in prose, why this caller is the only one.

        ``takeover=True`` (ours, like ``Coordinator(takeover=True)``): the caller's
        successor role, e.g. a trainer restarted after its predecessor died (in another
        process than this coordinator's, so no recovery revoked its token), replaces the
        current owner.  That owner's token is fenced: its every later save, plan, ready
        or close is ``StaleAttempt``, so a predecessor that is in fact still alive cannot
        interleave its writes with the successor's."""
        self._check_process()
        _check_id("consumer_id", consumer_id)
        _check_id("exclusive_owner", exclusive_owner)
        if not isinstance(takeover, bool):
            raise TypeError(f"takeover must be a bool, got {type(takeover).__name__}")
        with self._mutex:
            self._check_usable()
            held = self._consumer_owners.get(consumer_id)
            if held is not None and not takeover:
                raise UnsafeRecovery(
                    f"consumer {consumer_id!r} of queue {self.owner} is open (owner "
                    f"{held[1]!r}); a consumer has one owner at a time: close it with "
                    "close_consumer(consumer_id, token), open it with takeover=True if that "
                    "owner is gone (its token is fenced), or recover the queue")
            token = os.urandom(32).hex()
            self._consumer_owners[consumer_id] = (token, exclusive_owner)
        return token

    def close_consumer(self, consumer_id: str, token: str) -> None:
        """Give the consumer up (its saved state stays).  ``StaleAttempt`` if ``token`` is
        not its current token."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            self._check_token(consumer_id, token)
            del self._consumer_owners[consumer_id]

    def _check_token(self, consumer_id: str, token: object) -> None:
        """Mutex held: ``token`` is the consumer's current token."""
        _check_id("consumer_id", consumer_id)
        if not isinstance(token, str):
            raise TypeError(f"token must be the str open_consumer returned, got "
                            f"{type(token).__name__}")
        held = self._consumer_owners.get(consumer_id)
        if held is None or not hmac.compare_digest(held[0], token):
            raise StaleAttempt(
                f"consumer {consumer_id!r} token is not current (the consumer was closed, "
                "taken over by another owner, or this coordinator was recovered since it "
                "was opened): open_consumer again")

    def save_consumer_state(self, consumer_id: str, *, token: str, request_id: str,
                            state_ref: RecordSetRef, fetch_cursor: int,
                            processed_cursor: int,
                            progress_ref: RecordSetRef | None = None) -> dict[str, Any]:
        """Durably record how far the consumer fetched and processed, its state, and
        (optionally) its progress record: one ``json.v1`` record ``{"version": 1,
        "processed_positions": [...], "finished_batches": [...]}`` of positions processed
        past ``processed_cursor`` and batches all ranks finished reading.  For the
        designated consumer the processed positions release their results, and finished
        batches their plan and ready data, at the next ``collect_garbage``.

        A save may rewind (a lower cursor, fewer positions or batches, as when restoring a
        checkpoint): history that was released must still be retained by someone else (a
        checkpoint's dependencies, an application owner); it is checked (every byte) and
        retained by the queue again before the save is journaled, else the save fails
        (``InvalidReference``/``CorruptData``) and changes nothing.  A retry with the same
        ``request_id`` and content returns the original reply; other content raises
        ``IdempotencyConflict``."""
        self._check_process()
        _check_id("request_id", request_id)
        save = self._prepare_save(consumer_id, state_ref, fetch_cursor, processed_cursor,
                                  progress_ref)
        save.txn["req"] = request_id
        key = (consumer_id, request_id)

        def replay() -> dict[str, Any] | None:
            known = self.state.consumer_requests.get(key)
            if known is None:
                return None
            if known[0] != save.digest:
                raise IdempotencyConflict(
                    f"consumer {consumer_id!r} request_id {request_id!r} was used for another "
                    "state; use a new request_id for new content")
            return self._consumer_view(*known[1])

        done = self._commit_save(consumer_id, token, save, replay, lambda: save.txn)
        if done is not None:
            return done
        c = self.state.consumers[consumer_id]
        return self._consumer_view(c.fetch, c.processed, c.state, c.progress)

    def load_consumer_state(self, consumer_id: str) -> dict[str, Any] | None:
        """The consumer's last saved state (None if it never saved one)."""
        self._check_process()
        _check_id("consumer_id", consumer_id)
        with self._mutex:
            c = self.state.consumers.get(consumer_id)
            if c is None:
                return None
            return self._consumer_view(c.fetch, c.processed, c.state, c.progress)

    def _consumer_view(self, fetch: int, processed: int, state: RefTuple | None,
                       progress: RefTuple | None) -> dict[str, Any]:
        out: dict[str, Any] = {"version": 1, "fetch_cursor": fetch,
                               "processed_cursor": processed,
                               "state_ref": _ref_dict(self._to_ref(state))}
        if progress is not None:
            out["progress_ref"] = _ref_dict(self._to_ref(progress))
        return out

    def _prepare_save(self, consumer_id: str, state_ref: object, fetch: object,
                      processed: object, progress_ref: object) -> _Save:
        """Everything of a consumer save that needs no queue state: argument checks and
        the progress record (read through the store: checked, parsed as JSON)."""
        _check_id("consumer_id", consumer_id)
        if state_ref is None:
            raise InvalidReference("state_ref is required: publish the consumer's state and "
                                   "pass its RecordSetRef")
        state = self._check_ref(state_ref, "state_ref")
        progress = None if progress_ref is None else self._check_ref(progress_ref,
                                                                      "progress_ref")
        check_count("fetch_cursor", fetch)
        check_count("processed_cursor", processed)
        if processed > fetch:  # type: ignore[operator]
            raise ValueError(f"processed_cursor {processed} cannot pass fetch_cursor {fetch}")
        sparse, finished = ((), ()) if progress is None else self._read_progress(progress)
        refs = [state] + ([progress] if progress is not None else [])
        txn = {"t": "cons_save", "consumer": consumer_id, "req": None, "fetch": fetch,
               "processed": processed, "state": list(_ref_tuple(state)),
               "progress": list(_ref_tuple(progress)) if progress else None,
               "sparse": list(sparse), "finished": list(finished)}
        digest = _digest([consumer_id, txn["state"], txn["progress"], fetch, processed])
        txn["digest"] = digest
        return _Save(txn, refs, digest)

    def _read_progress(self, ref: RecordSetRef) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """A progress record's positions and batches: one ``json.v1`` record, version 1,
        unique entries (its content is JSON, never unpickled)."""
        where = f"progress_ref (consumer progress record {ref.path} offset {ref.offset})"
        records = list(self.store.read(ref))
        if len(records) != 1 or records[0].codec != "json.v1":
            raise InvalidReference(f"{where} must hold exactly one json.v1 record "
                                   "{version: 1, processed_positions, finished_batches}")
        try:
            value = json.loads(bytes(records[0].payload))
        except ValueError as e:
            raise InvalidReference(f"{where} is not valid JSON: {e}") from None
        if not isinstance(value, dict) or value.get("version") != 1:
            raise InvalidReference(f"{where} must be a JSON object with version 1")
        positions = value.get("processed_positions", [])
        batches = value.get("finished_batches", [])
        if not isinstance(positions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 2**63
                for p in positions):
            raise InvalidReference(f"{where}: processed_positions must be a list of commit "
                                   "positions")
        if not isinstance(batches, list) or not all(
                isinstance(b, str) and b for b in batches):
            raise InvalidReference(f"{where}: finished_batches must be a list of batch ids")
        if len(set(positions)) != len(positions) or len(set(batches)) != len(batches):
            raise InvalidReference(f"{where} lists a position or a batch twice")
        return tuple(sorted(positions)), tuple(batches)

    def _check_save(self, consumer_id: str, txn: dict[str, Any]) -> None:
        """Mutex held: the save fits the queue (cursors, positions, batches)."""
        fetch, processed = txn["fetch"], txn["processed"]
        if fetch > self._durable_commits:
            raise ValueError(f"fetch_cursor {fetch} is past the commit log "
                             f"({self._durable_commits} durable commits)")
        for p in txn["sparse"]:
            if not processed <= p < fetch:
                raise InvalidReference(
                    f"progress of consumer {consumer_id!r} lists position {p}, outside the "
                    f"fetched, unprocessed range [{processed}, {fetch})")
        for b in txn["finished"]:
            batch = self.state.batches.get(b)
            if batch is None or batch.consumer != consumer_id or batch.ref is None:
                raise InvalidReference(
                    f"progress of consumer {consumer_id!r} lists batch {b!r}, which is not a "
                    "ready batch of that consumer (batch_ready it first)")

    def _acknowledged(self, processed: int, sparse: Iterable[int],
                      floor: int | None) -> _Released:
        """What the designated consumer's ``processed`` cursor and ``sparse`` positions
        acknowledge, given the lowest checkpoint cursor ``floor``."""
        cursor = processed if floor is None else min(processed, floor)
        return cursor, frozenset(p for p in sparse if p >= cursor and
                                 (floor is None or p < floor))

    def _current_acknowledged(self) -> _Released:
        return (self.state.retirement_cursor(self.consumer_id),
                self.state.retired_sparse(self.consumer_id))

    def _history_needed(self, new: _Released) -> list[RefTuple]:
        """Mutex held: results acknowledged now that ``new`` needs again (a rewind)."""
        old = self._current_acknowledged()
        again = [p for p in range(new[0], old[0]) if p not in new[1]]
        again += [p for p in old[1] if p >= new[0] and p not in new[1]]
        return [self.state.commits[p].result for p in sorted(again)]

    def _unrooted(self, refs: Iterable[RefTuple]) -> list[RecordSetRef]:
        """Mutex held: those of ``refs`` the queue does not root now (a collection may
        have dropped them since they were acknowledged)."""
        out = [self._to_ref(t) for t in dict.fromkeys(refs) if (t[0], t[1]) not in self._rooted]
        return [r for r in out if r is not None]

    def _rewound(self, consumer_id: str, txn: dict[str, Any]) -> list[RecordSetRef]:
        """Mutex held: what a save makes needed again that the queue may no longer root
        (a rewind): acknowledged results it no longer acknowledges, and the plan and
        ready data of batches it no longer lists as finished."""
        out: list[RefTuple] = []
        if consumer_id == self.consumer_id:
            out += self._history_needed(self._acknowledged(
                txn["processed"], txn["sparse"], self.state.checkpoint_floor()))
        c = self.state.consumers.get(consumer_id)
        kept = {b for ck in self.state.checkpoints.values() for b in ck.batches}
        for b in set(c.finished if c else ()) - set(txn["finished"]) - kept:
            batch = self.state.batches[b]
            out += [r for r in (batch.plan, batch.ref) if r is not None]
        return self._unrooted(out)

    def _verify_history(self, refs: Sequence[RecordSetRef]) -> None:
        """Every byte of ``refs`` and of their dependencies is intact (checked reads:
        ``CorruptData``/``InvalidReference`` otherwise), before a rewind retains them."""
        seen: set[Extent] = set()
        todo = list(refs)
        while todo:
            ref = todo.pop()
            if (ref.path, ref.offset) in seen:
                continue
            seen.add((ref.path, ref.offset))
            self.store.validate(ref)
            todo.extend(self.store.checked_manifest(ref).dependencies)

    def _retain_then_journal(self, refs: Sequence[RecordSetRef],
                             step: Callable[[bool], tuple[str, Any]]) -> Any:
        """The path of calls that may need released history again (consumer saves,
        checkpoints with a cursor) and of batch plans.  ``step(final)``, mutex held,
        checks the call against the queue and answers ``("done", reply)`` for a retry
        answered from the state, ``("need", refs)`` with the history it needs that the
        queue does not root, or — when ``final`` and nothing is missing — journals and
        answers ``("seq", seq)``.  Missing history is checked (every byte) and retained
        with ``refs`` before the final step; if a collection released more meanwhile,
        that is retained too.  Returns the reply of a retry, else None once durable."""
        adopted: list[Extent] = []  # one entry per _adopt registration (_done_adopting)
        segs: _Adopted = {}
        pending = list(refs)
        final = False
        try:
            while True:
                with self._mutex:
                    self._check_usable()
                    kind, value = step(final)
                if kind != "need":
                    break
                self._verify_history(value)  # outside the mutex: it reads every byte
                got = self._adopt([*pending, *value])
                adopted += got
                segs.update(got)
                pending, final = [], True
        finally:
            self._done_adopting(adopted)
        if kind == "done":
            return value
        self._wait(value, segs)
        return None

    def _commit_save(self, consumer_id: str, token: str, save: _Save,
                     replay: Callable[[], Any], make_txn: Callable[[], dict[str, Any]],
                     extra: Sequence[RecordSetRef] = ()) -> Any:
        """Every consumer save (``save_consumer_state``, ``batch_ready``): token, retry,
        checks, a rewind's history, then the journal."""

        def step(final: bool) -> tuple[str, Any]:
            self._check_token(consumer_id, token)
            done = replay()
            if done is not None:
                return "done", done
            self._check_save(consumer_id, save.txn)
            again = self._rewound(consumer_id, save.txn)
            if again or not final:
                return "need", again
            seq = self._enqueue(make_txn())
            if consumer_id == self.consumer_id:
                self._released = _common_release(self._released, self._acknowledged(
                    save.txn["processed"], save.txn["sparse"], self.state.checkpoint_floor()))
            return "seq", seq

        return self._retain_then_journal([*save.refs, *extra], step)

    # --- batches ------------------------------------------------------------------------
    def plan_batch(self, consumer_id: str, *, token: str, batch_id: str,
                   input_positions: Sequence[int], plan_ref: RecordSetRef) -> dict[str, Any]:
        """Record, before any conversion hook runs, which accepted results batch
        ``batch_id`` reads and its plan (kept until the batch is finished).  Planning the
        same batch again with the same content returns it; other content raises
        ``IdempotencyConflict``."""
        self._check_process()
        _check_id("consumer_id", consumer_id)
        _check_id("batch_id", batch_id)
        if isinstance(input_positions, (str, bytes)) or not isinstance(input_positions,
                                                                       Sequence):
            raise TypeError("input_positions must be a list of commit positions")
        pos = [check_count(f"input_positions[{i}]", p) for i, p in enumerate(input_positions)]
        ref = self._check_ref(plan_ref, "plan_ref")
        digest = _digest([consumer_id, pos, list(_ref_tuple(ref))])

        def step(final: bool) -> tuple[str, Any]:
            self._check_token(consumer_id, token)
            b = self.state.batches.get(batch_id)
            if b is not None:
                if b.digest != digest:
                    raise IdempotencyConflict(
                        f"batch {batch_id!r} was planned with other positions, plan or "
                        "consumer; use a new batch_id")
                return "done", True
            for p in pos:
                if p >= self._durable_commits:
                    raise InvalidReference(
                        f"batch {batch_id!r} input position {p} is not an accepted commit "
                        f"({self._durable_commits} durable commits)")
            unfinished = sum(1 for k in self.state.batches if not self.state.batch_finished(k))
            if unfinished >= self._bounds.max_ready_batches:
                raise ResourceLimitExceeded(
                    f"{unfinished} unfinished batches; the limit is "
                    f"{self.limits.max_ready_batches} (Limits.max_ready_batches)")
            if not final:
                return "need", []
            return "seq", self._enqueue({"t": "batch_plan", "batch": batch_id,
                                         "consumer": consumer_id, "positions": pos,
                                         "plan": list(_ref_tuple(ref)), "digest": digest})

        if self._retain_then_journal([ref], step) is not None:
            self._wait(self._last_seq)  # the original may still be in flight
        view = self.get_batch(batch_id)
        assert view is not None
        return view

    def batch_ready(self, consumer_id: str, *, token: str, batch_id: str,
                    ready_ref: RecordSetRef, state_ref: RecordSetRef, fetch_cursor: int,
                    processed_cursor: int,
                    progress_ref: RecordSetRef | None = None) -> dict[str, Any]:
        """Batch ``batch_id`` is published (``ready_ref``), and the consumer's state with it,
        in one transaction (its ready data is kept until the consumer's progress lists
        the batch finished).  A retry with the same content returns the original reply;
        another ready reference or state raises ``IdempotencyConflict``."""
        self._check_process()
        _check_id("batch_id", batch_id)
        ready = self._check_ref(ready_ref, "ready_ref")
        save = self._prepare_save(consumer_id, state_ref, fetch_cursor, processed_cursor,
                                  progress_ref)
        digest = _digest([list(_ref_tuple(ready)), save.digest])

        def replay() -> dict[str, Any] | None:
            b = self.state.batches.get(batch_id)
            if b is None or b.consumer != consumer_id:
                raise InvalidReference(
                    f"batch {batch_id!r} is not a planned batch of consumer {consumer_id!r}; "
                    "plan_batch it first")
            if b.ref is None:
                return None
            if b.ready_digest != digest:
                raise IdempotencyConflict(
                    f"batch {batch_id!r} was already made ready with another ready reference "
                    "or consumer state")
            return self._ready_view(batch_id)

        def txn() -> dict[str, Any]:
            return {"t": "batch_ready", "batch": batch_id, "ref": list(_ref_tuple(ready)),
                    "digest": digest, "save": save.txn}

        done = self._commit_save(consumer_id, token, save, replay, txn, extra=[ready])
        return done if done is not None else self._ready_view(batch_id)

    def _ready_view(self, batch_id: str) -> dict[str, Any]:
        b = self.state.batches[batch_id]
        assert b.ready_state is not None
        return {"batch_id": batch_id, "ready_ref": _ref_dict(self._to_ref(b.ref)),
                "state": self._consumer_view(*b.ready_state)}

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        """The batch as planned (and its ready reference once ready); None if unknown.
        ``finished`` (ours) says whether its consumer's progress lists it."""
        self._check_process()
        _check_id("batch_id", batch_id)
        with self._mutex:
            b = self.state.batches.get(batch_id)
            if b is None:
                return None
            out: dict[str, Any] = {"batch_id": batch_id, "consumer_id": b.consumer,
                                   "input_positions": list(b.positions),
                                   "plan_ref": _ref_dict(self._to_ref(b.plan)),
                                   "ready": b.ref is not None,
                                   "finished": self.state.batch_finished(batch_id)}
            if b.ref is not None:
                out["ready_ref"] = _ref_dict(self._to_ref(b.ref))
            return out

    # --- checkpoints ----------------------------------------------------------------------
    def register_checkpoint(self, checkpoint_id: str, checkpoint_ref: RecordSetRef, *,
                            cursor: int | None = None) -> dict[str, Any]:
        """Keep a checkpoint until ``release_checkpoint``: its root ``checkpoint_ref`` (one
        ``json.v1`` record ``{version: 1, checkpoint_id, consumer_state: RecordSetRef,
        batch_ids: [...], training_dependencies: [RecordSetRef, ...]}`` whose publication
        lists ``consumer_state`` and every training dependency as dependencies), the plan
        and ready data of the ready batches it names, and (ours) with ``cursor`` every
        result from that commit position on, so a consumer may rewind there.  Registering
        the same id with the same content returns it; other content raises
        ``IdempotencyConflict``."""
        self._check_process()
        _check_id("checkpoint_id", checkpoint_id)
        ref = self._check_ref(checkpoint_ref, "checkpoint_ref")
        if cursor is not None:
            check_count("cursor", cursor)
        record = self._read_checkpoint(checkpoint_id, ref)
        digest = _digest([list(_ref_tuple(ref)), cursor])

        def step(final: bool) -> tuple[str, Any]:
            known = self.state.checkpoints.get(checkpoint_id)
            if known is not None:
                if known.digest != digest:
                    raise IdempotencyConflict(
                        f"checkpoint {checkpoint_id!r} is registered with another reference "
                        "or cursor; release it first, or use a new id")
                return "done", True
            for b in record["batch_ids"]:
                batch = self.state.batches.get(b)
                if batch is None or batch.ref is None:
                    raise InvalidReference(
                        f"checkpoint {checkpoint_id!r} names batch {b!r}, which is not a "
                        "ready batch of this queue")
            again: list[RecordSetRef] = []
            if cursor is not None:
                if cursor > self._durable_commits:
                    raise ValueError(f"cursor {cursor} is past the commit log "
                                     f"({self._durable_commits} durable commits)")
                # keeping results from cursor on: acknowledged ones are needed again
                c = self.state.consumers.get(self.consumer_id)
                floor = self.state.checkpoint_floor()
                floor = cursor if floor is None else min(floor, cursor)
                again = self._unrooted(self._history_needed(self._acknowledged(
                    c.processed if c else 0, c.sparse if c else (), floor)))
            if again or not final:
                return "need", again
            return "seq", self._enqueue({"t": "ckpt", "id": checkpoint_id,
                                         "ref": list(_ref_tuple(ref)), "cursor": cursor,
                                         "batches": list(record["batch_ids"]),
                                         "digest": digest, "record": record})

        if self._retain_then_journal([ref], step) is not None:
            self._wait(self._last_seq)  # the original may still be in flight
        return self._checkpoint_view(checkpoint_id)

    def _read_checkpoint(self, checkpoint_id: str, ref: RecordSetRef) -> dict[str, Any]:
        """The checked JSON of a checkpoint record (see ``register_checkpoint``)."""
        where = f"checkpoint_ref of checkpoint {checkpoint_id!r} ({ref.path} offset {ref.offset})"
        records = list(self.store.read(ref))
        if len(records) != 1 or records[0].codec != "json.v1":
            raise InvalidReference(f"{where} must hold exactly one json.v1 checkpoint record")
        try:
            value = json.loads(bytes(records[0].payload))
        except ValueError as e:
            raise InvalidReference(f"{where} is not valid JSON: {e}") from None
        if not isinstance(value, dict) or value.get("version") != 1 \
                or value.get("checkpoint_id") != checkpoint_id:
            raise InvalidReference(f"{where} must be a JSON object with version 1 and "
                                   f"checkpoint_id {checkpoint_id!r}")
        batches = value.get("batch_ids")
        deps = value.get("training_dependencies")
        if not isinstance(batches, list) or not all(isinstance(b, str) for b in batches) \
                or len(set(batches)) != len(batches):
            raise InvalidReference(f"{where}: batch_ids must be a list of distinct batch ids")
        if not isinstance(deps, list):
            raise InvalidReference(f"{where}: training_dependencies must be a list of "
                                   "RecordSetRefs")
        listed = [_canonical(_ref_dict(d)) for d in self.store.checked_manifest(ref).dependencies]
        for name, named in [("consumer_state", value.get("consumer_state"))] + [
                (f"training_dependencies[{i}]", d) for i, d in enumerate(deps)]:
            if not isinstance(named, dict) or _canonical(named) not in listed:
                raise InvalidReference(
                    f"{where}: {name} must be a RecordSetRef the checkpoint's publication "
                    "lists as a dependency (publish it with dependencies=[...])")
        return value

    def _checkpoint_view(self, checkpoint_id: str) -> dict[str, Any]:
        with self._mutex:
            ck = self.state.checkpoints[checkpoint_id]
            out = dict(ck.record) if isinstance(ck.record, dict) else {}
            out["checkpoint_ref"] = _ref_dict(self._to_ref(ck.ref))
            if ck.cursor is not None:
                out["cursor"] = ck.cursor
            return out

    def release_checkpoint(self, checkpoint_id: str) -> None:
        """Stop keeping the checkpoint (a no-op if it is not registered); its data goes
        at a later ``collect_garbage`` unless something else keeps it."""
        self._check_process()
        _check_id("checkpoint_id", checkpoint_id)
        with self._mutex:
            self._check_usable()
            if checkpoint_id not in self.state.checkpoints:
                return
            seq = self._enqueue({"t": "ckpt_release", "id": checkpoint_id})
        self._wait(seq)

    # --- garbage, inspection, metrics, close ------------------------------------------------
    def _live_extents(self) -> set[Extent]:
        return {(r[0], r[1]) for r in self.state.live_refs(self.consumer_id)}

    def collect_garbage(self) -> dict[str, Any]:
        """Retire the roots of acknowledged history (results the designated consumer
        processed and no checkpoint keeps, finished batches, inputs of finished tasks
        without readers), drop the staging of adopted data, then collect the pool.
        Returns straw-queue's counts (``reclaimed_files``, ``reclaimed_bytes``,
        ``tombstones``, ``owners``, ``retained_packs``, ``open_packs``) and ours (the
        ``tombstoned`` paths, ``finished_interrupted``, ``sealed_for_dead_writers``,
        ``damaged``)."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            if self._recovered_results is not None:  # see _open
                cursor, stop, sparse = self._recovered_results
                named = self.state.live_results(self.consumer_id, stop, (cursor, sparse))
                run = self.store.run_id
                self._unstage.update((e, (ref_from_tuple(run, r).segment, None)) for r in named
                                     if (e := (r[0], r[1])) in self._rooted)
                self._recovered_results = None
            unstage = dict(self._unstage)
        # SPEC release_publications: the adopted data's staged dependencies go with its
        # staging (straw-queue's rule: a result's tensors need no release of their own);
        # they stay live through the adopted data while the queue still roots it.  Read
        # outside the mutex (manifests; the walk only ever finds more to unstage)
        deps = self.store.staged_dependencies(
            [seg for seg, _ in unstage.values()],
            {e: needs for e, (_, needs) in unstage.items() if needs is not None})
        with self._mutex:
            self._check_usable()
            live = self._live_extents() | set(self._adding)
            # the mutex is held across the catalog update so no adoption interleaves
            if not self.store.catalog.adopt(self.owner, self._epoch, replace=live,
                                            unstage=set(unstage) | deps):
                self._fail(Fenced(f"queue {self.owner}: a newer coordinator owns it"))
            self._rooted = RootSet(live)
            for e in unstage:
                self._unstage.pop(e, None)
            self._released = (self.state.retirement_cursor(self.consumer_id),
                              self.state.retired_sparse(self.consumer_id))
        result = self.store.collect_garbage()
        with self.store.catalog.locked() as st:
            prefix = run_prefix(self.store.run_id)
            open_packs = sum(1 for p, info in st.packs.items()
                             if p.startswith(prefix) and info.state == "open")
        out = {k: (v if isinstance(v, int) else len(v)) for k, v in result.items()
               if k in ("reclaimed_files", "reclaimed_bytes", "owners", "retained_packs")}
        out["tombstones"] = len(result.get("tombstoned", ()))
        out["open_packs"] = open_packs
        for k in ("tombstoned", "finished_interrupted", "sealed_for_dead_writers", "damaged"):
            if k in result:
                out[k] = result[k]
        return out

    def snapshot(self) -> RecordSetRef:
        """Publish an inspection artifact of the queue (one ``json.v1`` record: consumers,
        batches, checkpoints, producers, task counts, commit count, epoch) and return
        its reference; it is staged like any publication (release it with
        ``store.release_publications`` when done).  Not a startup head: the queue always
        recovers from its journal — but ours also writes a journal snapshot now, so
        recovery reads it plus a short suffix."""
        self._check_process()
        self._write_snapshot()
        with self._mutex:
            self._check_usable()
            body = {"version": 1, "queue": self.owner, "epoch": self._epoch,
                    "commits": self._durable_commits, "sealed": self.state.sealed,
                    "tasks": dict(self.state.tasks.status_counts()),
                    "consumers": self._consumers_view(), "batches": self._batches_view(),
                    "checkpoints": self._checkpoints_view(),
                    "producers": dict(self.state.producers)}
            name = f"queue-snapshot:{self.owner}:e{self._epoch}:{self._last_seq}"
        payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return self.store.publish([Record("queue-snapshot", payload, codec="json.v1")],
                                  submission_id=name)

    def _consumers_view(self) -> dict[str, Any]:
        return {k: self._consumer_view(c.fetch, c.processed, c.state, c.progress)
                for k, c in self.state.consumers.items()}

    def _batches_view(self) -> dict[str, Any]:
        return {k: self.get_batch(k) for k in self.state.batches}

    def _checkpoints_view(self) -> dict[str, Any]:
        return {k: self._checkpoint_view(k) for k in self.state.checkpoints}

    def drain(self) -> int:
        """Stop handing out and accepting tasks, in this coordinator (not journaled):
        ``acquire`` answers ``draining``, ``submit_tasks`` refuses.  Leased tasks may still
        complete.  Returns how many tasks are leased."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            self._draining = True
            return self.state.leased_count

    # read-only views of the queue's state, in straw-queue's shapes (each a fresh copy)
    @property
    def tasks(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            ids = list(self.state.tasks)
        return {tid: _plain(self.task_status(tid)) for tid in ids}

    @property
    def commits(self) -> list[Any]:
        self._check_process()
        with self._mutex:
            n = self._durable_commits
        return [_plain(self._receipt(p)) for p in range(n)]

    @property
    def submissions(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            subs = [(s, p) for s, p in self.state.submissions.items()
                    if p < self._durable_commits]
        return {s: {"receipt": _plain(self._receipt(p))} for s, p in subs}

    @property
    def requests(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            out: dict[str, Any] = {_canonical(["submit", k]): [d, list(ids)]
                                   for k, (d, ids) in self.state.requests.items()}
            for (c, r), (d, v) in self.state.consumer_requests.items():
                out[_canonical([f"consumer:{c}", r])] = [d, self._consumer_view(*v)]
            return out

    @property
    def consumers(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            return self._consumers_view()

    @property
    def batches(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            return self._batches_view()

    @property
    def checkpoints(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            return self._checkpoints_view()

    @property
    def producers(self) -> dict[str, Any]:
        self._check_process()
        with self._mutex:
            return json.loads(json.dumps(self.state.producers))  # type: ignore[no-any-return]

    @property
    def sealed(self) -> bool:
        self._check_process()
        return self.state.sealed

    @property
    def epoch(self) -> str:
        """This coordinator's epoch, as its leases state it (``lease.coordinator_epoch``
        equals it, as in straw-queue, where it is a str too).  Epochs count up from 1 with
        each recovery of the queue (D8/D9): ``epoch_number`` is the same as an int."""
        self._check_process()
        return str(self._epoch)

    @property
    def epoch_number(self) -> int:
        """``epoch`` as an int (newer coordinators of the queue have larger ones)."""
        self._check_process()
        return self._epoch

    @property
    def draining(self) -> bool:
        self._check_process()
        return self._draining

    @property
    def storage_failed(self) -> bool:
        """True once a storage failure stopped this coordinator (recover a new one)."""
        self._check_process()
        return self._broken is not None

    @property
    def counters(self) -> dict[str, int]:
        self._check_process()
        return {"snapshot_failures": self.snapshot_failures} if self.snapshot_failures else {}

    def metrics(self) -> dict[str, Any]:
        """straw-queue's keys (``tasks`` by status, ``usage_with_reservations``,
        ``complete_seconds``, ``journal_bytes``, ``recovery_seconds``, process CPU and
        RSS) and ours (counts, the journal's and recovery's own metrics)."""
        self._check_process()
        with self._mutex:
            st = self.state
            counts = st.tasks.status_counts()  # never loads recovered history
            journal = self.journal.metrics()
            out: dict[str, Any] = {
                "queue": self.owner, "epoch": self._epoch,
                "pending": st.pending_count, "leased": st.leased_count,
                "completed": counts.get(COMPLETED, 0), "failed": counts.get("failed", 0),
                "cancelled": counts.get("cancelled", 0), "commits": len(st.commits),
                "durable_commits": self._durable_commits, "outstanding_reads": len(st.reads),
                "sealed": st.sealed, "journal": journal, "recovery": self.recovery_stats,
                "tasks": {k: v for k, v in sorted(counts.items()) if v},
                "counters": self.counters, "journal_bytes": journal["bytes"],
                "recovery_seconds": self.recovery_seconds,
                "complete_seconds": list(self._complete_seconds),
                "usage_with_reservations": self._usage(),
            }
        out["process_cpu_seconds"] = time.process_time() - self._cpu_started
        out["process_rss_high_water_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return out

    def _usage(self) -> dict[str, Any]:
        """Mutex held: what the queue holds for its designated consumer (accepted and not
        yet released results; ready data of unfinished batches) and in flight."""
        st = self.state
        c = st.consumers.get(self.consumer_id)
        start, acked = (c.processed, set(c.sparse)) if c else (0, set())
        accepted = st.commits.usage(start, acked)  # history: per-block sums
        # a ready batch that a registered checkpoint names is the checkpoint's to keep, no
        # longer ready data waiting for training (straw-queue counts it so too)
        saved = {b for ck in st.checkpoints.values() for b in ck.batches}
        ready = _usage_of(self._to_ref(b.ref) for k, b in st.batches.items()
                          if b.ref is not None and not st.batch_finished(k) and k not in saved)
        control = sum(1 for t in st.tasks.loaded() if t.status == LEASED and t.control)
        # a leased task reserves what its spec estimates it will produce (straw-queue's
        # "with reservations"; control tasks estimate nothing); leased tasks are loaded
        reserved = [0, 0, 0]
        for t in self._deadlines:
            task = st.tasks[t]
            if task.status == LEASED:
                for i, n in enumerate(task.estimates):
                    reserved[i] += n
        totals = {"bytes": accepted["bytes"] + ready["bytes"] + reserved[1],
                  "records": accepted["records"] + ready["records"] + reserved[0],
                  "tokens": accepted["tokens"] + ready["tokens"] + reserved[2]}
        # each amount is unsigned 64-bit (straw-queue's accounting), so their sum can
        # pass 2**64-1: reported as an overflow, never wrapped; only this report
        # fails, the queue's durable state and every other call are untouched
        for part, sums in (("accepted_unprocessed", accepted), ("train_ready", ready),
                           ("", totals)):
            for k, v in sums.items():
                check_usage_total(f"usage_with_reservations.{part + '.' if part else ''}{k}",
                                  v)
        return {"accepted_unprocessed": accepted, "train_ready": ready, **totals,
                "ready_bytes": ready["bytes"], "inflight": st.leased_count - control,
                "control_inflight": control}

    def close(self) -> None:
        """Stop serving (leases stay until a recovery revokes them).  Idempotent.  In a
        forked child it raises ``ForkedProcess`` and touches nothing (the epoch lock and
        the journal are the parent's; ``__exit__`` there does not raise)."""
        if self._closed:
            return
        if self._in_forked_child():
            self.journal.close()  # child-safe: closes only its copy
            self._refuse_close_in_child()
        self._closed = True
        try:
            self.journal.close()
        finally:
            self._release_lock()

    def __enter__(self) -> Coordinator:
        self._check_process()
        return self


def replay(recovered: journal_mod.Recovered, fs: Filesystem | None = None,
           history_dir: str | None = None) -> QueueState:
    """The queue state of a recovered journal: its snapshot plus the suffix (D9); the
    history segments its snapshot names are in ``history_dir`` (checked present, read
    on demand)."""
    # snapshot and suffix: many long-lived objects at once (promoted if many)
    large = recovered.snapshot is not None and len(recovered.snapshot) >= 1 << 20

    def history(manifest: dict[str, Any]) -> History:
        if fs is None or history_dir is None:
            raise ValueError("this queue snapshot names history segments: pass the "
                             "filesystem and the queue's history directory to replay")
        return History.from_manifest(fs, history_dir, manifest)

    with bulk_objects(promote=large):
        if recovered.snapshot is not None:
            state = QueueState.from_snapshot(_unpack_snapshot(recovered.snapshot), history)
        else:
            state = QueueState()
        for txn in recovered.transactions:
            state.apply(msgpack.unpackb(txn, raw=False))
    return state


def read_state(fs: Filesystem, queue_dir: str) -> QueueState:
    """A queue's state read without becoming its coordinator: no epoch, no lock, nothing
    written (``journal.recover`` only fsyncs the newest segment).  For operator views
    (``straw inspect``); leases in it are whatever the journal last recorded."""
    return replay(journal_mod.recover(fs, os.path.join(queue_dir, "journal")), fs,
                  os.path.join(queue_dir, "history"))


def _unpack_snapshot(data: bytes | memoryview) -> dict[str, Any]:
    with bulk_objects():  # see QueueState.from_snapshot
        return msgpack.unpackb(data, raw=False)  # type: ignore[no-any-return]


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value or len(value) > 1024:
        raise ValueError(f"{name} must be a non-empty str of at most 1024 characters")


def _check_int64(name: str, value: object) -> None:
    """A priority or scheduling key: a signed 64-bit integer (what the journal stores)."""
    if isinstance(value, bool) or not isinstance(value, int):
        # both a TypeError (ours) and a ValueError (straw-queue's class for it)
        raise NotAnInteger(f"{name} must be a signed 64-bit integer (-2**63..2**63-1), got "
                           f"{type(value).__name__} {short_repr(value)}"
                           + (" (a bool is not a number here)" if isinstance(value, bool)
                              else ""))
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{name} must be a signed 64-bit integer (-2**63..2**63-1), got "
                         f"{short_repr(value)}")


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _check_lease_fields(lease: object, where: str) -> Lease:
    """A Lease whose fields have the types leases have (what a caller may have rebuilt
    from a dict; a dict of ``asdict(lease)`` is taken too): TypeError/ValueError naming the
    field otherwise."""
    if isinstance(lease, Mapping):
        lease = Lease.from_dict(lease)
    if not isinstance(lease, Lease):
        raise TypeError(f"{where} must be a Lease, got {type(lease).__name__}")
    for name in ("run_id", "queue_id", "task_id", "attempt_id", "coordinator_epoch", "token",
                 "worker_id"):
        if not isinstance(getattr(lease, name), str):
            raise TypeError(f"{where}.{name} must be a str, got "
                            f"{type(getattr(lease, name)).__name__}")
    check_count(f"{where}.generation", lease.generation)
    return lease


# what the designated consumer's acknowledgements released: (cursor, sparse positions)
_Released = tuple[int, frozenset[int]]


def _common_release(a: _Released, b: _Released) -> _Released:
    """Positions released in both ``a`` and ``b`` (after a save, history stays released
    only if the new state acknowledges it too: a rewind made the rest needed again)."""
    cursor = min(a[0], b[0])
    sparse = {p for p in a[1] if p < b[0] or p in b[1]}
    sparse |= {p for p in b[1] if p < a[0]}
    return cursor, frozenset(p for p in sparse if p >= cursor)


@dataclasses.dataclass
class _Save:
    """A consumer save, checked but not yet applied: its transaction, the references it
    makes the queue retain, and its idempotency digest."""

    txn: dict[str, Any]
    refs: list[RecordSetRef]
    digest: str


def _ref_dict(ref: RecordSetRef | None) -> dict[str, Any] | None:
    return None if ref is None else dataclasses.asdict(ref)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _plain(value: Any) -> Any:
    """A dataclass reply as a dict (straw-queue's state views are plain JSON values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _usage_of(refs: Iterable[RecordSetRef | None]) -> dict[str, int]:
    """Bytes, records and tokens of ``refs`` (payload bytes and tokens where the
    reference carries them, else the extent's size)."""
    out = {"bytes": 0, "records": 0, "tokens": 0}
    for ref in refs:
        if ref is None:
            continue
        out["bytes"] += getattr(ref, "payload_bytes", ref.size)
        out["records"] += ref.records
        out["tokens"] += getattr(ref, "tokens", 0) or 0
    return out


__all__ = ["Coordinator", "StorageUnavailable", "read_state", "replay"]
