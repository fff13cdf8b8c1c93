"""The old path of ``straw.pool.catalog.read``: reading the catalog without its lock."""

from __future__ import annotations

from .pool.catalog.read import (
    CATALOG_NAME,
    decode_ops,
    frame_tag,
    load_snapshot,
    read_state,
    read_to_clean_end,
    state_upto,
)

__all__ = ["CATALOG_NAME", "decode_ops", "frame_tag", "load_snapshot", "read_state",
           "read_to_clean_end", "state_upto"]
