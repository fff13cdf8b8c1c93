"""Queue ids and their directory names, at their module path of old: they live in
``straw.queue.ids``."""

from __future__ import annotations

from .queue.ids import (
    MAX_QUEUE_ID_CHARS,
    check_queue_id,
    queue_dir_name,
)

__all__ = [
    "MAX_QUEUE_ID_CHARS",
    "check_queue_id",
    "queue_dir_name",
]
