"""The old path of ``straw.pool.catalog.snapshot``: the catalog's snapshot files."""

from __future__ import annotations

from .pool.catalog.snapshot import (
    HEAD_NAME,
    SNAP_PREFIX,
    decode_state,
    digest,
    encode_state,
    snapshot_gen,
    snapshot_name,
)

__all__ = ["HEAD_NAME", "SNAP_PREFIX", "decode_state", "digest", "encode_state", "snapshot_gen",
           "snapshot_name"]
