"""Reads of a queue's state: the commit log, tasks, inspection views and metrics.

Reads take the mutex and answer from the in-memory state; the commit log is read only up
to what is durable (``_durable_commits``), and a position the designated consumer
acknowledged and a collection released is refused (its data may be gone).  Every view
is a fresh copy in straw-queue's shapes.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from typing import Any

from ..checks import check_count, check_usage_total
from ..errors import InvalidReference
from ..pool.records import Record
from ..pool.refs import RecordSetRef
from ..protocol import CommitPage, CommitReceipt, TaskSpec
from .batches import QueueBatches
from .checks import canonical as _canonical
from .checks import check_id as _check_id
from .checks import check_int64 as _check_int64
from .checks import plain as _plain
from .checks import usage_of as _usage_of
from .tasks import COMPLETED, LEASED


class QueueViews(QueueBatches):
    """The commit log, task status and pending tasks, inspection views and metrics."""

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

    # --- inspection ---------------------------------------------------------------------
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

    # --- read-only views of the queue's state ----------------------------------------------
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

    # --- metrics ------------------------------------------------------------------------
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
