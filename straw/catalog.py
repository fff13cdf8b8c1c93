"""The old path of the ownership catalog, now ``straw.pool.catalog``."""

from __future__ import annotations

from .pool.catalog.catalog import Announcement, Catalog
from .pool.catalog.compaction import COMPACT_AFTER, COMPACT_RATIO
from .pool.catalog.log import RESERVE_FLOOR, RESERVE_STEP
from .pool.catalog.read import CATALOG_NAME, read_state
from .pool.catalog.state import CatalogState, Extent, OwnerKey, PackInfo, run_prefix

__all__ = ["CATALOG_NAME", "COMPACT_AFTER", "COMPACT_RATIO", "RESERVE_FLOOR", "RESERVE_STEP",
           "Announcement", "Catalog", "CatalogState", "Extent", "OwnerKey", "PackInfo",
           "read_state", "run_prefix"]
