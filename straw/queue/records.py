"""The records of consumers, batches and checkpoints, and their snapshot rows.

Each ``*_from_row`` reads the row ``QueueState.to_snapshot`` writes, or the shorter row of
an older straw's snapshot (its missing fields take their defaults).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .tasks import RefTuple
from .tasks import tuple_or_none as _t


@dataclass
class Consumer:
    """A consumer's saved progress.  ``sparse`` and ``finished`` come from its progress
    record (``progress``): positions processed past the contiguous prefix, and batches
    every rank finished reading.  Its ownership token is not here: a token belongs to one
    coordinator process (recovery ends every open consumer), so it is not journaled."""

    fetch: int = 0
    processed: int = 0
    state: RefTuple | None = None
    progress: RefTuple | None = None
    sparse: tuple[int, ...] = ()
    finished: tuple[str, ...] = ()


@dataclass
class Batch:
    """A planned training batch of ``consumer``: the commit positions it reads and its
    plan; ``ref`` once it is ready.  It is finished while its consumer's saved progress
    lists it (so a rewind to older progress makes it unfinished, and kept, again)."""

    positions: tuple[int, ...]
    consumer: str = "training"
    plan: RefTuple | None = None
    digest: str = ""
    ref: RefTuple | None = None
    ready_digest: str = ""
    # the consumer state saved with it: (fetch, processed, state, progress)
    ready_state: tuple[Any, ...] | None = None


@dataclass
class Checkpoint:
    """A registered checkpoint: its root ``ref`` (kept with its dependencies), the ready
    batches it names (their plan and ready refs are kept too) and, optionally, a commit
    ``cursor`` from which every result is kept (a consumer may rewind there)."""

    ref: RefTuple | None
    cursor: int | None = None
    batches: tuple[str, ...] = ()
    digest: str = ""
    record: Any = None  # the checkpoint record's JSON, as checked at registration


def consumer_from_row(row: Sequence[Any]) -> Consumer:
    """A snapshot's consumer row ``[k, fetch, processed, state, progress, sparse,
    finished]`` (``k``: its id)."""
    if len(row) == 6:  # an older straw's row: [k, token, fetch, processed, state, fin]
        _k, _token, fetch, processed, state, finished = row
        return Consumer(fetch, processed, _t(state), None, (), tuple(finished))
    _k, fetch, processed, state, progress, sparse, finished = row
    return Consumer(fetch, processed, _t(state), _t(progress), tuple(sparse), tuple(finished))


def batch_from_row(row: Sequence[Any]) -> Batch:
    """A snapshot's batch row ``[k, positions, consumer, plan, digest, ref, ready_digest,
    saved]``."""
    if len(row) == 4:  # older: [k, positions, ready ref, finished flag]
        _k, positions, ref, _finished = row
        return Batch(tuple(positions), ref=_t(ref))
    _k, positions, consumer, plan, digest, ref, ready_digest, saved = row
    if saved is not None:
        saved = (saved[0], saved[1], _t(saved[2]), _t(saved[3]))
    return Batch(tuple(positions), consumer, _t(plan), digest, _t(ref), ready_digest, saved)


def checkpoint_from_row(row: Sequence[Any]) -> Checkpoint:
    """A snapshot's checkpoint row ``[k, ref, cursor, batches, digest, record]``."""
    if len(row) == 3:  # older: [k, ref, cursor]
        _k, r, cur = row
        return Checkpoint(_t(r), cur)
    _k, r, cur, batches, digest, record = row
    return Checkpoint(_t(r), cur, tuple(batches), digest, record)
