"""The queue's in-memory state, at its module path of old: it lives in ``straw.queue``
(``state``: ``QueueState``; ``tasks``: the task table; ``commits``: the commit log and
tiered dicts; ``records``: consumers, batches, checkpoints)."""

from __future__ import annotations

from .queue.commits import CommitLog, CommitRecord, TieredDict
from .queue.records import Batch, Checkpoint, Consumer
from .queue.state import QueueState
from .queue.tasks import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LEASED,
    PENDING,
    TASK_ROW_FIELDS,
    TERMINAL,
    RefTuple,
    Task,
    TaskTable,
    bulk_objects,
    history_value,
    task_from_history,
)

__all__ = [
    "RefTuple",
    "PENDING",
    "LEASED",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TERMINAL",
    "Task",
    "CommitRecord",
    "TASK_ROW_FIELDS",
    "bulk_objects",
    "TaskTable",
    "history_value",
    "task_from_history",
    "TieredDict",
    "CommitLog",
    "Consumer",
    "Batch",
    "Checkpoint",
    "QueueState",
]
