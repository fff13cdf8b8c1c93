"""The backlog: the accepted groups not yet in a batch, found by scanning the queue's
commit log from the scan cursor.  A collection commit the scan meets takes its groups
out of the backlog, so a group is planned in at most one batch (RL2), whatever failed
or restarted since; a group that can never be trained is quarantined, not retried.
A batch's selection is composed from it by the ``EnvironmentMix``: each environment's
quota, oldest weight version first, then FIFO."""

from __future__ import annotations

from typing import Any

from ..data_source import PROMPT_PREFIX
from ..environments import EnvironmentMix, MixState
from .collection import Collections
from .entries import Accepted
from .groups import PAGE, DecodedGroups, Untrainable
from .records import COLLECTION_PREFIX
from .state import BuilderState


class Backlog:
    """The scan of one builder: it adds to ``state``'s backlog and quarantine, takes
    decoded groups from ``decoded`` and recognises the builder's own collections in
    ``collections``."""

    def __init__(self, coordinator: Any, mix: EnvironmentMix, state: BuilderState,
                 decoded: DecodedGroups, collections: Collections) -> None:
        self.coord = coordinator
        self.mix = mix
        self.state = state
        self.decoded = decoded
        self.collections = collections

    def scan(self, until: int | None = None) -> None:
        """Add the accepted groups committed since the scan cursor to the backlog (up to
        position ``until`` exclusive, else to the end of the durable log).

        A group that can never be trained (its stored bytes are corrupt or of another
        schema, or it is not ready) is **quarantined**, not retried: skipped with its
        reason in ``quarantined()`` (and the state, saved with the next batch), so the
        groups after it flow.  The next ``finish_batch`` acknowledges its position with
        the batch's (it will never train; else the processed cursor would stop there for
        good).  A group of an environment the mix does not configure still raises: that
        is this builder's configuration to fix, not the group's fault."""
        while until is None or self.state.scan_cursor < until:
            limit = PAGE if until is None else min(PAGE, until - self.state.scan_cursor)
            page = self.coord.read_commits(self.state.scan_cursor, limit)
            for receipt in page.commits:
                if receipt.task_id.startswith(PROMPT_PREFIX):
                    try:
                        self.state.backlog.append(self.decoded.accepted(receipt))
                    except Untrainable as e:
                        self.state.quarantined.append({
                            "position": receipt.position, "task_id": receipt.task_id,
                            "commit_id": receipt.commit_id, "reason": str(e)})
                elif receipt.task_id.startswith(COLLECTION_PREFIX):
                    # RL2: a collected group belongs to that collection's batch from now
                    # on, ready or not (a later rollout never selects it again)
                    # (by commit id: restored groups' positions are not this queue's)
                    taken = {e.commit_id for e in self.collections.collected(receipt)[0]}
                    self.collections.own.pop(receipt.commit_id, None)
                    self.state.backlog = [e for e in self.state.backlog
                                          if e.commit_id not in taken]
                    if self.decoded.kept:  # kept for a build: another builder's collection
                        self.decoded.forget(taken)
            if page.cursor == self.state.scan_cursor:
                if until is not None:
                    raise RuntimeError(f"commit {until - 1} is not durable yet")
                break
            self.state.scan_cursor = page.cursor
        if self.decoded.ahead:
            self.decoded.drop_passed()

    def counts(self) -> dict[str, int]:
        """Accepted groups in the backlog per environment (as scanned so far)."""
        counts = {env: 0 for env in self.mix.environments}
        for e in self.state.backlog:
            counts[e.environment] += 1
        return counts

    def select(self) -> tuple[list[Accepted], MixState] | None:
        """The next batch's groups in selection order and the mix state after it, or
        None while an environment's quota is not filled."""
        composition, after = self.mix.compose(self.state.mix_state, self.counts())
        if any(composition.fresh.values()):
            return None  # an environment's quota is not filled yet
        chosen: list[Accepted] = []
        for env in self.mix.environments:
            mine = sorted((e for e in self.state.backlog if e.environment == env),
                          key=Accepted.order)
            chosen += mine[:composition.from_backlog[env]]
        chosen.sort(key=Accepted.order)
        return chosen, after


__all__ = ["Backlog"]
