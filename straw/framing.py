"""The old path of ``straw.durable.framing``: the same module under its old name.

``straw.framing is straw.durable.framing`` (an alias, not a copy), so a caller that
patches a name through this path (the crash campaigns' negative controls do) reaches the
code that uses it.  The names are also listed here, for
type checkers.
"""

from __future__ import annotations

import sys

from .durable import framing as _framing
from .durable.framing import (
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    KIND_CATALOG,
    KIND_EXTENT,
    KIND_HISTORY,
    KIND_JOURNAL,
    KIND_LOG,
    KIND_PACK_HEADER,
    KIND_SEAL,
    KIND_SNAPSHOT,
    KNOWN_KINDS,
    MAGIC,
    DamagedFrame,
    FrameHeader,
    ReadAt,
    ScannedFrame,
    ScanResult,
    TornFrame,
    decode_frame,
    decode_header,
    encode_frame,
    encode_header,
    hash_buffers,
    is_zero,
    read_at_fn,
    scan_frames,
)

__all__ = ["DamagedFrame", "FORMAT_VERSION", "FrameHeader", "HEADER", "HEADER_SIZE",
           "KIND_CATALOG", "KIND_EXTENT", "KIND_HISTORY", "KIND_JOURNAL", "KIND_LOG",
           "KIND_PACK_HEADER", "KIND_SEAL", "KIND_SNAPSHOT", "KNOWN_KINDS", "MAGIC", "ReadAt",
           "ScanResult", "ScannedFrame", "TornFrame", "decode_frame", "decode_header",
           "encode_frame", "encode_header", "hash_buffers", "is_zero", "read_at_fn", "scan_frames"]

sys.modules[__name__] = _framing
