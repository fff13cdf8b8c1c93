"""straw-queue's queue marker, at its module path of old: it lives in ``straw.queue.marker``."""

from __future__ import annotations

from .queue.marker import (
    FORMAT,
    VERSION,
    QueueMarker,
    marker_rel,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "marker_rel",
    "QueueMarker",
]
