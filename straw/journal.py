"""The old path of the queue journal, now ``straw.durable``: the writer
(``straw.durable.journal``), its files and records (``straw.durable.segments``) and
recovery (``straw.durable.recovery``)."""

from __future__ import annotations

from .durable.journal import Journal
from .durable.recovery import recover
from .durable.segments import (
    CONFIRM_LEN,
    DEFAULT_RESERVE,
    DEFAULT_SEGMENT_TARGET,
    JOURNAL_VERSION,
    REC_BATCH,
    REC_CONFIRM,
    REC_ROTATED,
    REC_SEGMENT,
    REC_TXN,
    ROTATED_LEN,
    Cutoff,
    Position,
    Recovered,
    segment_name,
    snapshot_name,
)

__all__ = ["CONFIRM_LEN", "DEFAULT_RESERVE", "DEFAULT_SEGMENT_TARGET", "JOURNAL_VERSION",
           "REC_BATCH", "REC_CONFIRM", "REC_ROTATED", "REC_SEGMENT", "REC_TXN", "ROTATED_LEN",
           "Cutoff", "Journal", "Position", "Recovered", "recover", "segment_name", "snapshot_name"]
