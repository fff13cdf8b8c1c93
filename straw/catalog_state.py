"""The old path of ``straw.pool.catalog.state``: the catalog's pure state."""

from __future__ import annotations

from .pool.catalog.state import (
    CATALOG_VERSION,
    FREEING_OPS,
    LEGACY_RUN,
    CatalogState,
    Extent,
    OwnerKey,
    PackInfo,
    freeing_bytes,
    run_of,
    run_prefix,
)

__all__ = ["CATALOG_VERSION", "CatalogState", "Extent", "FREEING_OPS", "LEGACY_RUN", "OwnerKey",
           "PackInfo", "freeing_bytes", "run_of", "run_prefix"]
