"""Leases and readers of a queue: grants, renewals, lease checks, expiry (Q3, D5).

A lease names its task, attempt (generation), worker and the epoch that granted it; its
``attempt_id`` and ``token`` are names derived from the queue's identity (the same in
every process and after recovery), so a lease edited by hand is not current.  A lease
may commit only while it is current: its task is leased to that attempt and worker by
this coordinator's epoch, and its deadline (in memory: recovery revokes every lease
anyway) has not passed.  An expired lease is journaled as ``expire`` when noticed.

A reader's protection outlives its lease (D5): lease expiry, cancellation and a new
coordinator revoke the right to commit, never the read; only the reader's own
completion, failure or yield, ``release_task_reads`` or ``retire_worker`` end it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..checks import check_count
from ..errors import Fenced
from ..protocol import AcquireResult, Assignment, CommitReceipt, Lease, TaskSpec
from . import rules
from .checks import check_id as _check_id
from .checks import check_lease_fields as _check_lease_fields
from .epochs import QueueEpochs


class QueueLeases(QueueEpochs):
    """Granting (``acquire``) and renewing (``heartbeat``) leases, lease checks and
    expiry, and the readers' protections (D5)."""

    # --- leases -------------------------------------------------------------------------
    def _check_lease(self, lease: object, *, allow_expired: bool = False,
                     where: str = "lease") -> Any:
        """The task of a current lease (mutex held); StaleAttempt/LeaseExpired otherwise
        (``rules.current_task``; an expired lease counts with ``allow_expired``)."""
        lease = _check_lease_fields(lease, where)
        now = None if allow_expired else self.clock.now()
        return rules.current_task(self.state, self._names, lease, self._epoch, now,
                                  self._deadlines, where)

    def _expire_due(self) -> int | None:
        """Journal the expiry of every lease past its deadline (mutex held; spec
        requeue_expired, ``rules.expiries``); the sequence number of the last one."""
        seq = None
        for tid, txn in rules.expiries(self.state, self._deadlines, self.clock.now()):
            del self._deadlines[tid]
            if txn is not None:
                seq = self._enqueue(txn)
        return seq

    def _lease_of(self, task: Any) -> Lease:
        generation, worker, epoch = task.lease
        return self._names.lease(task.task_id, generation, worker, epoch)

    def _spec_of(self, task: Any) -> TaskSpec:
        records, nbytes, tokens = task.estimates
        return TaskSpec(task.task_id, self._to_ref(task.input), task.metadata,
                        task.allow_empty, task.max_attempts, records, nbytes, tokens,
                        task.control, task.priority, task.key)

    def _receipt(self, pos: int) -> CommitReceipt:
        rec = self.state.commits[pos]
        ref = self._to_ref(rec.result)
        assert ref is not None
        return CommitReceipt(self._names.name("commit", pos, rec.submission_id)[:32], rec.task_id,
                             rec.submission_id, rec.digest, pos, ref)

    # --- granting and renewing ---------------------------------------------------------
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
        """acquire's choice (mutex held, expiries journaled; ``rules.acquire``): (status,
        the tasks chosen, the lease transaction granting them — for the caller to
        enqueue — or None)."""
        return rules.acquire(self.state, worker_id, max_tasks, task_ids, task_prefix, control,
                             leased=self._deadlines, draining=self._draining,
                             bounds=self._bounds, consumer_id=self.consumer_id,
                             epoch=self._epoch)

    def _assigned(self, chosen: list[Any]) -> tuple[Assignment, ...]:
        """The assignments of tasks just leased (mutex held, lease applied): their
        deadlines start now."""
        deadline = self.clock.now() + self.lease_seconds
        for t in chosen:
            self._deadlines[t.task_id] = deadline
        return tuple(Assignment(self._spec_of(t), self._lease_of(t)) for t in chosen)

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
        with self._mutex:
            self._check_usable()
            now = self.clock.now()
            out = rules.heartbeat(self.state, self._names, leases, self._epoch, now,
                                  self._deadlines)
            deadline = now + self.lease_seconds
            for lease, outcome in zip(leases, out, strict=True):
                if outcome == "extended":
                    self._deadlines[lease.task_id] = deadline
        return out


    # --- readers (D5) ------------------------------------------------------------------
    def outstanding_reads(self) -> tuple[Lease, ...]:
        """The leases whose reads were not ended (D5: a reader's protection outlives its
        lease; only its own completion, failure or yield, ``release_task_reads`` or
        ``retire_worker`` end it)."""
        self._check_process()
        with self._mutex:
            st = self.state
            return tuple(self._names.lease(t, a, w, st.read_epochs.get((w, t, a), 0))
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
            for txn in rules.release_reads(self.state, self._names, leases):
                seq = self._enqueue(txn)
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
            decision = rules.retire_worker(st, worker_id, self._deadlines)
            ended = [] if decision.txn is None else decision.reply
            seq = self._commit_decision(decision, ended)
            c = st.consumers.get(self.consumer_id)
            start = c.processed if c is not None else 0
            mine = [pos for pos in range(start, self._durable_commits)
                    if (st.commits[pos].metadata or {}).get("worker") == worker_id]
            receipts = [dataclasses.asdict(self._receipt(pos)) for pos in mine]
        if seq is not None:
            self._wait(seq)
        return receipts
