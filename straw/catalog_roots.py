"""The old path of ``straw.pool.catalog.roots``: compact sets of root extents."""

from __future__ import annotations

from .pool.catalog.roots import (
    OffsetSet,
    RootSet,
    SortedOffsets,
    le_u64,
)

__all__ = ["OffsetSet", "RootSet", "SortedOffsets", "le_u64"]
