"""Names derived from a queue's identity: attempt ids, lease tokens, receipt ids.

A derived name is a SHA-256 of ``json.dumps([run, namespace, queue, *parts])``: the same
in every process and after recovery, distinct across queues and runs.  A lease's
``attempt_id`` names its task and generation (generations are never reused: grants are
journaled); its ``token`` binds the attempt, the worker and the granting epoch, so a
lease edited by hand is not current (a checksum, not a secret).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..protocol import Lease

_MEMO_SIZE = 1 << 16  # derived attempt ids and tokens remembered (see QueueNames.derived)


class QueueNames:
    """The derived names of one queue (run, namespace, queue id)."""

    __slots__ = ("run_id", "namespace", "queue_id", "owner", "_head", "_memo")

    def __init__(self, run_id: str, namespace: str, queue_id: str) -> None:
        self.run_id = run_id
        self.namespace = namespace
        self.queue_id = queue_id
        self.owner = f"queue:{namespace}/{queue_id}"  # the queue's owner in the catalog
        # the constant head of every derived name's hashed text (see name)
        self._head = json.dumps([run_id, namespace, queue_id], separators=(",", ":"))[:-1] + ","
        self._memo: dict[tuple[Any, ...], str] = {}

    def name(self, *parts: Any) -> str:
        """The name derived from ``parts`` (64 hex digits).  The hashed text is
        ``json.dumps([run, namespace, queue, *parts])``; its constant head is encoded
        once, which gives the same text."""
        key = self._head + json.dumps(parts, separators=(",", ":"))[1:]
        return hashlib.sha256(key.encode()).hexdigest()

    def derived(self, parts: tuple[Any, ...], size: int) -> str:
        """``name(*parts)[:size]``, remembered: every lease check derives its attempt id
        and token again, and hashing them was a visible part of a completion's cost.  The
        memo only saves the hashing (the values are pure functions of ``parts``); it is
        bounded by starting afresh when full."""
        got = self._memo.get(parts)
        if got is None:
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            got = self._memo[parts] = self.name(*parts)[:size]
        return got

    def attempt_id(self, task_id: str, generation: int) -> str:
        # generations are never reused (lease grants are journaled), so neither is this
        return self.derived(("attempt", task_id, generation), 32)

    def token(self, attempt_id: str, worker_id: str, epoch: int) -> str:
        # binds the lease's fields: a lease edited by hand (another worker, another epoch)
        # is not current; it is a checksum, not a secret
        return self.derived(("lease", attempt_id, worker_id, epoch), 64)

    def lease(self, task_id: str, generation: int, worker_id: str, epoch: int) -> Lease:
        """The lease of ``task_id``'s attempt ``generation`` granted to ``worker_id`` by
        coordinator ``epoch``: every field derived, so equal grants give equal leases."""
        attempt_id = self.attempt_id(task_id, generation)
        return Lease(self.run_id, self.queue_id, task_id, attempt_id, generation, str(epoch),
                     self.token(attempt_id, worker_id, epoch), worker_id)
