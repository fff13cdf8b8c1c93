"""Batches and checkpoints of a queue's consumers.

A batch is planned before any conversion hook runs (``plan_batch``: which accepted
results it reads, and its plan), then made ready with its consumer's state in one
transaction (``batch_ready``); its plan and ready data are kept until the consumer's
progress lists it finished.  A checkpoint (spec register_checkpoint, release_checkpoint)
keeps its root record, the ready batches it names and, with a ``cursor``, every result
from that commit position on, so a consumer may rewind there: acknowledged results it
needs again are checked and adopted by the queue again before it is journaled (D2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..checks import check_count
from ..errors import IdempotencyConflict, InvalidReference, ResourceLimitExceeded
from ..refs import RecordSetRef
from .checks import canonical as _canonical
from .checks import check_id as _check_id
from .checks import digest as _digest
from .checks import ref_dict as _ref_dict
from .checks import ref_tuple as _ref_tuple
from .consumers import QueueConsumers


class QueueBatches(QueueConsumers):
    """Batch plans and ready batches; checkpoints."""

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

    # --- checkpoints --------------------------------------------------------------------
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
