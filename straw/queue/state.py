"""The queue's state machine: pure, deterministic, no I/O, no clock.

Every change to a queue is a *transaction* (a small dict, msgpack-encoded into the
journal).  ``QueueState.apply`` is the only way state changes — live, after the
coordinator validated a call, and at recovery, replaying the journal after the snapshot —
so live state and recovered state cannot drift apart.  The coordinator decides (checks
leases, idempotency, limits, the clock); this module only records.

Transactions (``t`` is the type)::

    submit   req, digest, tasks[[id, input, meta, prio, key, max_att, control,
             allow_empty, est_records, est_bytes, est_tokens]], producer
    lease    epoch, worker, grants[[task, attempt]]          (acquire; read roots begin)
    complete task, attempt, sub, result, digest, meta        (commit log grows by one;
                                                              meta {"worker": w})
    fail     task, attempt, error, final [, req, digest, result]   (attempt budget)
    expire   task, attempt                                   (lease deadline passed)
    yield    req, digest, updates[[task, attempt, input, prio, key, meta]] [, result]
    progress req, digest, updates[[task, attempt, input]], result   (lease kept)
    release  leases[[task, attempt]] [, req, digest, result] (back, no budget spent)
    cancel   task [, req, digest, result]
    seal     [req, digest, result]
    reads    task, attempt | None                            (D5: these and retire
    retire   worker [, revoke]                                 end reads)
    cons_save  consumer, req, digest, fetch, processed, state, progress, sparse, finished
    batch_plan batch, consumer, positions, plan, digest
    batch_ready batch, ref, digest, save (a cons_save of the batch's consumer, same txn)
    ckpt     id, ref, cursor, batches, digest   /   ckpt_release id
    (cons_open, of journals written before consumer tokens became per-coordinator, is
    replayed as a no-op)
    epoch    epoch [, spend]                                 (recovery: leases revoked)

References are stored as tuples ``(path, offset, size, checksum, digest, records)``.

Request ids (D7 for control calls).  A transaction carrying ``req`` records
``requests[req] = (digest, result)``: a retry of the same request (same digest) is answered
``result`` from the state, without a second transaction, even after a recovery; another
digest under the same id is an ``IdempotencyConflict``.  ``result`` is the reply (a tuple
of strings: task ids, or outcomes such as ``pending``/``failed``/``released``).  Fields in
brackets are absent from journals written before they existed (replay gives them their
defaults: a submit's row ends at ``control``, whose None is the default lane).

Scheduling order is priority desc, key asc, then FIFO = submission position (kept when a
task returns to pending by release, failure, expiry or recovery; a yield moves the task to
the tail, in the order of its updates).

Invariants upheld here (ids as in spec/SPEC.md): an accepted result is appended to the
commit log exactly once per task (a task leaves ``leased`` on completion); a task has at
most one lease; leases carry the epoch that granted them and an ``epoch`` record revokes
every older one; scheduling order is priority desc, key asc, FIFO; read roots (D5) end only
by ``reads``/``retire`` or the reader's own complete/fail/yield/release.

Recovery cost (D9). A long-lived queue's state is mostly history: terminal tasks, the
commit log, submission ids and request answers. Each journal snapshot moves what became
history since the previous one into an immutable history segment (``straw.queue.history``,
spec H1) and carries only the live state plus the segments' manifest, so recovery decodes
live state only; ``TaskTable`` (``tasks.py``), ``CommitLog`` and ``TieredDict``
(submissions, requests; ``commits.py``) look history up in the segments on demand (a Bloom
filter per segment answers most misses without a read). A snapshot of an older straw still
holds its terminal tasks and commits: ``from_snapshot`` decodes them into compact tuples
(in C, by msgpack) and makes a ``Task`` of a terminal task only when something reads it,
until the next snapshot moves them out. The decoded objects go straight to the garbage
collector's oldest generation (``bulk_objects``), so no young collection has to traverse
them. What callers observe is unchanged.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import CorruptData
from ..pool.ref_forms import ref_to_tuple
from ..pool.refs import record_sets_in
from .commits import CommitLog, CommitRecord, TieredDict, request_value
from .history import Delta, History
from .records import (
    Batch,
    Checkpoint,
    Consumer,
    batch_from_row,
    checkpoint_from_row,
    consumer_from_row,
)
from .tasks import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LEASED,
    PENDING,
    STATUS_COLUMN,
    TERMINAL,
    RefTuple,
    Task,
    TaskTable,
    bulk_objects,
    tuple_or_none,
)


@dataclass
class QueueState:
    epoch: int = 0
    tasks: TaskTable = field(default_factory=TaskTable)
    commits: CommitLog = field(default_factory=CommitLog)
    # completion id -> position; request id -> (digest, reply) (D7).  Older entries are
    # in history segments (TieredDict)
    submissions: TieredDict = field(default_factory=lambda: TieredDict("s"))
    requests: TieredDict = field(
        default_factory=lambda: TieredDict("r", request_value))
    producers: dict[str, Any] = field(default_factory=dict)
    # derived from ``producers`` (never stored): the references each state names, roots
    # of the queue while that state is its producer's latest
    producer_refs: dict[str, frozenset[RefTuple]] = field(default_factory=dict)
    reads: dict[tuple[str, str, int], RefTuple] = field(default_factory=dict)
    read_epochs: dict[tuple[str, str, int], int] = field(default_factory=dict)  # grant epoch
    consumers: dict[str, Consumer] = field(default_factory=dict)
    batches: dict[str, Batch] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    # save_consumer_state's request ids: (consumer, request) -> (digest, the saved values)
    consumer_requests: dict[tuple[str, str], tuple[str, tuple[Any, ...]]] = field(
        default_factory=dict)
    sealed: bool = False
    fifo: int = 0
    pending_count: int = 0
    leased_count: int = 0
    # scheduling index per lane: heap of (order, task_id); stale entries skipped lazily
    lanes: dict[bool, list[tuple[tuple[int, int, int], str]]] = field(default_factory=dict)
    # the history segments holding terminal tasks, old commits, submissions and request
    # answers (straw.queue.history); None until the first snapshot that moved history
    history: History | None = None

    # --- history (D9: recovery reads live state plus a fixed-size manifest) --------------
    def history_delta(self) -> Delta:
        """What the next history segment takes: every terminal task, commit row,
        submission and request answer held in memory (nothing changes here)."""
        tasks = self.tasks.terminal()
        status: Counter[str] = Counter(v[0][STATUS_COLUMN] for _, v in tasks)
        return Delta(tasks=tasks, subs=list(self.submissions.live.items()),
                     reqs=[(k, [d, list(r)]) for k, (d, r) in self.requests.live.items()],
                     commits=list(self.commits.rows()), lo=self.commits.base,
                     status=dict(status))

    def install_history(self, history: History, delta: Delta) -> None:
        """``history`` (durable) now holds ``delta``: read those entries from it."""
        self.history = history
        self.tasks.history = history
        self.tasks.forget(k for k, _ in delta.tasks)
        self.commits.attach(history, delta.lo + len(delta.commits))
        for d, entries in ((self.submissions, delta.subs), (self.requests, delta.reqs)):
            d.history = history
            for k, _v in entries:
                del d.live[k]

    # --- scheduling ---------------------------------------------------------------------
    def _make_pending(self, task: Task) -> None:
        # FIFO is the submission position, kept when the task comes back (release, fail,
        # expiry, recovery): among equal priority and key, older work goes first, and a
        # coordinator crash cannot reorder tasks (spec Q4).  A yield clears it first: the
        # task takes the next position (the tail), journaled with the yield
        if task.fifo == 0:
            self.fifo += 1
            task.fifo = self.fifo
        task.status = PENDING
        task.lease = None
        self.pending_count += 1
        heapq.heappush(self.lanes.setdefault(task.control, []), (task.order(), task.task_id))

    def _leave(self, task: Task) -> None:
        """Bookkeeping when a task leaves its current status."""
        if task.status == PENDING:
            self.pending_count -= 1
        elif task.status == LEASED:
            self.leased_count -= 1

    def _live_entry(self, entry: tuple[tuple[int, int, int], str]) -> bool:
        # a pending task is always loaded in the live state (never in history): a stale
        # entry of a finished task costs no history lookup
        task = self.tasks.loaded_task(entry[1])
        return task is not None and task.status == PENDING and task.order() == entry[0]

    def best_pending(self, control: bool, n: int = 1,
                     prefix: str | None = None) -> list[Task]:
        """Q4: up to ``n`` best pending tasks of a lane, in scheduling order (priority
        descending, scheduling key ascending, then FIFO), without changing
        them (choosing is not leasing: the lease transaction does that).  O(k log n) for
        the k heap entries surfaced: stale entries are dropped as they surface, live ones
        are put back.  With a prefix, entries that do not match are surfaced and put back
        too (so a prefix matching nothing near the top costs a scan of the lane)."""
        heap = self.lanes.get(control)
        if not heap:
            return []
        out: list[Task] = []
        chosen: set[str] = set()
        keep = []
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            if not self._live_entry(entry) or entry[1] in chosen:
                continue  # stale, or the duplicate entry of a requeued task
            keep.append(entry)
            if prefix is None or entry[1].startswith(prefix):
                chosen.add(entry[1])
                out.append(self.tasks[entry[1]])
        for entry in keep:
            heapq.heappush(heap, entry)
        return out

    def pending_in_order(self, limit: int | None = None) -> list[str]:
        """Pending task ids in scheduling order across lanes (inspection, pending_tasks).
        Every entry is checked here anyway, so the stale ones are dropped from their heap
        (heapified again): a task leased by id leaves its entry deep in the heap (the
        builder's collections, one per batch, in the control lane), and without this each
        call (every checkpoint save) would scan one stale entry per batch ever trained."""
        entries = []
        for heap in self.lanes.values():
            live = [e for e in heap if self._live_entry(e)]
            if len(live) < len(heap):
                heap[:] = live  # in place: the heap is the lane's (best_pending pops it)
                heapq.heapify(heap)
            entries += live
        entries.sort()
        # a requeued task may have two identical live heap entries
        ids = list(dict.fromkeys(tid for _, tid in entries))
        return ids if limit is None else ids[:limit]

    # --- transactions -------------------------------------------------------------------
    def apply(self, txn: dict[str, Any]) -> None:
        getattr(self, "_t_" + txn["t"])(txn)

    def _request(self, txn: dict[str, Any], default: tuple[str, ...] = ()) -> None:
        """Record the transaction's request id, if it has one, with its reply."""
        if txn.get("req") is not None:
            self.requests[txn["req"]] = (txn["digest"], tuple(txn.get("result", default)))

    def _t_submit(self, txn: dict[str, Any]) -> None:
        ids = []
        for tid, inp, meta, prio, key, max_att, control, *extra in txn["tasks"]:
            allow_empty, *est = extra or (False, 1, 0, 0)
            task = Task(tid, tuple(inp) if inp else None, meta, prio, key,  # type: ignore[arg-type]
                        max_att, bool(control), 0, allow_empty=allow_empty,
                        estimates=tuple(est))  # type: ignore[arg-type]
            self.tasks[tid] = task
            self._make_pending(task)
            ids.append(tid)
        self._request(txn, tuple(ids))
        if txn.get("producer") is not None:
            pid, state = txn["producer"]
            self._set_producer(pid, state)

    def _set_producer(self, pid: str, state: Any) -> None:
        self.producers[pid] = state
        found = record_sets_in(state, strict=False)[1]
        self.producer_refs[pid] = frozenset(ref_to_tuple(r) for r in found)

    def _t_lease(self, txn: dict[str, Any]) -> None:
        worker, epoch = txn["worker"], txn["epoch"]
        for tid, attempt in txn["grants"]:
            task = self.tasks[tid]
            self._leave(task)
            task.status = LEASED
            task.attempt = attempt
            task.lease = (attempt, worker, epoch)
            self.leased_count += 1
            if task.input is not None:
                self.reads[(worker, tid, attempt)] = task.input
                self.read_epochs[(worker, tid, attempt)] = epoch

    def _drop_read(self, key: tuple[str, str, int]) -> None:
        self.reads.pop(key, None)
        self.read_epochs.pop(key, None)

    def _end_attempt(self, tid: str, attempt: int, *, reader_done: bool) -> Task:
        """The task leaves its status; its lease stays recorded (``task_status`` shows it)
        until it becomes pending again."""
        task = self.tasks[tid]
        if task.lease is not None and reader_done:
            self._drop_read((task.lease[1], tid, attempt))
        self._leave(task)
        return task

    def _t_complete(self, txn: dict[str, Any]) -> None:
        task = self._end_attempt(txn["task"], txn["attempt"], reader_done=True)
        task.status = COMPLETED
        task.position = len(self.commits)
        self.commits.append(CommitRecord(task.task_id, txn["attempt"], txn["sub"],
                                         tuple(txn["result"]),  # type: ignore[arg-type]
                                         txn["digest"], txn["epoch"], txn.get("meta")))
        self.submissions[txn["sub"]] = task.position

    def _t_fail(self, txn: dict[str, Any]) -> None:
        task = self._end_attempt(txn["task"], txn["attempt"], reader_done=True)
        task.failures += 1
        task.last_error = txn.get("error")
        if txn["final"]:
            task.status = FAILED
        else:
            self._make_pending(task)
        self._request(txn)

    def _t_expire(self, txn: dict[str, Any]) -> None:
        # the right to commit ends; the reader's protection does not (D5)
        task = self._end_attempt(txn["task"], txn["attempt"], reader_done=False)
        task.failures += 1
        task.last_error = "lease expired"
        if task.failures >= task.max_attempts:
            task.status = FAILED
        else:
            self._make_pending(task)

    def _t_yield(self, txn: dict[str, Any]) -> None:
        for tid, attempt, inp, prio, key, meta in txn["updates"]:
            task = self._end_attempt(tid, attempt, reader_done=True)
            task.input = tuple(inp) if inp else None  # type: ignore[assignment]
            task.priority, task.key, task.metadata = prio, key, meta
            # a yielded task joins the tail of its (priority, key) FIFO, in the order of
            # the updates (straw-queue's rule, which its users rely on: the partial
            # rollouts returned last are continued last among equals); fail, expiry and
            # release keep the submission position
            task.fifo = 0
            self._make_pending(task)
        self._request(txn, tuple(u[0] for u in txn["updates"]))

    def _t_progress(self, txn: dict[str, Any]) -> None:
        """save_task_progress: a leased task's input becomes the continuation; the lease
        and the reader's protection of what it read (D5) stay."""
        for tid, _attempt, inp in txn["updates"]:
            self.tasks[tid].input = tuple(inp)  # type: ignore[assignment]
        self._request(txn)

    def _t_release(self, txn: dict[str, Any]) -> None:
        for tid, attempt in txn["leases"]:
            self._make_pending(self._end_attempt(tid, attempt, reader_done=True))
        self._request(txn)

    def _t_cancel(self, txn: dict[str, Any]) -> None:
        task = self.tasks[txn["task"]]
        self._end_attempt(task.task_id, task.attempt, reader_done=False)
        task.status = CANCELLED
        self._request(txn)

    def _t_seal(self, txn: dict[str, Any]) -> None:
        self.sealed = True
        self._request(txn)

    def _t_reads(self, txn: dict[str, Any]) -> None:
        for key in [k for k in self.reads if k[1] == txn["task"] and
                    (txn["attempt"] is None or k[2] == txn["attempt"])]:
            self._drop_read(key)

    def _revoke(self, task: Task, error: Any) -> None:
        """A lease revoked by its worker's retirement or a recovery that spends: one
        unit of the task's budget, like an expiry (Q6); the reader's protection stays
        (D5) until its reads are released."""
        self._end_attempt(task.task_id, task.attempt, reader_done=False)
        task.failures += 1
        task.last_error = error
        if task.failures >= task.max_attempts:
            task.status = FAILED
        else:
            self._make_pending(task)

    def _t_retire(self, txn: dict[str, Any]) -> None:
        """The worker is confirmed stopped: its reads end and, with ``revoke``, its
        leases too (each spends one unit of the task's budget, like an expiry)."""
        worker = txn["worker"]
        for key in [k for k in self.reads if k[0] == worker]:
            self._drop_read(key)
        if not txn.get("revoke") or self.leased_count == 0:
            return
        for task in list(self.tasks.loaded()):  # leased tasks are loaded
            if task.status == LEASED and task.lease is not None and task.lease[1] == worker:
                self._revoke(task, {"category": "WorkerLost"})

    def _t_epoch(self, txn: dict[str, Any]) -> None:
        """A new coordinator epoch: every lease of an older epoch is revoked; with
        ``spend`` (journaled with the epoch: the recovering coordinator's policy; epochs
        of an earlier straw have none) each spends one unit of its task's budget (Q6),
        otherwise the task returns to pending unspent; read roots stay (D5, D9)."""
        self.epoch = txn["epoch"]
        if self.leased_count == 0:
            return
        for task in list(self.tasks.loaded()):  # leased tasks are loaded
            if task.status != LEASED:
                continue
            if txn.get("spend"):
                self._revoke(task, "lease revoked by coordinator recovery")
            else:
                self._leave(task)
                self._make_pending(task)

    def _t_cons_open(self, txn: dict[str, Any]) -> None:
        """Journals of an older straw recorded consumer tokens; they are not state now."""

    def _t_cons_save(self, txn: dict[str, Any]) -> None:
        c = self.consumers.setdefault(txn["consumer"], Consumer())
        c.fetch, c.processed = txn["fetch"], txn["processed"]
        c.state = tuple(txn["state"]) if txn["state"] else None  # type: ignore[assignment]
        c.progress = tuple(txn["progress"]) if txn.get("progress") else None  # type: ignore[assignment]
        c.sparse = tuple(txn.get("sparse", ()))
        c.finished = tuple(txn.get("finished", ()))
        if txn.get("req") is not None:
            self.consumer_requests[(txn["consumer"], txn["req"])] = (
                txn["digest"], (c.fetch, c.processed, c.state, c.progress))

    def _t_batch_plan(self, txn: dict[str, Any]) -> None:
        self.batches[txn["batch"]] = Batch(
            tuple(txn["positions"]), txn.get("consumer", "training"),
            tuple(txn["plan"]) if txn.get("plan") else None,  # type: ignore[arg-type]
            txn.get("digest", ""))

    def _t_batch_ready(self, txn: dict[str, Any]) -> None:
        b = self.batches[txn["batch"]]
        b.ref = tuple(txn["ref"])  # type: ignore[assignment]
        b.ready_digest = txn.get("digest", "")
        if txn.get("save") is not None:  # the consumer's state, in the same transaction
            self._t_cons_save(txn["save"])
            c = self.consumers[b.consumer]
            b.ready_state = (c.fetch, c.processed, c.state, c.progress)

    def _t_ckpt(self, txn: dict[str, Any]) -> None:
        self.checkpoints[txn["id"]] = Checkpoint(
            tuple(txn["ref"]) if txn["ref"] else None,  # type: ignore[arg-type]
            txn.get("cursor"), tuple(txn.get("batches", ())), txn.get("digest", ""),
            txn.get("record"))

    def _t_ckpt_release(self, txn: dict[str, Any]) -> None:
        self.checkpoints.pop(txn["id"], None)

    def batch_finished(self, batch_id: str) -> bool:
        b = self.batches.get(batch_id)
        c = None if b is None else self.consumers.get(b.consumer)
        return c is not None and batch_id in c.finished

    # --- what the queue must keep (its owner's roots, D2/D5) ------------------------------
    def checkpoint_floor(self) -> int | None:
        """The lowest commit cursor a checkpoint keeps results from (None: none does)."""
        cursors = [ck.cursor for ck in self.checkpoints.values() if ck.cursor is not None]
        return min(cursors) if cursors else None

    def retirement_cursor(self, consumer: str) -> int:
        """Commits below this position are no longer needed: processed by the designated
        consumer and not protected by a checkpoint's cursor."""
        c = self.consumers.get(consumer)
        cursor = c.processed if c else 0
        floor = self.checkpoint_floor()
        return cursor if floor is None else min(cursor, floor)

    def retired_sparse(self, consumer: str) -> frozenset[int]:
        """Positions past the retirement cursor that are no longer needed either: the
        designated consumer's sparse acknowledgements (its progress record) below every
        checkpoint's cursor."""
        c = self.consumers.get(consumer)
        if c is None:
            return frozenset()
        floor = self.checkpoint_floor()
        return frozenset(p for p in c.sparse if floor is None or p < floor)

    def live_refs(self, consumer: str, *, results: bool = True) -> set[RefTuple]:
        """What the queue still needs.  ``results=False`` leaves out the results of the
        unretired commits (``live_results``: the part that grows with the history)."""
        refs: set[RefTuple] = set()
        for task in self.tasks.loaded():  # the others are terminal
            if task.status not in TERMINAL and task.input is not None:
                refs.add(task.input)
        refs.update(self.reads.values())
        if results:
            refs.update(self.live_results(consumer))
        for c in self.consumers.values():
            refs.update(r for r in (c.state, c.progress) if r is not None)
        kept = {b for ck in self.checkpoints.values() for b in ck.batches}
        for bid, b in self.batches.items():
            if bid in kept or not self.batch_finished(bid):
                refs.update(r for r in (b.plan, b.ref) if r is not None)
        for ck in self.checkpoints.values():
            if ck.ref is not None:
                refs.add(ck.ref)
        for held in self.producer_refs.values():
            refs.update(held)
        return refs

    def live_results(self, consumer: str, stop: int | None = None,
                     since: tuple[int, frozenset[int]] | None = None) -> set[RefTuple]:
        """The results of the commits not retired for ``consumer`` (below ``stop``: all
        commits by default); ``since``: a (retirement cursor, sparse positions) recorded
        earlier, used instead of the current ones (``Coordinator``: what a recovered
        journal named)."""
        cursor, sparse = since or (self.retirement_cursor(consumer),
                                   self.retired_sparse(consumer))
        end = len(self.commits) if stop is None else stop
        return {rec.result for pos, rec in enumerate(self.commits[cursor:end], cursor)
                if pos not in sparse}

    # --- snapshots ------------------------------------------------------------------------
    def to_snapshot(self) -> dict[str, Any]:
        rows, meta = self.tasks.to_snapshot_rows()
        return {
            "epoch": self.epoch, "fifo": self.fifo, "sealed": self.sealed,
            # task rows as one blob decoded as tuples (Task fields in order, metadata left
            # out: user JSON must come back with lists, so it is a separate list)
            "tasks": msgpack.packb(rows, use_bin_type=True),
            "task_meta": meta,
            # the commit log is most of a snapshot: one blob, decoded as tuples (several
            # times faster than lists, and rows become CommitRecords without conversion)
            "commits": msgpack.packb(self.commits.rows(), use_bin_type=True),
            "requests": [[k, d, list(ids)] for k, (d, ids) in self.requests.live.items()],
            # history segments (straw.queue.history): what they hold is not in this snapshot
            "history": None if self.history is None else self.history.manifest(),
            "producers": self.producers,
            "reads": [[w, t, a, r, self.read_epochs.get((w, t, a), 0)]
                      for (w, t, a), r in self.reads.items()],
            "consumers": [[k, c.fetch, c.processed, c.state, c.progress, list(c.sparse),
                           list(c.finished)] for k, c in self.consumers.items()],
            "consumer_requests": [[k, r, d, list(v)]
                                  for (k, r), (d, v) in self.consumer_requests.items()],
            "batches": [[k, list(b.positions), b.consumer, b.plan, b.digest, b.ref,
                         b.ready_digest, None if b.ready_state is None else
                         list(b.ready_state)] for k, b in self.batches.items()],
            "checkpoints": [[k, ck.ref, ck.cursor, list(ck.batches), ck.digest, ck.record]
                            for k, ck in self.checkpoints.items()],
        }

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any],
                      history: Callable[[dict[str, Any]], History] | None = None
                      ) -> QueueState:
        """``history`` opens the history manifest a snapshot names (None: the snapshot
        must name none)."""
        # Hundreds of thousands of small objects at once: see ``bulk_objects``.
        with bulk_objects():
            return cls._from_snapshot(snap, history)

    @classmethod
    def _from_snapshot(cls, snap: dict[str, Any],
                       history: Callable[[dict[str, Any]], History] | None = None
                       ) -> QueueState:
        st = cls(epoch=snap["epoch"], fifo=snap["fifo"], sealed=snap["sealed"])
        hist = None
        if snap.get("history") is not None:
            if history is None:
                raise CorruptData("queue snapshot names history segments, but no history "
                                  "directory was given to read them")
            hist = history(snap["history"])
        rows = msgpack.unpackb(snap["tasks"], raw=False, use_list=False)
        st.tasks, live = TaskTable.from_rows(rows, snap["task_meta"])
        for task in live:
            if task.status == PENDING:
                st.pending_count += 1
                st.lanes.setdefault(task.control, []).append((task.order(), task.task_id))
            elif task.status == LEASED:
                st.leased_count += 1
        for heap in st.lanes.values():
            heapq.heapify(heap)
        rows = msgpack.unpackb(snap["commits"], raw=False, use_list=False)
        if any(n != len(CommitRecord._fields) for n in set(map(len, rows))):
            raise CorruptData(f"queue snapshot: commit rows must have "
                              f"{len(CommitRecord._fields)} fields")
        st.commits = CommitLog(rows)
        base = 0 if hist is None else hist.commit_count
        subs = map(operator.itemgetter(CommitRecord._fields.index("submission_id")), rows)
        st.submissions.live = dict(zip(subs, range(base, base + len(rows)), strict=True))
        st.requests.live = {k: (d, tuple(ids)) for k, d, ids in snap["requests"]}
        if hist is not None:
            st.history = st.tasks.history = st.submissions.history = hist
            st.requests.history = hist
            st.commits._base, st.commits.history = base, hist
        for pid, pstate in snap["producers"].items():
            st._set_producer(pid, pstate)
        for w, t, a, r, *e in snap["reads"]:  # the grant's epoch: absent in older snapshots
            st.reads[(w, t, a)] = tuple(r)  # type: ignore[assignment]
            st.read_epochs[(w, t, a)] = e[0] if e else 0
        _t = tuple_or_none
        st.consumers = {row[0]: consumer_from_row(row) for row in snap["consumers"]}
        for k, r, d, v in snap.get("consumer_requests", ()):
            fetch, processed, state, progress = v
            st.consumer_requests[(k, r)] = (d, (fetch, processed, _t(state), _t(progress)))
        st.batches = {row[0]: batch_from_row(row) for row in snap["batches"]}
        st.checkpoints = {row[0]: checkpoint_from_row(row) for row in snap["checkpoints"]}
        return st

