"""Accepted groups decoded: a group's record 0 read with its captures lazy
(``lazy_group``), checked into a backlog entry (``read_accepted``; ``Untrainable`` for a
group that can never enter a batch), and ``DecodedGroups``, the groups the builder keeps
decoded between their scan and their build so that each is decoded once, under a token
budget that bounds the builder's memory whatever the backlog."""

from __future__ import annotations

import threading
from typing import Any

from straw.errors import CorruptData, UnsupportedSchema
from straw.protocol import CommitReceipt
from straw.refs import RecordSetRef
from straw.tensor import TensorRef

from ..codec import group_from_records
from ..data_source import PROMPT_PREFIX
from ..environments import EnvironmentMix
from ..replay_group import is_replay_group, read_replay_group
from ..samples import SampleGroup, Stage, classify
from ..scheduling import scheduling_key
from .entries import Accepted

PAGE = 256  # commits read from the log at a time
# token ids the builder keeps decoded between a group's scan and its build (the
# package docstring, "Memory"): a Sample holds its ids as a tuple of Python ints, at
# most about 40 bytes each, so this bounds the tables to about 20 MiB each
DECODED_TOKENS_KEPT = 1 << 19


class Untrainable(ValueError):
    """An accepted group that can never enter a batch (``Backlog.scan``)."""


def read_accepted(store: Any, mix: EnvironmentMix, receipt: CommitReceipt) -> Accepted:
    """The backlog entry of an accepted group's commit ``receipt`` (its record 0 read,
    no capture byte): what a builder scanning the log adds, and what a salvage reads
    from a dead run's log."""
    return accepted_of(mix, receipt, scanned_group(store, receipt))


def _where(receipt: CommitReceipt) -> str:
    return f"accepted group of task {receipt.task_id!r} (commit {receipt.position})"


def scanned_group(store: Any, receipt: CommitReceipt) -> SampleGroup:
    """The group of an accepted commit, decoded and checked (``Untrainable`` if its
    stored bytes are corrupt or of another schema)."""
    try:
        return lazy_group(store, receipt.result_ref)
    except (CorruptData, UnsupportedSchema) as e:
        raise Untrainable(f"{_where(receipt)}: {type(e).__name__}: {e}") from None


def accepted_of(mix: EnvironmentMix, receipt: CommitReceipt, group: SampleGroup
                ) -> Accepted:
    """The backlog entry of ``group``, accepted by ``receipt`` (``Untrainable`` if it is
    not ready)."""
    where = _where(receipt)
    if classify(group) is not Stage.READY:
        bad = next(i for i, s in enumerate(group.samples) if not s.finished)
        raise Untrainable(f"{where} is not ready: sample {bad} is "
                          f"{group.samples[bad].status.value} with reward "
                          f"{group.samples[bad].reward!r}; complete only groups whose "
                          "samples are all completed or truncated and scored")
    env = mix.environment_of(group)
    return Accepted(receipt.position, receipt.commit_id, receipt.result_ref, env,
                    scheduling_key(group), tuple(len(s.tokens) for s in group.samples))


def lazy_group(store: Any, ref: RecordSetRef) -> SampleGroup:
    """A group with its captures lazy: the manifest and record 0 only (of a replayed
    group, ``straw.rollout.replay_group``: record 0 of the archive chunks it names)."""
    manifest = store.checked_manifest(ref)
    if not manifest.record_refs:
        raise CorruptData(f"accepted group {ref!r} has no records")
    if is_replay_group(manifest):
        return read_replay_group(store, ref, manifest)
    head = store.read_record(manifest.record_refs[0])
    # record 0 alone: no capture tensor to bind (the pipeline's groups; skips a second
    # manifest look-up per group)
    tensors = TensorRef.from_record_set_many(store, ref) if len(manifest.record_refs) > 1 \
        else {}
    return group_from_records([head], tensors=tensors, lazy_tensors_over=0, store=store)


def _tokens(group: SampleGroup) -> int:
    return sum(len(s.tokens) for s in group.samples)


class DecodedGroups:
    """The accepted groups kept decoded for their build (commit id -> group), within
    ``DECODED_TOKENS_KEPT`` tokens; past that budget a group is read again at build.

    And the groups ``decode_ahead`` (another thread) decoded before the scan reached
    them: commit id -> (position, group, tokens), until the scan takes them; a table with
    its own lock, budget and read position in the log.  ``state``: the builder's state,
    whose scan cursor says what the scan passed."""

    def __init__(self, store: Any, mix: EnvironmentMix, state: Any) -> None:
        self.store = store
        self.mix = mix
        self._state = state
        self.kept: dict[str, SampleGroup] = {}
        self.kept_tokens = 0
        self.ahead_lock = threading.Lock()
        self.ahead: dict[str, tuple[int, SampleGroup, int]] = {}
        self.ahead_tokens = 0
        self.ahead_cursor = state.scan_cursor

    def accepted(self, receipt: CommitReceipt) -> Accepted:
        """The backlog entry of a scanned commit, its group decoded ahead or now."""
        with self.ahead_lock:
            ahead = self.ahead.pop(receipt.commit_id, None)
            if ahead is not None:
                self.ahead_tokens -= ahead[2]
        group = ahead[1] if ahead is not None else scanned_group(self.store, receipt)
        entry = accepted_of(self.mix, receipt, group)
        self.keep(entry.commit_id, group)
        return entry

    def keep(self, commit_id: str, group: SampleGroup) -> None:
        """Keep ``group`` decoded for its build, within the token budget."""
        tokens = _tokens(group)
        if self.kept_tokens + tokens <= DECODED_TOKENS_KEPT and commit_id not in self.kept:
            self.kept[commit_id] = group
            self.kept_tokens += tokens

    def forget(self, commit_ids: set[str]) -> None:
        """Drop the kept groups of ``commit_ids`` (they left the backlog)."""
        for c in commit_ids & self.kept.keys():
            group = self.kept.pop(c)
            self.kept_tokens -= _tokens(group)

    def group(self, e: Accepted) -> SampleGroup:
        """A selected group for the build: the scan's decoded one if kept, else read."""
        kept = self.kept.get(e.commit_id)
        return kept if kept is not None else lazy_group(self.store, e.ref)

    def decode_ahead(self, coord: Any) -> int:
        """Decode the accepted groups committed since the last call (``BatchBuilder.
        decode_ahead``); how many it decoded.  Reads only the queue's log and the pool,
        and writes only the ahead table."""
        with self.ahead_lock:
            cursor = max(self.ahead_cursor, self._state.scan_cursor)
        decoded = 0
        while True:
            page = coord.read_commits(cursor, PAGE)
            for receipt in page.commits:
                if not receipt.task_id.startswith(PROMPT_PREFIX):
                    continue
                with self.ahead_lock:
                    if self.ahead_tokens >= DECODED_TOKENS_KEPT:
                        self.ahead_cursor = receipt.position  # (not decoded yet)
                        return decoded  # the scan has enough to take for now
                try:
                    group = scanned_group(self.store, receipt)
                except Untrainable:
                    continue
                tokens = _tokens(group)
                with self.ahead_lock:
                    # (not if the scan passed it meanwhile: it decoded it itself)
                    if receipt.position >= self._state.scan_cursor:
                        self.ahead[receipt.commit_id] = (receipt.position, group, tokens)
                        self.ahead_tokens += tokens
                        decoded += 1
            if page.cursor == cursor:
                break
            cursor = page.cursor
        with self.ahead_lock:
            self.ahead_cursor = cursor
        return decoded

    def drop_passed(self) -> None:
        """Forget decoded-ahead groups the scan passed without taking (another
        builder's collection took them, or the scan raced ``decode_ahead``)."""
        with self.ahead_lock:
            passed = [c for c, (pos, _, _) in self.ahead.items()
                      if pos < self._state.scan_cursor]
            for c in passed:
                self.ahead_tokens -= self.ahead.pop(c)[2]


__all__ = ["Untrainable", "DecodedGroups", "DECODED_TOKENS_KEPT", "read_accepted",
           "scanned_group", "accepted_of", "lazy_group"]
