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
from ..errors import InvalidReference
from ..pool.refs import RecordSetRef
from . import rules_consumers
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
            decision = rules_consumers.plan_batch(
                self.state, batch_id, consumer_id, pos, _ref_tuple(ref), digest,
                durable_commits=self._durable_commits, bounds=self._bounds,
                limits=self.limits)
            if decision.replayed:
                return "done", True
            if not final:
                return "need", []
            return "seq", self._commit_decision(decision)

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
            if rules_consumers.ready_known(self.state, batch_id, consumer_id, digest):
                return self._ready_view(batch_id)
            return None

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
            decision, needed = rules_consumers.register_checkpoint(
                self.state, checkpoint_id, _ref_tuple(ref), cursor, record, digest,
                designated=self.consumer_id, durable_commits=self._durable_commits)
            if decision.replayed:
                return "done", True
            again = self._unrooted(needed)
            if again or not final:
                return "need", again
            return "seq", self._commit_decision(decision)

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
            seq = self._commit_decision(rules_consumers.release_checkpoint(self.state,
                                                                           checkpoint_id))
        if seq is not None:
            self._wait(seq)
