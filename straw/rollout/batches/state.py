"""The builder state: scan and fetch cursors, processed positions, the count and newest
ids of the finished batches, quarantined groups, the backlog and the ``MixState``.  As
JSON (``BatchBuilder.state()``) it is what a checkpoint saves and ``state=`` restores;
its stored form (``STORED_VERSION``, ``straw.rollout.batches.entries``) is saved with
every ready and finished batch as the consumer's state.  Its size follows what is live,
not the run's length."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..environments import EnvironmentMix, MixState
from .entries import STORED_VERSION, Accepted, backlog_of_columns

STATE_VERSION = 2
# finished batch ids the state keeps (the newest): enough to recognise a retried
# finish_batch and to match a restored state against the queue's progress record
FINISHED_KEPT = 16


def empty_state(backlog: Sequence[Accepted] = (), mix: MixState | None = None
                ) -> dict[str, Any]:
    """A builder state (``BatchBuilder.state()``) of a queue nothing was read from yet,
    holding ``backlog`` (e.g. restored groups, ``straw.rollout.isolated``)."""
    return {"version": STATE_VERSION, "scan_cursor": 0, "fetch_cursor": 0,
            "processed_cursor": 0, "processed_positions": [], "finished_count": 0,
            "recent_finished": [], "quarantined": [],
            "backlog": [e.to_dict() for e in backlog], "mix": (mix or MixState()).to_dict()}


def read_stored_state(value: Any) -> dict[str, Any]:
    """A consumer-state record's JSON value as ``state()`` returns it (backlog entries as
    dicts): for code that reads the builder's saved state from the queue (a version 2
    record, or a version 1 one, is returned as it is)."""
    if isinstance(value, dict) and value.get("version") == STORED_VERSION:
        return {**value, "version": STATE_VERSION,
                "backlog": [e.to_dict() for e in backlog_of_columns(value.get("backlog"))]}
    return value  # type: ignore[no-any-return]


class BuilderState:
    """The builder state, adopted from ``value`` (``state()``'s form; a version 1 state,
    with every finished batch listed, is read too) and checked against ``mix``.
    ``progress``: the finished batches the queue's saved progress lists, in finishing
    order."""

    def __init__(self, value: Mapping[str, Any], progress: Sequence[str],
                 mix: EnvironmentMix) -> None:
        keys = set(empty_state())
        if isinstance(value, Mapping) and value.get("version") == 1 \
                and isinstance(value.get("finished_batches"), list):
            listed = [str(b) for b in value["finished_batches"]]
            value = {**{k: v for k, v in value.items() if k != "finished_batches"},
                     "version": STATE_VERSION, "finished_count": len(listed),
                     "recent_finished": listed[-FINISHED_KEPT:], "quarantined": []}
            progress = listed
        if not isinstance(value, Mapping) or set(value) != keys \
                or value.get("version") != STATE_VERSION:
            raise ValueError(f"a builder state is a mapping with version {STATE_VERSION} and "
                             f"keys {sorted(keys)} (BatchBuilder.state()), got "
                             f"{sorted(value) if isinstance(value, Mapping) else value!r}")
        self.scan_cursor = int(value["scan_cursor"])
        self.fetch = int(value["fetch_cursor"])
        self.processed = int(value["processed_cursor"])
        self.sparse = sorted(int(p) for p in value["processed_positions"])
        self.finished_count = int(value["finished_count"])
        self.recent = [str(b) for b in value["recent_finished"]][-FINISHED_KEPT:]
        # every finished batch, for the progress record: the queue releases a batch's
        # plan and ready data while its consumer's progress lists it (a list without it
        # would make them needed again), so that list is cumulative; the state keeps only
        # its count and newest ids, and the list is the saved progress's first
        # ``finished_count`` (a restored state whose newest ids are not there brings its
        # own, e.g. into another queue)
        prefix = list(progress[:self.finished_count])
        n = len(self.recent)
        self.finished = prefix if len(prefix) >= n and prefix[len(prefix) - n:] == \
            self.recent else list(self.recent)
        self.quarantined = [dict(q) for q in value["quarantined"]]
        # an entry may be an Accepted already (a restore hands over the groups it parsed
        # and retained, not to parse their references twice)
        self.backlog = [e if isinstance(e, Accepted) else Accepted.from_dict(e)
                        for e in value["backlog"]]
        missing = sorted({e.environment for e in self.backlog} - set(mix.environments))
        if missing:
            # at open, naming them: not a KeyError at the first next_batch
            raise ValueError(
                f"the restored backlog holds groups of environments {missing} that the "
                f"configured mix ({list(mix.environments)}) does not have: configure "
                "them (any weight) to train those groups, or restore another checkpoint")
        self.mix_state = MixState.from_dict(value["mix"])
        mix.quota(self.mix_state)  # checks its environments against the mix

    def fields(self) -> dict[str, Any]:
        """``state()`` without its backlog (the stored form encodes that apart)."""
        return {"version": STATE_VERSION, "scan_cursor": self.scan_cursor,
                "fetch_cursor": self.fetch, "processed_cursor": self.processed,
                "processed_positions": list(self.sparse),
                "finished_count": self.finished_count,
                "recent_finished": list(self.recent),
                "quarantined": [dict(q) for q in self.quarantined],
                "mix": self.mix_state.to_dict()}

    def is_saved(self, saved: Mapping[str, Any]) -> bool:
        """Whether this state is ``saved`` (the consumer's saved state) already: then it
        is durable as it is, nothing to save."""
        fields = self.fields()
        if {k: v for k, v in saved.items() if k != "backlog"} != fields:
            return False
        entries = list(saved.get("backlog", ()))
        if len(entries) != len(self.backlog):
            return False
        return all((e if isinstance(e, Accepted) else Accepted.from_dict(e)) == mine
                   for e, mine in zip(entries, self.backlog, strict=True))

    def finish(self, batch_id: str, input_positions: Sequence[int]) -> None:
        """Batch ``batch_id`` finished: its input positions, and the quarantined groups
        fetched so far (they never train), become processed (RL4)."""
        skipped = {q["position"] for q in self.quarantined if q["position"] < self.fetch}
        done = set(self.sparse) | {p for p in [*input_positions, *skipped]
                                   if p >= self.processed}
        cursor = self.processed
        while cursor in done:
            cursor += 1
        self.processed = cursor
        self.sparse = sorted(p for p in done if p >= cursor)
        self.finished.append(batch_id)
        self.finished_count += 1
        self.recent = [*self.recent, batch_id][-FINISHED_KEPT:]


__all__ = ["BuilderState", "STATE_VERSION", "FINISHED_KEPT", "empty_state",
           "read_stored_state"]
