"""Reads of publications: every byte returned is checked against the reference (D6).

``ReadSession`` is the contract (straw-queue's read-session calls); it checks each
reference and delegates, one collaborator per concern, each built on those below it::

    ReadSession     session.py        the calls; the process check; the registry that
                                      lets a collection reach every session
    PoolReferences  references.py     which references are followed: this run's, by
                                      their canonical pack path inside the pool
    ExtentReader    extent_reader.py  manifests, whole extents read and hashed in one
                                      pass, frame headers in bulk
    Visibility      visibility.py     missing bytes: another client's lag (bounded
                                      retries) or loss (a final pack fails at once)
    PackCache       cache.py          open descriptors and checked manifests; reclaimed
                                      packs let go (in this process, and swept)
    (functions)     extents.py        what a checked extent is; reference-vs-extent checks
                    buffers.py        payload ``bytes`` filled in place, scratch buffers
                    ranges.py         byte ranges checked against chunk checksums

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
