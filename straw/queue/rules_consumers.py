"""The queue's decisions for consumers, batches and checkpoints: pure, as ``rules.py``.

A consumer save (spec consume, acknowledge, restore, rewind: ``save_consumer_state``, and
``batch_ready``, which saves with the batch) moves the consumer's view of the commit log;
the designated consumer's view also releases accepted results (its processed cursor and
the positions it processed out of order acknowledge them, unless a checkpoint's cursor
keeps them).  A save that rewinds, and a checkpoint whose cursor keeps results already
acknowledged, need history again: the rules name those results (and the plan and ready
data of batches no longer finished); the caller checks which of them the queue no longer
roots, and adopts those (D2) before it journals the decision.  Token ownership and the
reading of records (progress, checkpoint) are the caller's: they are process state and
I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import IdempotencyConflict, InvalidReference, ResourceLimitExceeded
from ..protocol import Limits
from .records import Batch, Checkpoint
from .rules import Decision
from .state import QueueState
from .tasks import RefTuple

# what the designated consumer's acknowledgements release: (cursor, sparse positions)
Released = tuple[int, frozenset[int]]


def acknowledged(processed: int, sparse: Iterable[int], floor: int | None) -> Released:
    """What the designated consumer's ``processed`` cursor and ``sparse`` positions
    acknowledge, given the lowest checkpoint cursor ``floor``."""
    cursor = processed if floor is None else min(processed, floor)
    return cursor, frozenset(p for p in sparse if p >= cursor and
                             (floor is None or p < floor))


def history_needed(state: QueueState, designated: str, new: Released) -> list[RefTuple]:
    """The results acknowledged now that ``new`` acknowledges no more (a rewind)."""
    old = (state.retirement_cursor(designated), state.retired_sparse(designated))
    again = [p for p in range(new[0], old[0]) if p not in new[1]]
    again += [p for p in old[1] if p >= new[0] and p not in new[1]]
    return [state.commits[p].result for p in sorted(again)]


def known_save(state: QueueState, consumer_id: str, request_id: str,
               digest: str) -> tuple[Any, ...] | None:
    """The values an earlier ``save_consumer_state`` with this request id saved (D7), or
    None; ``IdempotencyConflict`` if it saved another state."""
    known = state.consumer_requests.get((consumer_id, request_id))
    if known is None:
        return None
    if known[0] != digest:
        raise IdempotencyConflict(
            f"consumer {consumer_id!r} request_id {request_id!r} was used for another "
            "state; use a new request_id for new content")
    return known[1]


def consumer_save(state: QueueState, consumer_id: str, txn: dict[str, Any], *,
                  designated: str, durable_commits: int) -> list[RefTuple]:
    """spec consume, acknowledge, restore, rewind: the save ``txn`` (a ``cons_save``)
    fits the queue — its fetch cursor within the durable commits, its out-of-order
    positions within the fetched, unprocessed range, its finished batches ready batches
    of the consumer — else ``ValueError``/``InvalidReference``.  Returns what the save
    needs again: acknowledged results it no longer acknowledges (the designated
    consumer's), and the plan and ready data of batches it no longer lists finished."""
    fetch, processed = txn["fetch"], txn["processed"]
    if fetch > durable_commits:
        raise ValueError(f"fetch_cursor {fetch} is past the commit log "
                         f"({durable_commits} durable commits)")
    for p in txn["sparse"]:
        if not processed <= p < fetch:
            raise InvalidReference(
                f"progress of consumer {consumer_id!r} lists position {p}, outside the "
                f"fetched, unprocessed range [{processed}, {fetch})")
    for b in txn["finished"]:
        batch = state.batches.get(b)
        if batch is None or batch.consumer != consumer_id or batch.ref is None:
            raise InvalidReference(
                f"progress of consumer {consumer_id!r} lists batch {b!r}, which is not a "
                "ready batch of that consumer (batch_ready it first)")
    out: list[RefTuple] = []
    if consumer_id == designated:
        out += history_needed(state, designated, acknowledged(
            processed, txn["sparse"], state.checkpoint_floor()))
    c = state.consumers.get(consumer_id)
    kept = {b for ck in state.checkpoints.values() for b in ck.batches}
    for b in set(c.finished if c else ()) - set(txn["finished"]) - kept:
        batch = state.batches[b]
        out += [r for r in (batch.plan, batch.ref) if r is not None]
    return out


def ready_known(state: QueueState, batch_id: str, consumer_id: str, digest: str) -> bool:
    """``batch_ready``'s retry (D7): True if the batch is ready with this content, False
    if it is planned and not ready; ``InvalidReference`` if it is not a planned batch of
    the consumer, ``IdempotencyConflict`` if it is ready with other content."""
    b = state.batches.get(batch_id)
    if b is None or b.consumer != consumer_id:
        raise InvalidReference(
            f"batch {batch_id!r} is not a planned batch of consumer {consumer_id!r}; "
            "plan_batch it first")
    if b.ref is None:
        return False
    if b.ready_digest != digest:
        raise IdempotencyConflict(
            f"batch {batch_id!r} was already made ready with another ready reference "
            "or consumer state")
    return True


def _retry(existing: Batch | Checkpoint | None, digest: str, conflict: str) -> Decision | None:
    """D7 for what the caller names itself (a batch, a checkpoint): None if ``existing`` is
    None (new), a retry's decision if it has this content, else ``IdempotencyConflict``
    (``conflict``)."""
    if existing is None:
        return None
    if existing.digest != digest:
        raise IdempotencyConflict(conflict)
    return Decision(None, True, True)


def plan_batch(state: QueueState, batch_id: str, consumer_id: str, positions: Sequence[int],
               plan: RefTuple, digest: str, *, durable_commits: int, bounds: Limits,
               limits: Limits) -> Decision:
    """``plan_batch`` (below the spec's abstraction: the results a batch reads, recorded
    before any conversion runs): the ``batch_plan`` transaction, or a retry of the same
    plan (``IdempotencyConflict`` for another one); refused for a position that is not a
    durable commit, or past the unfinished-batches limit."""
    retry = _retry(state.batches.get(batch_id), digest,
                   f"batch {batch_id!r} was planned with other positions, plan or consumer; "
                   "use a new batch_id")
    if retry is not None:
        return retry
    for p in positions:
        if p >= durable_commits:
            raise InvalidReference(
                f"batch {batch_id!r} input position {p} is not an accepted commit "
                f"({durable_commits} durable commits)")
    unfinished = sum(1 for k in state.batches if not state.batch_finished(k))
    if unfinished >= bounds.max_ready_batches:
        raise ResourceLimitExceeded(
            f"{unfinished} unfinished batches; the limit is "
            f"{limits.max_ready_batches} (Limits.max_ready_batches)")
    return Decision({"t": "batch_plan", "batch": batch_id, "consumer": consumer_id,
                     "positions": list(positions), "plan": list(plan), "digest": digest},
                    True)


def register_checkpoint(state: QueueState, checkpoint_id: str, ref: RefTuple,
                        cursor: int | None, record: dict[str, Any], digest: str, *,
                        designated: str, durable_commits: int
                        ) -> tuple[Decision, list[RefTuple]]:
    """spec register_checkpoint: the ``ckpt`` transaction keeping the checkpoint's root,
    the ready batches its record names and, with ``cursor``, every result from there on,
    with the acknowledged results that cursor needs again; or a retry of the same
    registration (``IdempotencyConflict`` for other content).  Refused for a named batch
    that is not ready, or a cursor past the durable commits."""
    retry = _retry(state.checkpoints.get(checkpoint_id), digest,
                   f"checkpoint {checkpoint_id!r} is registered with another reference or "
                   "cursor; release it first, or use a new id")
    if retry is not None:
        return retry, []
    for b in record["batch_ids"]:
        batch = state.batches.get(b)
        if batch is None or batch.ref is None:
            raise InvalidReference(
                f"checkpoint {checkpoint_id!r} names batch {b!r}, which is not a "
                "ready batch of this queue")
    needed: list[RefTuple] = []
    if cursor is not None:
        if cursor > durable_commits:
            raise ValueError(f"cursor {cursor} is past the commit log "
                             f"({durable_commits} durable commits)")
        # keeping results from cursor on: acknowledged ones are needed again
        c = state.consumers.get(designated)
        floor = state.checkpoint_floor()
        floor = cursor if floor is None else min(floor, cursor)
        needed = history_needed(state, designated, acknowledged(
            c.processed if c else 0, c.sparse if c else (), floor))
    txn = {"t": "ckpt", "id": checkpoint_id, "ref": list(ref), "cursor": cursor,
           "batches": list(record["batch_ids"]), "digest": digest, "record": record}
    return Decision(txn, True), needed


def release_checkpoint(state: QueueState, checkpoint_id: str) -> Decision:
    """spec release_checkpoint: the ``ckpt_release`` transaction; none for a checkpoint
    that is not registered (a no-op)."""
    if checkpoint_id not in state.checkpoints:
        return Decision(None, None)
    return Decision({"t": "ckpt_release", "id": checkpoint_id}, None)
