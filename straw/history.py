"""A queue's history segments, at their module path of old: they live in ``straw.queue.history``."""

from __future__ import annotations

from .queue.history import (
    BLOCK_ENTRIES,
    BLOOM_BITS_PER_KEY,
    BLOOM_K,
    HISTORY_VERSION,
    KEYED,
    MISSING,
    Delta,
    History,
    Segment,
    row_usage,
    segment_epoch,
    write_segment,
)

__all__ = [
    "HISTORY_VERSION",
    "BLOCK_ENTRIES",
    "BLOOM_BITS_PER_KEY",
    "BLOOM_K",
    "KEYED",
    "MISSING",
    "segment_epoch",
    "row_usage",
    "Delta",
    "Segment",
    "write_segment",
    "History",
]
