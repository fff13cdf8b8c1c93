"""The queue's decisions: one pure function per spec action.

A rule reads the queue's state (``QueueState``, never changed here) and the call's checked
arguments, and returns its decision — the journal transaction(s) and the reply — or
raises the straw error that refuses it.  No locks, no I/O, no clock (the time is passed
in), no coordinator: the ``Coordinator`` checks the arguments, adopts what they name
(D2: before the transaction naming it is journaled), calls the rule under its mutex, and
runs the commit pipeline with the decision (``pipeline.py``: apply, enqueue, wait for the
journal's fsync and the fence check, reply).  A rule that refuses leaves the journal
unchanged.  The references a transaction names are those of the call's arguments (a
yield's continuation keeps the task's input when it names none): the roots a call adopts
are checked and listed by its argument phase, before the rule runs.

Retries (D7): a call with a known request id is answered from the state
(``Decision.replayed``: the caller waits for the original to be durable, then replies
``Decision.reply``); the same id with other content is ``IdempotencyConflict``.

===========================  ==============================  ==========================
spec action (spec/actions)   Coordinator method              journal transaction
===========================  ==============================  ==========================
coord_retain_input,          submit_tasks (``submit``;       submit
coord_journal_submit         adoption first, D2)
acquire                      acquire (``acquire``)           lease
requeue_expired              acquire, complete_and_acquire   expire
                             (``expiries``)
heartbeat                    heartbeat (``heartbeat``)       (none: deadlines in memory)
complete                     complete_task, complete_tasks   complete
                             (``complete``)
complete_and_acquire         complete_and_acquire            complete + lease, one frame
                             (``complete``, ``acquire``)
fail                         fail_task (``fail``)            fail
release_lease                release_tasks                   release
                             (``release_leases``)
yield                        yield_tasks, yield_task         yield
                             (``yield_tasks``)
cancel                       cancel_task (``cancel``)        cancel
release_reads                release_task_reads              reads (one per reader)
                             (``release_reads``)
retire_worker                retire_worker                   retire
                             (``retire_worker``)
coord_recover                Coordinator(recover=True)       epoch
                             (``recover``)
old_coord_complete           any call of a fenced            (none: Fenced /
                             coordinator                     IndeterminateCommit, D8)
consume, acknowledge,        save_consumer_state,            cons_save (inside
restore, rewind              batch_ready (``c.known_save``,  batch_ready)
                             ``c.ready_known``,
                             ``c.consumer_save``)
register_checkpoint          register_checkpoint             ckpt
                             (``c.register_checkpoint``)
release_checkpoint           release_checkpoint              ckpt_release
                             (``c.release_checkpoint``)
hist_write .. hist_cleanup   (journal snapshots)             (snapshot, history segment)
===========================  ==============================  ==========================

Calls the spec does not model (below its abstraction): ``save_task_progress`` (progress;
``save_progress``), ``seal_input`` (seal; ``seal``), ``plan_batch`` (batch_plan;
``c.plan_batch``).  Spec actions of other parties are not the coordinator's: ``submit``
(the producer sends), ``expire`` (the clock passes a deadline), ``abandon`` (a worker
drops a stale lease), ``consumer_drop`` (the consumer's own owner), crashes and pauses.
The rules in brackets live here, those marked ``c.`` in ``rules_consumers.py``.  What
is not a rule is the pipeline's: the fence check (D8, ``QueueEpochs._fence_check``) and
the snapshots with their history segments (``CommitPipeline._write_snapshot``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import IdempotencyConflict, LeaseExpired, ResourceLimitExceeded, StaleAttempt
from ..pool.ref_forms import ref_to_tuple
from ..pool.refs import RecordSetRef
from ..protocol import Lease, Limits
from .checks import int_or_none
from .names import QueueNames
from .state import QueueState
from .tasks import CANCELLED, FAILED, LEASED, PENDING, TERMINAL, Task


class Decision(NamedTuple):
    """A rule's decision: the transaction to journal (None: nothing to journal) and the
    reply.  ``replayed``: a retry answered from the state (wait for the original)."""

    txn: dict[str, Any] | None
    reply: Any
    replayed: bool = False


def known(state: QueueState, owner: str, request_id: str, digest: str,
          kind: str) -> tuple[str, ...] | None:
    """The reply of an earlier request with this id (D7: a retry is answered from the
    state); ``IdempotencyConflict`` if the id was used for other content."""
    found = state.requests.get(request_id)
    if found is None:
        return None
    if found[0] != digest:
        raise IdempotencyConflict(
            f"queue {owner}: request_id {request_id!r} was already used for other "
            f"content (this is a {kind}); use a new request_id for new content")
    return found[1]


# --- leases (Q3) -------------------------------------------------------------------------
def current_task(state: QueueState, names: QueueNames, lease: Lease, epoch: int,
                 now: float | None, deadlines: Mapping[str, float],
                 where: str = "lease") -> Task:
    """spec ``live``: the task of a lease that may commit — its task is leased to the
    lease's generation and worker by this coordinator's ``epoch``, and its attempt id and
    token are the derived ones — else ``StaleAttempt``; and its deadline (``deadlines``,
    0 when absent) has not passed at ``now``, else ``LeaseExpired``.  ``now`` None: an
    expired lease still counts (what a release, and a completion's first look, ask)."""
    if lease.queue_id != names.queue_id or lease.run_id != names.run_id:
        # another queue's lease authorises nothing here: stale, as straw-queue answers
        # it, so a heartbeat reports it per lease rather than failing the whole call
        raise StaleAttempt(f"{where} of queue {lease.queue_id!r} (run {lease.run_id!r}) "
                           f"given to queue {names.queue_id!r} (run "
                           f"{names.run_id!r}): drop the work, or pass the lease "
                           "to the coordinator of the queue that granted it")
    if lease.coordinator_epoch != str(epoch):
        raise StaleAttempt(
            f"lease of task {lease.task_id!r} attempt {lease.attempt_id} was granted by "
            f"coordinator epoch {lease.coordinator_epoch}; the queue is at epoch "
            f"{epoch}. Drop the work; the task was returned to the queue")
    task = state.tasks.get(lease.task_id)
    if task is None:
        # a lease naming a task the queue does not know (a task id edited, or another
        # queue's lease) authorises nothing: stale, as straw-queue answers it, so a
        # heartbeat or release reports it per lease and never fails the whole call
        raise StaleAttempt(
            f"lease of task {lease.task_id!r} attempt {lease.attempt_id}: queue "
            f"{names.owner} has no such task; drop the work (pass the lease that "
            "acquire returned, unedited)")
    current = (task.status == LEASED and task.lease is not None
               and task.lease[0] == lease.generation and task.lease[1] == lease.worker_id)
    if not current or lease.attempt_id != names.attempt_id(task.task_id, lease.generation) \
            or lease.token != names.token(lease.attempt_id, lease.worker_id, epoch):
        raise StaleAttempt(
            f"task {lease.task_id!r} attempt {lease.attempt_id} (generation "
            f"{lease.generation}) is no longer leased to {lease.worker_id!r} (status "
            f"{task.status}, generation {task.attempt})")
    if now is not None and now > deadlines.get(lease.task_id, 0.0):
        # journaled as an expiry by the next acquire; the right to commit ends now
        raise LeaseExpired(
            f"lease of task {lease.task_id!r} attempt {lease.attempt_id} expired; renew "
            "leases with heartbeat before their deadline")
    return task


def heartbeat(state: QueueState, names: QueueNames, leases: Sequence[Lease], epoch: int,
              now: float, deadlines: Mapping[str, float]) -> list[str]:
    """spec heartbeat: one outcome per lease — ``extended`` for a live lease (the caller
    moves its deadline on), else ``LeaseExpired`` or ``StaleAttempt``."""
    out = []
    for i, lease in enumerate(leases):
        try:
            current_task(state, names, lease, epoch, now, deadlines, f"leases[{i}]")
        except LeaseExpired:
            out.append("LeaseExpired")
            continue
        except StaleAttempt:
            out.append("StaleAttempt")
            continue
        out.append("extended")
    return out


def expiries(state: QueueState, deadlines: Mapping[str, float],
             now: float) -> list[tuple[str, dict[str, Any] | None]]:
    """spec requeue_expired: for every deadline passed at ``now``, its task and the
    ``expire`` transaction of its lease (None: the task is no longer leased, the
    deadline is merely stale).  The caller drops those deadlines."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for tid, deadline in deadlines.items():
        if deadline < now:
            task = state.tasks[tid]
            out.append((tid, {"t": "expire", "task": tid, "attempt": task.attempt}
                        if task.status == LEASED else None))
    return out


# --- tasks ---------------------------------------------------------------------------------
def submit(state: QueueState, owner: str, request_id: str, digest: str,
           rows: list[list[Any]], producer: list[Any] | None, *, draining: bool,
           bounds: Limits, limits: Limits) -> Decision:
    """spec coord_journal_submit (its inputs adopted first, coord_retain_input): new tasks
    ``rows`` (``straw.queue.state``'s journal rows) and the producer's state, in one
    transaction; refused once input is sealed or draining, for a task id the queue knows,
    or past the pending-tasks limit.  Reply: the task ids."""
    found = known(state, owner, request_id, digest, "submit")
    if found is not None:
        return Decision(None, list(found), True)
    if state.sealed or draining:
        raise ValueError(f"queue {owner}: input is sealed or draining; no more tasks")
    for r in rows:
        if r[0] in state.tasks:
            raise IdempotencyConflict(
                f"queue {owner}: task id {r[0]!r} already exists (submitted by another "
                "request); task ids are new within a queue")
    if state.pending_count + len(rows) > bounds.pending_tasks:
        raise ResourceLimitExceeded(
            f"queue {owner} holds {state.pending_count} pending tasks; the limit is "
            f"{limits.pending_tasks} (Limits.pending_tasks)")
    txn = {"t": "submit", "req": request_id, "digest": digest, "tasks": rows,
           "producer": producer}
    return Decision(txn, [r[0] for r in rows])


def acquire(state: QueueState, worker_id: str, max_tasks: int,
            task_ids: Sequence[str] | None, task_prefix: str | None, control: bool, *,
            leased: Iterable[str], draining: bool, bounds: Limits, consumer_id: str,
            epoch: int) -> tuple[str, list[Task], dict[str, Any] | None]:
    """spec acquire (expiries journaled first, ``expiries``): up to ``max_tasks`` pending
    tasks of the lane in scheduling order (Q4), within the worker's and the lane's room
    (``leased``: the tasks this coordinator leased) and unless the designated consumer
    lags.  Returns (status, the tasks chosen, the ``lease`` transaction granting them or
    None); the status is ``acquired``, ``empty``, ``end_of_input``, ``backpressured`` or
    ``draining``."""
    held = in_lane = 0
    for t in leased:
        task = state.tasks[t]
        if task.status != LEASED or task.lease is None:
            continue
        held += task.lease[1] == worker_id
        in_lane += task.control == control
    lane_limit = bounds.control_tasks if control else bounds.inflight_tasks
    room = min(bounds.max_leases_per_worker - held, lane_limit - in_lane)
    # the control lane drains produced work: a lagging consumer does not hold it
    lagging = (not control and bounds.max_unconsumed_results is not None and
               len(state.commits) - state.retirement_cursor(consumer_id)
               >= bounds.max_unconsumed_results)
    chosen: list[Task] = []
    if draining:  # drain(): nothing more is handed out here
        status = "draining"
    elif room <= 0 or lagging:
        status = "backpressured"
    else:
        chosen = _choose(state, min(max_tasks, room), task_prefix, task_ids, control)
        status = "acquired" if chosen else _idle_status(state)
    if not chosen:
        return status, chosen, None
    grants = [[t.task_id, t.attempt + 1] for t in chosen]
    return status, chosen, {"t": "lease", "epoch": epoch, "worker": worker_id,
                            "grants": grants}


def _choose(state: QueueState, n: int, prefix: str | None, task_ids: Sequence[str] | None,
            control: bool) -> list[Task]:
    if task_ids is None:
        return state.best_pending(control, n, prefix)
    wanted = []
    for tid in dict.fromkeys(task_ids):  # a repeated id is one task, leased once
        if not isinstance(tid, str):
            raise TypeError(f"task_ids must hold str task ids, got {type(tid).__name__}")
        task = state.tasks.get(tid)
        if task is not None and task.status == PENDING and task.control == control and \
                (prefix is None or tid.startswith(prefix)):
            wanted.append(task)
    wanted.sort(key=lambda t: t.order())  # scheduling order decides among them
    return wanted[:n]


def _idle_status(state: QueueState) -> str:
    # straw-queue's answers: ``end_of_input`` only once input is sealed and no task is
    # pending or leased (a leased one may still come back to pending); ``draining`` is
    # ``drain()``'s alone (answered before any choice is made)
    if state.sealed and state.pending_count == 0 and state.leased_count == 0:
        return "end_of_input"
    return "empty"


def completed(state: QueueState, names: QueueNames, submission_id: str,
              key: list[Any]) -> int | None:
    """The commit position of an accepted completion with this submission id (D7), None
    if there is none; ``IdempotencyConflict`` if it accepted another result (``key``:
    task id, generation, result digest)."""
    pos = state.submissions.get(submission_id)
    if pos is None:
        return None
    rec = state.commits[pos]
    if [rec.task_id, rec.attempt, rec.digest] != key:
        raise IdempotencyConflict(
            f"submission_id {submission_id!r} already accepted task {rec.task_id!r} "
            f"attempt {names.attempt_id(rec.task_id, rec.attempt)} with another result; "
            "use a new submission_id")
    return pos


def complete(state: QueueState, names: QueueNames, lease: Lease, submission_id: str,
             key: list[Any], ref: RecordSetRef, epoch: int, now: float,
             deadlines: Mapping[str, float]) -> tuple[int | None, dict[str, Any] | None]:
    """spec complete: (the original commit's position, None) for a retry (D7), else
    (None, the ``complete`` transaction) for a live lease (Q3; ``current_task``).  The
    result itself (the attempt's records, the limits) is checked before, by the caller,
    which reads it."""
    pos = completed(state, names, submission_id, key)
    if pos is not None:
        return pos, None
    task = current_task(state, names, lease, epoch, now, deadlines)
    return None, completion_txn(task.task_id, lease, submission_id, ref, epoch)


def completion_txn(task_id: str, lease: Lease, submission_id: str, ref: RecordSetRef,
                   epoch: int) -> dict[str, Any]:
    """The journal transaction of an accepted completion."""
    return {"t": "complete", "task": task_id, "attempt": lease.generation,
            "sub": submission_id, "result": list(ref_to_tuple(ref)), "digest": ref.digest,
            "epoch": epoch, "meta": {"worker": lease.worker_id}}


def fail(state: QueueState, names: QueueNames, lease: Lease, request_id: str | None,
         digest: str, error: Any, retryable: bool, epoch: int, now: float,
         deadlines: Mapping[str, float]) -> Decision:
    """spec fail: a live lease's attempt failed; the task spends one unit of its budget
    and returns to ``pending``, or fails for good (``failed``: budget spent, or not
    ``retryable``).  Reply: which."""
    found = None if request_id is None else known(state, names.owner, request_id, digest,
                                                  "fail")
    if found is not None:
        return Decision(None, found[0], True)
    task = current_task(state, names, lease, epoch, now, deadlines)
    final = (not retryable) or task.failures + 1 >= task.max_attempts
    outcome = FAILED if final else PENDING
    txn: dict[str, Any] = {"t": "fail", "task": task.task_id, "attempt": lease.generation,
                           "error": error, "final": final}
    if request_id is not None:
        txn.update(req=request_id, digest=digest, result=[outcome])
    return Decision(txn, outcome)


def release_leases(state: QueueState, names: QueueNames, leases: Sequence[Lease],
                   request_id: str | None, digest: str, epoch: int) -> Decision:
    """spec release_lease: each lease that is its task's current one (an expired lease
    too) gives the task back unfinished, budget unspent.  Reply: one outcome per lease,
    ``released`` or ``StaleAttempt`` (also for a lease given twice); no transaction when
    none is released."""
    found = None if request_id is None else known(state, names.owner, request_id, digest,
                                                  "release")
    if found is not None:
        return Decision(None, list(found), True)
    rows: list[list[Any]] = []
    outcomes = []
    for i, lease in enumerate(leases):
        try:
            task = current_task(state, names, lease, epoch, None, {}, f"leases[{i}]")
        except StaleAttempt:
            outcomes.append("StaleAttempt")
            continue
        if [task.task_id, lease.generation] in rows:
            outcomes.append("StaleAttempt")  # given twice: released once
            continue
        rows.append([task.task_id, lease.generation])
        outcomes.append("released")
    if not rows:
        return Decision(None, outcomes)
    txn: dict[str, Any] = {"t": "release", "leases": rows}
    if request_id is not None:
        txn.update(req=request_id, digest=digest, result=outcomes)
    return Decision(txn, outcomes)


YieldRow = tuple[Lease, RecordSetRef | None, int | None, int | None, Any]


def yield_tasks(state: QueueState, names: QueueNames, rows: Sequence[YieldRow],
                request_id: str, digest: str, epoch: int, now: float,
                deadlines: Mapping[str, float]) -> Decision:
    """spec yield: live leases return their tasks to pending, atomically, budget unspent,
    each with its continuation input (None keeps the input) and optionally a new
    priority, scheduling key and metadata (``rows``: lease, input, priority, key,
    metadata); one stale lease refuses them all.  Reply: ``pending``."""
    if known(state, names.owner, request_id, digest, "yield") is not None:
        return Decision(None, PENDING, True)
    txn_rows = []
    for i, (lease, ref, prio, key, meta) in enumerate(rows):
        task = current_task(state, names, lease, epoch, now, deadlines,
                            f"updates[{i}]['lease']")
        prio = task.priority if prio is None else prio
        key = task.key if key is None else key
        meta = task.metadata if meta is None else meta
        new_input = list(ref_to_tuple(ref)) if ref is not None else (
            list(task.input) if task.input else None)
        txn_rows.append([task.task_id, lease.generation, new_input, prio, key, meta])
    return Decision({"t": "yield", "req": request_id, "digest": digest,
                     "updates": txn_rows}, PENDING)


def cancel(state: QueueState, owner: str, task_id: str, request_id: str | None,
           digest: str) -> Decision:
    """spec cancel: a pending or leased task ends ``cancelled`` (its lease can no longer
    commit; a reader keeps its protection, D5); ``ValueError`` for an unknown or
    terminal task.  Reply: ``cancelled``."""
    found = None if request_id is None else known(state, owner, request_id, digest, "cancel")
    if found is not None:
        return Decision(None, found[0], True)
    task = state.tasks.get(task_id)
    if task is None:
        raise ValueError(f"queue {owner}: unknown task id {task_id!r}")
    if task.status in TERMINAL:
        raise ValueError(f"queue {owner}: task {task_id!r} is already {task.status}; only "
                         "pending or leased tasks can be cancelled")
    txn: dict[str, Any] = {"t": "cancel", "task": task_id}
    if request_id is not None:
        txn.update(req=request_id, digest=digest, result=[CANCELLED])
    return Decision(txn, CANCELLED)


def seal(state: QueueState) -> Decision:
    """``seal_input`` (not a spec action: the spec's producer submits a fixed set): no
    more submissions.  Idempotent: sealed input journals nothing.  Reply: ``sealed``."""
    return Decision(None if state.sealed else {"t": "seal"}, "sealed")


ProgressRow = tuple[Lease, RecordSetRef]


def save_progress(state: QueueState, names: QueueNames, rows: Sequence[ProgressRow],
                  request_id: str, digest: str, epoch: int, now: float,
                  deadlines: Mapping[str, float]) -> Decision:
    """``save_task_progress`` (not a spec action: below its abstraction, a continuation
    saved while the lease is kept): each live lease's task takes its continuation
    (``rows``: lease, input) as its input, atomically; one stale or expired lease refuses
    them all.  Reply: ``saved``."""
    found = known(state, names.owner, request_id, digest, "save_task_progress")
    if found is not None:
        return Decision(None, found[0], True)
    updates = [[current_task(state, names, le, epoch, now, deadlines,
                             f"updates[{i}]['lease']").task_id,
                le.generation, list(ref_to_tuple(r))] for i, (le, r) in enumerate(rows)]
    return Decision({"t": "progress", "req": request_id, "digest": digest,
                     "updates": updates, "result": ["saved"]}, "saved")


# --- readers and workers (D5) ----------------------------------------------------------------
def release_reads(state: QueueState, names: QueueNames,
                  leases: Sequence[Lease]) -> list[dict[str, Any]]:
    """spec release_reads: the ``reads`` transactions (one per reader, in the order of
    ``leases``) ending the protection of each lease's outstanding reader.  A lease whose
    attempt has no outstanding reader ends nothing; a lease naming an outstanding reader's
    attempt but differing from that reader's lease is ``StaleAttempt`` for the whole call
    (D5: only the reader's own lease ends its protection)."""
    by_attempt: dict[str, tuple[str, str, int]] | None = None
    ending = []
    for i, lease in enumerate(leases):
        key: tuple[str, str, int] | None = (lease.worker_id, lease.task_id, lease.generation)
        if key not in state.reads or \
                names.attempt_id(lease.task_id, lease.generation) != lease.attempt_id:
            # not a reader's own fields: find the reader its attempt id names (the whole
            # read set hashed once, only for such a lease)
            if by_attempt is None:
                by_attempt = {names.attempt_id(t, a): (w, t, a) for (w, t, a) in state.reads}
            key = by_attempt.get(lease.attempt_id)
        if key is None:
            continue
        w, t, a = key
        # 0: a grant recorded before its epoch was (an older snapshot); the token still
        # binds the epoch the lease states
        epoch = state.read_epochs.get(key, 0) or int_or_none(lease.coordinator_epoch)
        if epoch is None or lease != names.lease(t, a, w, epoch):
            raise StaleAttempt(
                f"leases[{i}] (task {lease.task_id!r}, attempt {lease.attempt_id}, "
                f"worker {lease.worker_id!r}) is not the lease of that attempt's reader "
                f"(task {t!r}, generation {a}, worker {w!r}); nothing was released. Pass "
                "the leases acquire or outstanding_reads returned, unedited")
        ending.append(key)
    return [{"t": "reads", "task": t, "attempt": a} for _w, t, a in dict.fromkeys(ending)]


def retire_worker(state: QueueState, worker_id: str, leased: Iterable[str]) -> Decision:
    """spec retire_worker (the caller confirmed the worker stopped): revoke every lease
    this coordinator granted the worker (``leased``: the tasks it leased; each spends one
    unit of its task's budget, as an expiry) and drop the worker's read protections, in
    one ``retire`` transaction; none when it holds neither.  Reply: the revoked tasks."""
    revoked = [t for t in leased if (task := state.tasks[t]).status == LEASED
               and task.lease is not None and task.lease[1] == worker_id]
    if not revoked and not any(k[0] == worker_id for k in state.reads):
        return Decision(None, revoked)
    return Decision({"t": "retire", "worker": worker_id, "revoke": True}, revoked)


def recover(epoch: int, spend: bool) -> dict[str, Any]:
    """spec coord_recover (once the new epoch is durable and the journal replayed): the
    ``epoch`` transaction revoking every older lease, each spending one unit of its
    task's budget with ``spend`` (the recovery policy, journaled with it, Q6).  It
    refuses nothing: exclusivity is the epoch lock's (D8)."""
    return {"t": "epoch", "epoch": epoch, "spend": spend}
