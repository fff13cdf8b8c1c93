"""Exclusivity, epochs, recovery and fencing of a queue (D8, D9).

Layout under the pool root (``Q`` = ``runs/<run_id>/queues/<namespace>/<queue_id>``)::

    Q/epochs/e-<n>          one file per epoch, created exclusively; it reads "started"
                            once the epoch's start record is durable in the journal
    Q/epochs/e-<n>.lock     flocked by epoch n's coordinator while it lives; its text names
                            it (host, pid, since)
    Q/journal/              segments and snapshots (straw.journal)
    Q/history/              history segments named by the journal snapshot (straw.queue.history)

A queue belongs to the run of its store, like its catalog owner ``queue:<ns>/<id>`` (an
owner of that run): coordinators of runs sharing a root with the same ``queue_id`` serve
different queues, and no run can recover, lease or fence another run's queue.  A
coordinator that finds a queue of the older root-wide layout
(``queues/<namespace>/<queue_id>``) and no queue of its run refuses to start rather than
silently open an empty queue beside it.

Exclusivity and fencing (D8).  Every coordinator holds the lock of its own epoch for its
whole life.  A new coordinator looks at the *latest* epoch's lock: held means that
coordinator is alive (serving, or paused), and the newcomer fails at once naming it —
unless ``takeover=True`` says the holder is paused or partitioned and must be fenced.  (An
older, paused coordinator still holding an older epoch's lock does not count: it is fenced
already.)  ``recover=True`` opens an existing queue: it creates the next epoch file
exclusively (durably) *before* reading the journal, then replays snapshot + suffix (D9),
writes an epoch record revoking every older lease (durable before service), and replaces
the queue owner's roots in the catalog under the new epoch.  After every journal sync the
coordinator checks that no newer epoch file exists before it replies (``_fence_check``,
the journal's fence); an old coordinator that was paused and resumes therefore never
acknowledges anything (its callers get ``IndeterminateCommit``, later calls ``Fenced``),
and its catalog updates carry its old epoch, which the catalog ignores.

Damaged or missing journal data fails closed (D6).  Once the new epoch's start record is
durable, its epoch file is marked *started* (durably); recovery passes the newest started
epoch to ``journal.recover``, so a journal that lost every segment of it is
``CorruptData``, never an older state.  A corrupt journal makes ``recover=True`` raise
``CorruptData`` naming the file and offset; nothing is cut or deleted (there is no repair
path: restore the journal from a backup).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable

from ..durable import recovery as journal_recovery
from ..durable.journal import Journal
from ..errors import Fenced, UnsafeRecovery, UnsupportedSchema, storage_error
from ..pool import role_lock as holder
from ..pool.catalog.roots import RootSet
from ..pool.ref_forms import ref_from_tuple
from ..process import close_quietly
from . import rules
from .ids import queue_dir_name
from .pipeline import CommitPipeline
from .replay import replay


def queue_dir(root: str, run_id: str, namespace: str, queue_id: str) -> str:
    """The directory of a run's queue (queues belong to a run; ``queue_dir_name`` maps an
    id such as ``run:ab`` to one safe path component)."""
    return os.path.join(root, "runs", run_id, "queues", namespace, queue_dir_name(queue_id))


_EPOCH_RE = re.compile(r"^e-([0-9]{6,})\Z")
_STARTED = b"started\n"  # an epoch file's content once its epoch-start record is durable


class QueueEpochs(CommitPipeline):
    """Opening a queue under a new epoch (its lock, its epoch file, recovery) and the
    fence check that keeps a superseded coordinator from acknowledging anything."""

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

    def _start(self, recover: bool, takeover: bool) -> None:
        """Create the queue's directories and open it under a new epoch (``_open``); the
        epoch lock is released if that fails."""
        self._refuse_legacy_layout()
        try:
            self.fs.makedirs_durable(self.epochs_dir)
            self.fs.makedirs_durable(self.journal_dir)
        except OSError as e:
            raise storage_error(e, f"cannot create queue directory {self.dir}") from e
        self._lock_fd = None
        self._fence_path = None  # (epoch, the next epoch's file)
        try:
            self._open(recover, takeover)
        except BaseException:
            self._release_lock()
            raise

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
        recovered = journal_recovery.recover(self.fs, self.journal_dir,
                                        started_epoch=self._newest_started(existing))
        self.state = replay(recovered, self.fs, self.history_dir)
        self.recovery_seconds = time.perf_counter() - started
        self.recovery_stats = dict(recovered.stats)
        self.journal = Journal(
            self.fs, self.journal_dir, epoch=self._epoch, recovered=recovered,
            clock=self._wall, fence=self._fence_check, group_wait=self.group_wait,
            segment_target_bytes=self.segment_target_bytes,
        )
        self._mark_started()
        # D9: revoke older leases, durably, before serving anyone
        self._commit_now(rules.recover(self._epoch, self.recovery_spends_budget))
        self._durable_commits = len(self.state.commits)
        self._claim_roots()

    def _claim_roots(self) -> None:
        """Once our epoch started: the queue owner's roots, its staging and what
        is known released, as this coordinator starts with them."""
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
        # million), and an open must cost the live state (D9).  Their positions are
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
        self._released = (0, frozenset())

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
