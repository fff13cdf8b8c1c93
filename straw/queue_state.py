"""The queue's in-memory state, at its module path of old: it lives in ``straw.queue.state``."""

from __future__ import annotations

from .queue.state import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LEASED,
    PENDING,
    TASK_ROW_FIELDS,
    TERMINAL,
    Batch,
    Checkpoint,
    CommitLog,
    CommitRecord,
    Consumer,
    QueueState,
    RefTuple,
    Task,
    TaskTable,
    TieredDict,
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
