"""Consumers of a queue's commit log (spec consume, acknowledge, restore, rewind).

A consumer has one owner at a time: ``open_consumer`` hands it a token that every save,
plan and ready call must present.  Tokens belong to this coordinator process and are not
journaled (a recovered coordinator has no open consumer); the saved progress is.  The
designated consumer (``consumer_id``, "training" by default) is the one whose progress
releases accepted results: its processed cursor and the positions its progress record
lists as processed out of order acknowledge them, unless a checkpoint keeps them.

A save may rewind (a lower cursor, fewer positions or batches, as when restoring a
checkpoint): history the queue released must still be retained by someone else; it is
checked (every byte) and adopted by the queue again before the save is journaled (D2;
``CommitPipeline._retain_then_journal``), else the save fails and changes nothing.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..checks import check_count
from ..errors import InvalidReference, StaleAttempt, UnsafeRecovery
from ..pool.refs import RecordSetRef
from . import rules_consumers
from .checks import check_id as _check_id
from .checks import digest as _digest
from .checks import ref_dict as _ref_dict
from .checks import ref_tuple as _ref_tuple
from .leases import QueueLeases
from .pipeline import _Released
from .tasks import RefTuple


def _common_release(a: _Released, b: _Released) -> _Released:
    """Positions released in both ``a`` and ``b`` (after a save, history stays released
    only if the new state acknowledges it too: a rewind made the rest needed again)."""
    cursor = min(a[0], b[0])
    sparse = {p for p in a[1] if p < b[0] or p in b[1]}
    sparse |= {p for p in b[1] if p < a[0]}
    return cursor, frozenset(p for p in sparse if p >= cursor)


@dataclasses.dataclass
class _Save:
    """A consumer save, checked but not yet applied: its transaction, the references it
    makes the queue retain, and its idempotency digest."""

    txn: dict[str, Any]
    refs: list[RecordSetRef]
    digest: str


class QueueConsumers(QueueLeases):
    """Consumer tokens, saves (acknowledgements, progress, rewinds) and their views."""

    def open_consumer(self, consumer_id: str, *, exclusive_owner: str,
                      takeover: bool = False) -> str:
        """Become the consumer's one owner: returns its token.  ``UnsafeRecovery`` while
        another owner has it open (close it first, or recover the queue if that owner is
        gone).  ``exclusive_owner`` says, in prose, why this caller is the only one.

        ``takeover=True`` (ours, like ``Coordinator(takeover=True)``): the caller's
        successor role, e.g. a trainer restarted after its predecessor died (in another
        process than this coordinator's, so no recovery revoked its token), replaces the
        current owner.  That owner's token is fenced: its every later save, plan, ready
        or close is ``StaleAttempt``, so a predecessor that is in fact still alive cannot
        interleave its writes with the successor's."""
        self._check_process()
        _check_id("consumer_id", consumer_id)
        _check_id("exclusive_owner", exclusive_owner)
        if not isinstance(takeover, bool):
            raise TypeError(f"takeover must be a bool, got {type(takeover).__name__}")
        with self._mutex:
            self._check_usable()
            held = self._consumer_owners.get(consumer_id)
            if held is not None and not takeover:
                raise UnsafeRecovery(
                    f"consumer {consumer_id!r} of queue {self.owner} is open (owner "
                    f"{held[1]!r}); a consumer has one owner at a time: close it with "
                    "close_consumer(consumer_id, token), open it with takeover=True if that "
                    "owner is gone (its token is fenced), or recover the queue")
            token = os.urandom(32).hex()
            self._consumer_owners[consumer_id] = (token, exclusive_owner)
        return token

    def close_consumer(self, consumer_id: str, token: str) -> None:
        """Give the consumer up (its saved state stays).  ``StaleAttempt`` if ``token`` is
        not its current token."""
        self._check_process()
        with self._mutex:
            self._check_usable()
            self._check_token(consumer_id, token)
            del self._consumer_owners[consumer_id]

    def _check_token(self, consumer_id: str, token: object) -> None:
        """Mutex held: ``token`` is the consumer's current token."""
        _check_id("consumer_id", consumer_id)
        if not isinstance(token, str):
            raise TypeError(f"token must be the str open_consumer returned, got "
                            f"{type(token).__name__}")
        held = self._consumer_owners.get(consumer_id)
        if held is None or not hmac.compare_digest(held[0], token):
            raise StaleAttempt(
                f"consumer {consumer_id!r} token is not current (the consumer was closed, "
                "taken over by another owner, or this coordinator was recovered since it "
                "was opened): open_consumer again")

    def save_consumer_state(self, consumer_id: str, *, token: str, request_id: str,
                            state_ref: RecordSetRef, fetch_cursor: int,
                            processed_cursor: int,
                            progress_ref: RecordSetRef | None = None) -> dict[str, Any]:
        """Durably record how far the consumer fetched and processed, its state, and
        (optionally) its progress record: one ``json.v1`` record ``{"version": 1,
        "processed_positions": [...], "finished_batches": [...]}`` of positions processed
        past ``processed_cursor`` and batches all ranks finished reading.  For the
        designated consumer the processed positions release their results, and finished
        batches their plan and ready data, at the next ``collect_garbage``.

        A save may rewind (a lower cursor, fewer positions or batches, as when restoring a
        checkpoint): history that was released must still be retained by someone else (a
        checkpoint's dependencies, an application owner); it is checked (every byte) and
        retained by the queue again before the save is journaled, else the save fails
        (``InvalidReference``/``CorruptData``) and changes nothing.  A retry with the same
        ``request_id`` and content returns the original reply; other content raises
        ``IdempotencyConflict``."""
        self._check_process()
        _check_id("request_id", request_id)
        save = self._prepare_save(consumer_id, state_ref, fetch_cursor, processed_cursor,
                                  progress_ref)
        save.txn["req"] = request_id

        def replay() -> dict[str, Any] | None:
            known = rules_consumers.known_save(self.state, consumer_id, request_id,
                                               save.digest)
            return None if known is None else self._consumer_view(*known)

        done = self._commit_save(consumer_id, token, save, replay, lambda: save.txn)
        if done is not None:
            return done
        c = self.state.consumers[consumer_id]
        return self._consumer_view(c.fetch, c.processed, c.state, c.progress)

    def load_consumer_state(self, consumer_id: str) -> dict[str, Any] | None:
        """The consumer's last saved state (None if it never saved one)."""
        self._check_process()
        _check_id("consumer_id", consumer_id)
        with self._mutex:
            c = self.state.consumers.get(consumer_id)
            if c is None:
                return None
            return self._consumer_view(c.fetch, c.processed, c.state, c.progress)

    def _consumer_view(self, fetch: int, processed: int, state: RefTuple | None,
                       progress: RefTuple | None) -> dict[str, Any]:
        out: dict[str, Any] = {"version": 1, "fetch_cursor": fetch,
                               "processed_cursor": processed,
                               "state_ref": _ref_dict(self._to_ref(state))}
        if progress is not None:
            out["progress_ref"] = _ref_dict(self._to_ref(progress))
        return out

    def _prepare_save(self, consumer_id: str, state_ref: object, fetch: object,
                      processed: object, progress_ref: object) -> _Save:
        """Everything of a consumer save that needs no queue state: argument checks and
        the progress record (read through the store: checked, parsed as JSON)."""
        _check_id("consumer_id", consumer_id)
        if state_ref is None:
            raise InvalidReference("state_ref is required: publish the consumer's state and "
                                   "pass its RecordSetRef")
        state = self._check_ref(state_ref, "state_ref")
        progress = None if progress_ref is None else self._check_ref(progress_ref,
                                                                      "progress_ref")
        check_count("fetch_cursor", fetch)
        check_count("processed_cursor", processed)
        if processed > fetch:  # type: ignore[operator]
            raise ValueError(f"processed_cursor {processed} cannot pass fetch_cursor {fetch}")
        sparse, finished = ((), ()) if progress is None else self._read_progress(progress)
        refs = [state] + ([progress] if progress is not None else [])
        txn = {"t": "cons_save", "consumer": consumer_id, "req": None, "fetch": fetch,
               "processed": processed, "state": list(_ref_tuple(state)),
               "progress": list(_ref_tuple(progress)) if progress else None,
               "sparse": list(sparse), "finished": list(finished)}
        digest = _digest([consumer_id, txn["state"], txn["progress"], fetch, processed])
        txn["digest"] = digest
        return _Save(txn, refs, digest)

    def _read_progress(self, ref: RecordSetRef) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """A progress record's positions and batches: one ``json.v1`` record, version 1,
        unique entries (its content is JSON, never unpickled)."""
        where = f"progress_ref (consumer progress record {ref.path} offset {ref.offset})"
        records = list(self.store.read(ref))
        if len(records) != 1 or records[0].codec != "json.v1":
            raise InvalidReference(f"{where} must hold exactly one json.v1 record "
                                   "{version: 1, processed_positions, finished_batches}")
        try:
            value = json.loads(bytes(records[0].payload))
        except ValueError as e:
            raise InvalidReference(f"{where} is not valid JSON: {e}") from None
        if not isinstance(value, dict) or value.get("version") != 1:
            raise InvalidReference(f"{where} must be a JSON object with version 1")
        positions = value.get("processed_positions", [])
        batches = value.get("finished_batches", [])
        if not isinstance(positions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 2**63
                for p in positions):
            raise InvalidReference(f"{where}: processed_positions must be a list of commit "
                                   "positions")
        if not isinstance(batches, list) or not all(
                isinstance(b, str) and b for b in batches):
            raise InvalidReference(f"{where}: finished_batches must be a list of batch ids")
        if len(set(positions)) != len(positions) or len(set(batches)) != len(batches):
            raise InvalidReference(f"{where} lists a position or a batch twice")
        return tuple(sorted(positions)), tuple(batches)

    def _unrooted(self, refs: Iterable[RefTuple]) -> list[RecordSetRef]:
        """Mutex held: those of ``refs`` the queue does not root now (a collection may
        have dropped them since they were acknowledged)."""
        out = [self._to_ref(t) for t in dict.fromkeys(refs) if (t[0], t[1]) not in self._rooted]
        return [r for r in out if r is not None]

    def _commit_save(self, consumer_id: str, token: str, save: _Save,
                     replay: Callable[[], Any], make_txn: Callable[[], dict[str, Any]],
                     extra: Sequence[RecordSetRef] = ()) -> Any:
        """Every consumer save (``save_consumer_state``, ``batch_ready``): token, retry,
        checks, a rewind's history, then the journal."""

        def step(final: bool) -> tuple[str, Any]:
            self._check_token(consumer_id, token)
            done = replay()
            if done is not None:
                return "done", done
            again = self._unrooted(rules_consumers.consumer_save(
                self.state, consumer_id, save.txn, designated=self.consumer_id,
                durable_commits=self._durable_commits))
            if again or not final:
                return "need", again
            seq = self._enqueue(make_txn())
            if consumer_id == self.consumer_id:
                self._released = _common_release(self._released, rules_consumers.acknowledged(
                    save.txn["processed"], save.txn["sparse"], self.state.checkpoint_floor()))
            return "seq", seq

        return self._retain_then_journal([*save.refs, *extra], step)
