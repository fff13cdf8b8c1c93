"""Reads of publications: every byte returned is checked against the reference (D6).

``ReadSession`` (``session.py``) is the contract: straw-queue's read-session calls, each
checking the reference before it reads and the bytes before it returns them.  Its
collaborators hold one concern each.  ``ranges.py`` reads byte ranges of one record
against chunk checksums.

This package is core: it imports only the modules beneath it (``straw.fs``, framing,
packs, references), never ``straw.rollout``, ``straw.cli`` or ``straw.qualify``.
"""

from .buffers import fresh_bytes
from .extents import MANIFEST_CODEC, ExtentInfo, envelope_dict, manifest_dict
from .ranges import checked_span, read_range, tensor_chunks
from .session import ReadSession, drop_reclaimed
from .visibility import PackStatus, PackStatusFn

__all__ = [
    "MANIFEST_CODEC", "ExtentInfo", "PackStatus", "PackStatusFn", "ReadSession",
    "checked_span", "drop_reclaimed", "envelope_dict", "fresh_bytes", "manifest_dict",
    "read_range", "tensor_chunks",
]
