"""The commit pipeline of a queue's coordinator, and the retention it rests on.

Every mutating call follows the same path: its arguments are checked (``checks.py`` and
the ``Coordinator``); the data its transaction names is adopted under the queue's owner
in the catalog (``_adopt``; D2: retain before journal; a reference must name a
publication of the pool, ``store.check_published``, so the queue never roots or journals
a fabricated one — checked after an idempotent retry was answered from the journal, D7);
then, under the coordinator's mutex, the call is decided against the state (``rules.py``),
the transaction is applied to the in-memory ``QueueState`` and enqueued in the journal
(``_enqueue``: journal order = apply order); then the caller waits, outside the mutex,
until its group is durable (``_wait``; group commit: concurrent calls share one fsync);
the journal checks after every sync that no newer epoch exists (the fence check, D8,
``QueueEpochs._fence_check``) before anyone replies.  An error before the enqueue leaves
the journal unchanged; a failure once a transaction is enqueued stops the coordinator
(``_fail``: ``IndeterminateCommit`` or ``Fenced``, later calls ``Fenced``).

Staging of adopted data is dropped only once the transaction naming it is durable (D2):
``_wait`` queues it for the next ``collect_garbage``, which also replaces the queue
owner's roots with what the state still names (acknowledged history retires there).

``CommitPipeline`` declares the coordinator's attributes (``Coordinator.__init__`` sets
them) so that every layer above it is checked against them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgpack

from ..clock import Clock
from ..durable.journal import Journal
from ..errors import (
    Closed,
    Fenced,
    IndeterminateCommit,
    InvalidReference,
    ResourceLimitExceeded,
    storage_error,
)
from ..fs import Filesystem
from ..pool.catalog.catalog import Announcement
from ..pool.catalog.roots import RootSet
from ..pool.catalog.state import Extent, run_prefix
from ..pool.records import canonical_metadata
from ..pool.ref_forms import ref_from_tuple
from ..pool.refs import RecordSetRef, SegmentRef
from ..pool.store import SharedFilesystemStore
from ..process import ProcessBound
from ..protocol import Limits
from . import rules
from .checks import check_id as _check_id
from .history import History
from .marker import QueueMarker
from .names import QueueNames
from .state import QueueState
from .tasks import RefTuple

# adopted extents: each one's segment and, when its checked manifest was at hand (a result's,
# at completion), what it needs (``ReadSession.needs``), so a collection's walk over the
# dependencies (SPEC release_publications) does not read it again
_Adopted = dict[Extent, tuple[SegmentRef, list[SegmentRef] | None]]

# what the designated consumer's acknowledgements released: (cursor, sparse positions)
_Released = tuple[int, frozenset[int]]


class CommitPipeline(ProcessBound):
    """The commit path and retention of one queue (see the module docstring)."""

    # identity and configuration
    store: SharedFilesystemStore
    fs: Filesystem
    queue_id: str
    namespace: str
    owner: str
    consumer_id: str
    lease_seconds: float
    exclusive_owner: str | None
    recovery_spends_budget: bool
    clock: Clock
    _wall: Clock
    limits: Limits
    _bounds: Limits
    _enforce_limits: bool
    snapshot_every: int
    segment_target_bytes: int
    group_wait: float
    dir: str
    epochs_dir: str
    journal_dir: str
    history_dir: str
    _marker: QueueMarker | None
    _names: QueueNames
    # the epoch, its lock, the journal and the state (QueueEpochs._open)
    _epoch: int
    _lock_fd: int | None
    _fence_path: tuple[int, str] | None
    journal: Journal
    state: QueueState
    recovery_seconds: float
    recovery_stats: dict[str, Any]
    # the pipeline's own
    _mutex: threading.RLock
    _deadlines: dict[str, float]
    _rooted: RootSet
    _adding: Counter[Extent]
    _unstage: _Adopted
    _recovered_results: tuple[int, int, frozenset[int]] | None
    _released: _Released
    _broken: BaseException | None
    _closed: bool
    _last_seq: int
    _seq_commits: dict[int, int]
    _durable_commits: int
    _since_snapshot: int
    snapshot_failures: int
    _consumer_owners: dict[str, tuple[str, str]]
    _draining: bool
    _complete_seconds: deque[float]
    _cpu_started: float

    def _init_pipeline(self) -> None:
        """The pipeline's own state, before the queue is opened."""
        self._mutex = threading.RLock()
        self._deadlines = {}
        self._rooted = RootSet()  # the queue owner's roots as this coordinator knows them
        self._adding = Counter()
        # adopted extents whose staging (and their dependencies', SPEC
        # release_publications) the next collection drops (``_Adopted``)
        self._unstage = {}
        # (retirement cursor, commits, sparse) of a recovered journal whose results'
        # staging the next collection drops (``QueueEpochs._claim_roots``)
        self._recovered_results = None
        self._broken = None
        self._closed = False
        self._last_seq = 0
        self._seq_commits = {}
        self._durable_commits = 0
        self._since_snapshot = 0
        self.snapshot_failures = 0
        # consumer id -> (token, exclusive owner): this process's open consumers
        self._consumer_owners = {}
        self._draining = False  # drain(): no more acquisitions or submissions here
        self._complete_seconds = deque(maxlen=1024)
        self._cpu_started = time.process_time()
        self.recovery_seconds = 0.0

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

    def _enqueue_applied(self, txns: Sequence[dict[str, Any]]) -> int:
        """Enqueue transactions already applied, in apply order, as one journal frame
        (call with the mutex held; ``Journal.enqueue_many``): a crash keeps all or none."""
        seq = self.journal.enqueue_many([msgpack.packb(t, use_bin_type=True) for t in txns])
        self._last_seq = seq
        self._seq_commits[seq] = len(self.state.commits)
        self._since_snapshot += len(txns)
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

    def _known(self, request_id: str, digest: str, kind: str) -> tuple[str, ...] | None:
        """The reply of an earlier request with this id (mutex held): D7, a retry is
        answered from the state; another content under the id is a conflict."""
        return rules.known(self.state, self.owner, request_id, digest, kind)

    def _commit_decision(self, decision: rules.Decision,
                         ending: Iterable[str] = ()) -> int | None:
        """Mutex held: enqueue ``decision``'s transaction, if it has one, and drop the
        deadlines of the leases it ends; its sequence number, else None."""
        if decision.txn is None:
            return None
        seq = self._enqueue(decision.txn)
        for task_id in ending:
            self._deadlines.pop(task_id, None)
        return seq

    def _reply(self, decision: rules.Decision, seq: int | None,
               adopted: _Adopted | None = None) -> Any:
        """Outside the mutex: ``decision``'s reply once what it answers is durable — its
        own transaction (``seq``; then the staging of ``adopted`` may go, D2), or for a
        retry the original, which may still be in flight (D7)."""
        if decision.replayed:
            return self._replayed(decision.reply)
        if seq is not None:
            self._wait(seq, adopted)
        return decision.reply

    def _replayed(self, result: tuple[str, ...]) -> tuple[str, ...]:
        """Answer a retry once the original is durable (it may still be in flight)."""
        self._wait(self._last_seq)
        return result

    # --- arguments that need the queue (its run, its limits) ------------------------------
    def _request_id(self, request_id: object, *, optional: bool = False) -> str | None:
        if request_id is None and optional:
            return None
        _check_id("request_id", request_id)
        return request_id  # type: ignore[return-value]

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

    def _to_ref(self, t: RefTuple | None) -> RecordSetRef | None:
        if t is None:
            return None
        return ref_from_tuple(self.store.run_id, t)

    # --- calls that may need released history again -------------------------------------
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

    # --- collection ---------------------------------------------------------------------
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
