"""Completions: a leased attempt's result accepted exactly once (spec complete, D7).

``complete_task`` accepts one result, ``complete_tasks`` many in one journal frame, and
``complete_and_acquire`` a result and the worker's next grant in one frame.  Each follows
the commit pipeline in two passes over the mutex: first a retry is answered from the state
and the lease is checked (``rules.completed``, ``rules.current_task``); then, outside the
mutex, the result is read and checked (its records name the attempt, the result limits)
and adopted under the queue owner (D2); then, under the mutex again, ``rules.complete``
decides against the state as it is now (a concurrent retry may have won) and the
transaction is applied and enqueued.  Waiting for durability and the fence check happen
outside the mutex, as for every call.

Concurrent completions announce themselves to the catalog and the journal
(``adopting_soon``, ``incoming``) so that they share one catalog fsync and one journal
sync (group commit).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..checks import check_count
from ..errors import (
    Closed,
    InvalidReference,
    ResourceLimitExceeded,
    StorageUnavailable,
    StrawError,
)
from ..pool.catalog.catalog import Announcement
from ..pool.refs import RecordSetRef
from ..protocol import AcquireResult, CommitReceipt, Lease
from . import rules
from .checks import check_id as _check_id
from .checks import check_lease_fields as _check_lease_fields
from .leases import QueueLeases
from .pipeline import _Adopted


class QueueCompletions(QueueLeases):
    """Accepting results: one, many in one frame, or one with the next grant."""

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
                now = self.clock.now()
                txns = []
                for i, lease, sub, ref, key in checked:
                    try:
                        pos, txn = rules.complete(self.state, self._names, lease, sub, key,
                                                  ref, self._epoch, now, self._deadlines)
                    except StrawError as e:
                        outcomes[i] = e
                        continue
                    if txn is None:  # a concurrent call (or an earlier item)
                        assert pos is not None
                        outcomes[i] = self._receipt(pos)
                        continue
                    self.state.apply(txn)  # journal order = apply order (one frame)
                    self._deadlines.pop(txn["task"], None)
                    txns.append(txn)
                if txns:
                    seq = self._enqueue_applied(txns)
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
            if done is None:  # the lease is current, expired or not (spec complete)
                allow_empty = rules.current_task(self.state, self._names, lease, self._epoch,
                                                 None, self._deadlines).allow_empty
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
                pos, txn = rules.complete(self.state, self._names, lease, submission_id, key,
                                          ref, self._epoch, self.clock.now(), self._deadlines)
                if txn is None:  # a concurrent retry got there first
                    assert pos is not None
                    done, seq = self._receipt(pos), self._last_seq
                elif then_acquire is None:
                    seq = self._enqueue(txn)
                    self._deadlines.pop(txn["task"], None)
                else:
                    seq, got = self._complete_then_grant(txn, lease.worker_id, *then_acquire)
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
        return self._enqueue_applied(txns), AcquireResult(status, self._assigned(chosen))

    def _completed_receipt(self, submission_id: str, key: list[Any]) -> CommitReceipt | None:
        """The receipt of an accepted completion with this submission id (D7), or None."""
        pos = rules.completed(self.state, self._names, submission_id, key)
        return None if pos is None else self._receipt(pos)

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

