"""The ``tensor.v1`` record format: its constants and the check of its metadata, shared
by the tensors package (above the store) and the store's ``read_tensor_range`` (layers
look down only, so this module imports nothing above ``straw.errors``).

Record layout (``tensor.v1``)::

    payload   the tensor's bytes, C order, little-endian, written straight from the
              tensor's own memory (``writev`` of a view: no copy for a contiguous CPU
              tensor; a non-contiguous or CUDA tensor is made contiguous on the CPU first,
              autograd history is dropped)
    metadata  {"dtype": name, "shape": [...], "source": "torch"|"numpy", "kind": name,
               "chunk_bytes": C, "chunks": [hex, ...]}   the xxh3-128 of every C-byte
              chunk of the payload in order (the last chunk may be shorter), 32 hex digits
              each (an earlier straw's records concatenate them in one str: still read);
              "kind" (the tensor's name, or null; absent in records of an earlier straw,
              whose record id was the name) is carried, not checked
    record id "<record_prefix or submission_id>:<name>" (straw-queue's)

``CHUNK_BYTES`` is 256 KiB: a one-row read of a float32 [8192, 1024] tensor (4 KiB rows)
reads and verifies one 256 KiB chunk, and a 32 MiB tensor carries 128 checksums (4 KiB of
metadata).  The chunk list lives in the publication's manifest, which the reader
authenticates; ``load()`` checks it rather than the record's whole-payload checksum (the
same hashing work, done chunk by chunk while the bytes are in the CPU cache).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import UnsupportedSchema

CODEC = "tensor.v1"
CHUNK_BYTES = 256 * 1024
DTYPES: dict[str, int] = {
    "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
    "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1,
}
SOURCES = ("torch", "numpy")
MAX_DIMS = 64
_HEX = 32  # hex digits per chunk checksum


def checksum_list(hex_digests: str) -> list[str]:
    """The metadata's ``chunks``: one hex checksum per chunk, in order (as straw-queue
    lists its per-chunk digests, so ``len(metadata["chunks"])`` counts the chunks)."""
    return [hex_digests[i:i + _HEX] for i in range(0, len(hex_digests), _HEX)]


def _check_meta(meta: Mapping[str, Any], length: int, where: str) -> tuple[str, tuple[int, ...],
                                                                          str, int, str]:
    """The checked ``(dtype, shape, source, chunk_bytes, chunks)`` of a record's metadata;
    ``chunks`` as one string of concatenated hex checksums, whether the record lists them
    (this straw) or concatenates them (records of an earlier straw)."""
    try:
        dtype, shape, source = meta["dtype"], meta["shape"], meta["source"]
        chunk_bytes, chunks = meta["chunk_bytes"], meta["chunks"]
    except (KeyError, TypeError):
        raise UnsupportedSchema(f"{where}: tensor.v1 metadata lacks dtype/shape/source/"
                                "chunk_bytes/chunks") from None
    if not isinstance(dtype, str) or dtype not in DTYPES:  # (a list would be unhashable)
        raise UnsupportedSchema(f"{where}: tensor dtype {dtype!r} is unknown to this straw "
                                f"(knows {', '.join(DTYPES)})")
    if not isinstance(source, str) or source not in SOURCES:
        raise UnsupportedSchema(f"{where}: tensor source {source!r} is unknown")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape)):
        raise UnsupportedSchema(f"{where}: tensor shape {shape!r} is not a list of sizes")
    if isinstance(chunks, list) and all(isinstance(c, str) and len(c) == _HEX for c in chunks):
        chunks = "".join(chunks)  # one checksum per chunk (straw-queue's shape)
    if not isinstance(chunk_bytes, int) or chunk_bytes <= 0 or not isinstance(chunks, str):
        raise UnsupportedSchema(f"{where}: bad chunk_bytes/chunks in tensor metadata")
    if math.prod(shape) * DTYPES[dtype] != length:
        raise UnsupportedSchema(f"{where}: shape {shape} of {dtype} does not make the "
                                f"{length} payload bytes")
    if len(chunks) != _HEX * -(-length // chunk_bytes):
        raise UnsupportedSchema(f"{where}: {len(chunks) // _HEX} chunk checksums for "
                                f"{length} bytes in chunks of {chunk_bytes}")
    return dtype, tuple(shape), source, chunk_bytes, chunks


def check_expected(dtype: str, shape: tuple[int, ...], length: int,
                   expected: Mapping[str, Any] | None, where: str) -> None:
    """straw-queue's ``expected`` binding (``{"dtype", "shape", "length"}``, any subset):
    each given field must be the record's, else ``CorruptData``, before any payload is
    read."""
    from ..errors import CorruptData

    if expected is None:
        return
    if not isinstance(expected, Mapping):
        raise TypeError(f"expected must be a dict of dtype/shape/length, got "
                        f"{type(expected).__name__}")
    unknown = set(expected) - {"dtype", "shape", "length"}
    if unknown:
        raise ValueError(f"expected has unknown keys {sorted(unknown)}; use dtype, shape, "
                         "length")
    got = {"dtype": dtype, "shape": list(shape), "length": length}
    for k, v in expected.items():
        if (list(v) if k == "shape" and isinstance(v, (list, tuple)) else v) != got[k]:
            raise CorruptData(f"{where}: expected {k} {v!r}, the record holds {got[k]!r}")
