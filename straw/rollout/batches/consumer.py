"""The builder's consumer on the queue: opened with the exclusive owner's token (a
``takeover`` fences a dead predecessor's), its saved state and progress read back, and
the state saved, with a batch's ready record when there is one, as the consumer's state
(in the stored form) and progress."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from straw.refs import Publication, Record, RecordSetRef

from .entries import STORED_VERSION, Accepted, backlog_columns, backlog_of_columns
from .records import canonical, digest, json_record, read_json
from .state import STATE_VERSION, BuilderState, empty_state


class BuilderConsumer:
    """The queue's consumer ``coordinator.consumer_id``, held by one builder at a time.

    ``takeover=True``: this builder succeeds one whose process died holding the
    consumer (a trainer apart from the controller: no recovery revoked its token); the
    old token is fenced, so a predecessor still alive can write nothing more."""

    def __init__(self, coordinator: Any, store: Any, *, exclusive_owner: str,
                 takeover: bool) -> None:
        self.coord = coordinator
        self.store = store
        self.id = coordinator.consumer_id
        open_args = {"takeover": True} if takeover else {}
        self.token = coordinator.open_consumer(self.id, exclusive_owner=exclusive_owner,
                                               **open_args)

    def load_saved(self) -> tuple[dict[str, Any], list[str]]:
        """The saved builder state and the finished batches of the saved progress."""
        view = self.coord.load_consumer_state(self.id)
        if view is None:
            return empty_state(), []
        state = read_json(self.store, RecordSetRef.from_dict(view["state_ref"]),
                          "builder state")
        if isinstance(state, dict) and state.get("version") == STORED_VERSION:
            # the stored form: its backlog parsed into entries at once (no dicts between)
            state = {**state, "version": STATE_VERSION,
                     "backlog": backlog_of_columns(state.get("backlog"))}
        progress: list[str] = []
        if view.get("progress_ref"):
            value = read_json(self.store, RecordSetRef.from_dict(view["progress_ref"]),
                              "builder progress")
            if isinstance(value, dict) and isinstance(value.get("finished_batches"), list):
                progress = [str(b) for b in value["finished_batches"]]
        return state, progress

    def publish_state(self, state: Mapping[str, Any], backlog: Sequence[Accepted],
                      finished: Sequence[str], ready: Publication | None = None,
                      ready_id: str = "") -> tuple[list[RecordSetRef], str]:
        """The consumer state and progress records (the progress, listing ``finished``,
        depends on the state), after ``ready`` (a batch's ready record, ``ready_id``
        naming its content) when given: ``[ready_ref,] state_ref, progress_ref``, in ONE
        durable write (one sync for all of them: this runs for every ready and finished
        batch), and the state's digest.  The state is encoded once: its record's payload
        and its digest are the same canonical bytes."""
        # the stored form (STORED_VERSION): the backlog as columns, from its entries
        body = {**state, "version": STORED_VERSION, "backlog": backlog_columns(backlog)}
        encoded = canonical(body)
        state_digest = hashlib.sha256(encoded).hexdigest()[:32]  # = digest(body)
        progress = {"version": 1, "processed_positions": body["processed_positions"],
                    "finished_batches": list(finished)}
        before = [] if ready is None else [ready]
        pubs = [*before, Publication([Record("builder-state", encoded, "json.v1", {})]),
                Publication([json_record("progress", progress)], dependencies=[len(before)])]
        prefix = "builder-state" if ready is None else f"ready:{ready_id}"
        refs = self.store.publish_many(
            pubs, submission_id=f"{prefix}:{digest([state_digest, progress])}")
        return refs, state_digest

    def save(self, state: BuilderState, request_id: str | None) -> dict[str, Any]:
        """Publish and save ``state`` as the consumer's.  ``request_id`` None:
        ``restore:<the state's digest>``."""
        fields = state.fields()
        (state_ref, progress_ref), state_digest = self.publish_state(
            fields, state.backlog, state.finished)
        return self.coord.save_consumer_state(
            self.id, token=self.token,
            request_id=f"restore:{state_digest}" if request_id is None else request_id,
            state_ref=state_ref, fetch_cursor=fields["fetch_cursor"],
            processed_cursor=fields["processed_cursor"], progress_ref=progress_ref)

    def close(self) -> None:
        """Give up the consumer."""
        self.coord.close_consumer(self.id, self.token)


__all__ = ["BuilderConsumer"]
