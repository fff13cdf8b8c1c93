"""A queue's state from its journal: the latest snapshot plus the suffix (D9).

``replay`` is what recovery runs; ``read_state`` reads a queue's state without becoming
its coordinator (operator views).
"""

from __future__ import annotations

import os
from typing import Any

import msgpack

from ..durable import recovery as journal_recovery
from ..durable import segments as journal_segments
from ..fs import Filesystem
from .history import History
from .state import QueueState
from .tasks import bulk_objects


def replay(recovered: journal_segments.Recovered, fs: Filesystem | None = None,
           history_dir: str | None = None) -> QueueState:
    """The queue state of a recovered journal: its snapshot plus the suffix (D9); the
    history segments its snapshot names are in ``history_dir`` (checked present, read
    on demand)."""
    # snapshot and suffix: many long-lived objects at once (promoted if many)
    large = recovered.snapshot is not None and len(recovered.snapshot) >= 1 << 20

    def history(manifest: dict[str, Any]) -> History:
        if fs is None or history_dir is None:
            raise ValueError("this queue snapshot names history segments: pass the "
                             "filesystem and the queue's history directory to replay")
        return History.from_manifest(fs, history_dir, manifest)

    with bulk_objects(promote=large):
        if recovered.snapshot is not None:
            state = QueueState.from_snapshot(_unpack_snapshot(recovered.snapshot), history)
        else:
            state = QueueState()
        for txn in recovered.transactions:
            state.apply(msgpack.unpackb(txn, raw=False))
    return state


def read_state(fs: Filesystem, queue_dir: str) -> QueueState:
    """A queue's state read without becoming its coordinator: no epoch, no lock, nothing
    written (``journal.recover`` only fsyncs the newest segment).  For operator views
    (``straw inspect``); leases in it are whatever the journal last recorded."""
    return replay(journal_recovery.recover(fs, os.path.join(queue_dir, "journal")), fs,
                  os.path.join(queue_dir, "history"))


def _unpack_snapshot(data: bytes | memoryview) -> dict[str, Any]:
    with bulk_objects():  # see QueueState.from_snapshot
        return msgpack.unpackb(data, raw=False)  # type: ignore[no-any-return]
