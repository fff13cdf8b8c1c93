"""An isolated queue seeded from saved state: a new queue (its own namespace/queue id, in
the same pool and run) holding given pending tasks and a dataset cursor, and a builder
state whose backlog holds given accepted groups *by reference* (no payload copied).

ONE mechanism for every restore that must not touch its source: a checkpoint's exact
restore (a rollback, a branch), a salvage after a crash (``restore``), and the archive's
replay (round 2: an isolated queue seeded from archived groups).  RL6, a fork never
changes its source: everything here writes into the NEW queue and the new owner only.

``seed_isolated_queue`` does, in this order (each step durable before the next):

1. retain the accepted groups and the tasks' inputs under the branch's owner
   ``branch:<namespace>/<queue_id>`` (RL7: the shared payloads stay reachable while the
   branch needs them, whatever the source's queue collects);
2. open the new queue (``Coordinator(recover=False)``: an existing queue of that id is
   refused, so a branch starts once: ``BranchStarted``);
3. ONE ``submit_tasks`` transaction with the tasks (leased ones come back pending) and
   the dataset cursor as the producer state (RL1 holds in the new queue from its first
   transaction on);
4. return the builder state for ``BatchBuilder(coordinator, ..., state=...)``: the
   accepted groups marked ``restored`` (selected first, in the order given, never
   acknowledged on this queue: their positions are their ranks in that order), as
   ``Accepted`` entries, which the builder adopts as they are (turning 10,000 of them
   into dicts here, for the builder to parse back, was a tenth of a restore).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from straw import Coordinator, TaskSpec
from straw.coordinator import queue_dir
from straw.errors import UnsafeRecovery

from .batches.entries import Accepted
from .batches.state import empty_state
from .checkpoint_errors import BranchStarted
from .data_source import PRODUCER_ID
from .environments import MixState

BRANCH_OWNER_PREFIX = "branch:"


@dataclass
class IsolatedQueue:
    """The seeded queue: its coordinator (the caller closes it, or hands it to a
    ``RolloutController``), the builder state to restore (its backlog ``Accepted``
    entries: ``BatchBuilder(state=...)`` takes them, ``BatchBuilder.state()`` is its JSON
    form), and the owner retaining the restored payloads (``store.release(owner)`` when
    the branch is dropped)."""

    coordinator: Coordinator
    builder_state: dict[str, Any]
    owner: str


def branch_owner(namespace: str, queue_id: str) -> str:
    return f"{BRANCH_OWNER_PREFIX}{namespace}/{queue_id}"


def restored_backlog(accepted: Sequence[Accepted], start: int = 0) -> list[Accepted]:
    """``accepted`` as restored backlog entries: position = ``start`` + rank in the given
    order.  An entry in that form already (``checkpoint.saved_backlog`` builds a
    checkpoint's backlog so) is kept as it is: all its fields are what a new one would
    hold (building 10,000 again was a twentieth of a restore)."""
    return [e if e.restored and e.position == i else
            Accepted(i, e.commit_id, e.ref, e.environment, e.key, e.tokens, restored=True)
            for i, e in enumerate(accepted, start)]


def seed_isolated_queue(store: Any, *, namespace: str, queue_id: str,
                        tasks: Sequence[TaskSpec], producer_state: Mapping[str, Any] | None,
                        accepted: Sequence[Accepted], mix: MixState | None = None,
                        clock: Any = None, lease_seconds: float | None = None
                        ) -> IsolatedQueue:
    """Seed a new queue (module docstring).  ``tasks``: the pending prompt tasks (with
    their current inputs); ``producer_state``: the dataset producer's state (None: the
    cursor starts at the beginning); ``accepted``: groups to restore, in selection
    order; ``mix``: the builder's environment-mix state to start from."""
    if isinstance(tasks, TaskSpec) or not all(isinstance(t, TaskSpec) for t in tasks):
        raise TypeError("tasks must be a list of TaskSpec")
    if not all(isinstance(a, Accepted) for a in accepted):
        raise TypeError("accepted must be a list of builder.Accepted")
    ids = [c.commit_id for c in accepted]
    if len(set(ids)) != len(ids):
        raise ValueError("accepted names a group twice: each restored group is restored once")
    owner = branch_owner(namespace, queue_id)
    if store.fs.probe(queue_dir(store.root, store.run_id, namespace, queue_id)):
        # before retain: retain REPLACES an owner's roots, so retaining here would take the
        # running branch's payloads away from it (and the release below drop them)
        raise BranchStarted(f"queue {namespace}/{queue_id} exists: this branch was started "
                            "already; resolve the checkpoint selection again (a new "
                            "branch)")
    refs = [a.ref for a in accepted] + [t.input_ref for t in tasks if t.input_ref is not None]
    store.retain(owner, refs)  # RL7, before anything names them
    kwargs: dict[str, Any] = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
    try:
        coord = Coordinator(store, queue_id=queue_id, namespace=namespace, clock=clock,
                            recovery_spends_budget=False, **kwargs)  # as the controller's
    except UnsafeRecovery as e:  # the queue exists: this branch started before
        store.release(owner)
        raise BranchStarted(f"queue {namespace}/{queue_id} exists: this branch was started "
                            "already; resolve the checkpoint selection again (a new "
                            "branch)") from e
    try:
        coord.submit_tasks(f"seed:{namespace}/{queue_id}", list(tasks),
                           producer_id=PRODUCER_ID if producer_state is not None else None,
                           producer_state=producer_state)
    except BaseException:
        coord.close()
        raise
    state = {**empty_state(mix=mix), "backlog": restored_backlog(accepted)}
    return IsolatedQueue(coord, state, owner)


__all__ = ["IsolatedQueue", "seed_isolated_queue", "branch_owner", "restored_backlog",
           "BRANCH_OWNER_PREFIX"]
