"""The ``tensor.v1`` record of one tensor: its bytes as a zero-copy view, its chunk
checksums, and the array an in-memory record holds (no store involved)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from ..checks import check_count, short_repr
from ..errors import CorruptData, UnsupportedDtype, UnsupportedSchema
from ..pool.records import Record, payload_view
from .buffers import _byte_view
from .format import CHUNK_BYTES, CODEC, DTYPES, _check_meta, checksum_list
from .frameworks import _is_torch_tensor, _np_dtype
from .threads import _executor, _split, _workers

# straw-queue 0.1.6's names for the limits its tensor helpers open a store with: a
# tensor's largest payload (our store's default record cap, enforced on request) and the
# copy buffer of one publication.  Ours read and publish in bounded chunks whatever the
# size; the names are kept for callers that pass them on to a store.
MAX_TENSOR_BYTES = 16 * 1024**3
MAX_PUBLICATION_BYTES = 16 * 1024**2

# ``CHUNK_BYTES`` (imported above) is the granularity of the records made from now on:
# ``_granularity`` reads it at each call, and ``straw.tensor.CHUNK_BYTES = n`` sets it.

_PARALLEL_MIN = 8 << 20  # publish: chunk checksums of this much data on several threads


def _tensor_bytes(value: object, where: str) -> tuple[np.ndarray, str, tuple[int, ...], str]:
    """(flat uint8 view of the bytes, dtype name, shape, source), without copying a
    contiguous little-endian CPU tensor."""
    if sys.byteorder != "little":
        raise UnsupportedSchema("tensor.v1 is little-endian; this host is big-endian")
    if _is_torch_tensor(value):
        torch = sys.modules["torch"]
        t = value.detach()  # type: ignore[attr-defined]
        if t.layout != torch.strided:
            raise TypeError(f"{where} is a {t.layout} torch tensor; pass a dense tensor "
                            "(.to_dense())")
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise _unsupported_dtype(where, name)
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.resolve_conj().resolve_neg().contiguous()
        if t.numel() == 0:
            flat = np.empty(0, dtype=np.uint8)
        else:
            flat = t.reshape(-1).view(torch.uint8).numpy()
        return flat, name, tuple(int(d) for d in t.shape), "torch"
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        name = a.dtype.name
        if name not in DTYPES or (a.dtype.kind == "V" and name != "bfloat16"):
            raise _unsupported_dtype(where, str(a.dtype))
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        return a.reshape(-1).view(np.uint8), name, tuple(a.shape), "numpy"
    raise TypeError(f"{where} is a {type(value).__name__}; publish a NumPy array or a torch "
                    "tensor (np.asarray(x) for Python numbers and lists)")


def _unsupported_dtype(where: str, name: str) -> UnsupportedDtype:
    # straw-queue's phrase first (its callers match it), then the object and the fix
    return UnsupportedDtype(
        f"Unsupported tensor dtype: {name} ({where}); tensor.v1 stores "
        f"{', '.join(DTYPES)}: convert it first (a complex tensor: torch.view_as_real)")


def _granularity(chunk_bytes: int | None) -> int:
    """The checksum granularity of a new record: ``chunk_bytes`` if given, else this
    module's ``CHUNK_BYTES`` as it is at the call (read then, not bound at import, so that
    a caller who sets ``straw.tensor.CHUNK_BYTES`` changes the policy of the records made
    after, as straw-queue's callers do; a record keeps the granularity it was made with
    in its metadata, so readers never depend on the module's value)."""
    size = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    check_count("chunk_bytes", size, minimum=1)
    return size


def chunk_checksums(data: np.ndarray, chunk_bytes: int | None = None) -> str:
    """The hex xxh3-128 of every ``chunk_bytes`` chunk (default ``CHUNK_BYTES``) of
    ``data``, concatenated."""
    chunk_bytes = _granularity(chunk_bytes)
    mv = _byte_view(data)
    n = mv.nbytes
    count = -(-n // chunk_bytes)

    def run(lo: int, hi: int) -> str:
        # xxh3_128(...) hashes without the GIL (the one-shot xxh3_128_hexdigest holds it,
        # which would serialise the threads below)
        return "".join(xxhash.xxh3_128(mv[c * chunk_bytes:(c + 1) * chunk_bytes]).hexdigest()
                       for c in range(lo, hi))

    if n < _PARALLEL_MIN or _workers() < 2:
        return run(0, count)
    return "".join(_executor().map(lambda r: run(*r), _split(0, count, _workers())))


def tensor_record(value: object, identity: str, *, kind: str | None = None,
                  chunk_bytes: int | None = None, where: str | None = None) -> Record:
    """The ``tensor.v1`` record of one tensor, with record id ``identity`` and, in its
    metadata, ``kind`` (the tensor's name in its publication; ``publish_tensors`` sets it
    to the mapping's key).  Its payload is a view of the tensor (no copy)."""
    if isinstance(value, str) and not isinstance(identity, str):
        raise TypeError(
            f"tensor_record(value, identity, *, kind=None) takes the tensor first; got the "
            f"str {value!r} first (the older call tensor_record(name, value)): swap them")
    if not isinstance(identity, str) or not identity:
        raise TypeError(f"tensor_record: identity (the record id) must be a non-empty str, "
                        f"got {short_repr(identity)}")
    if kind is not None and (not isinstance(kind, str) or not kind):
        raise TypeError(f"tensor_record: kind must be a non-empty str or None, got "
                        f"{short_repr(kind)}")
    chunk_bytes = _granularity(chunk_bytes)
    flat, dtype, shape, source = _tensor_bytes(value, where or f"tensor {identity!r}")
    meta = {"dtype": dtype, "shape": list(shape), "source": source, "kind": kind,
            "chunk_bytes": chunk_bytes,
            "chunks": checksum_list(chunk_checksums(flat, chunk_bytes))}
    return Record(identity, flat, CODEC, meta)


def tensor_from_record(record: Record, *, where: str | None = None) -> np.ndarray:
    """The NumPy array an in-memory ``tensor.v1`` record holds (one ``tensor_record`` made,
    or ``store.read`` returned), its chunk checksums verified (``CorruptData`` on a
    mismatch, D6), copied out of the record's buffer.  Without a store, so without lazy
    reads: for those, use ``TensorRef``."""
    where = where or f"tensor record {getattr(record, 'record_id', '?')!r}"
    if not isinstance(record, Record) or record.codec != CODEC:
        raise UnsupportedSchema(f"{where} is not a {CODEC} record (codec "
                                f"{short_repr(getattr(record, 'codec', None))})")
    flat = np.frombuffer(payload_view(record.payload, where), dtype=np.uint8)
    dtype, shape, _, chunk_bytes, chunks = _check_meta(record.metadata, flat.nbytes, where)
    if chunk_checksums(flat, chunk_bytes) != chunks:
        raise CorruptData(f"{where}: its bytes do not match their chunk checksums; the "
                          "record was damaged or edited")
    return flat.view(_np_dtype(dtype)).reshape(shape).copy()


def tensor_records(tensors: Mapping[str, Any], prefix: str, chunk_bytes: int
                   ) -> list[Record]:
    """The ``tensor.v1`` records of ``{name: tensor}`` in the mapping's order, record ids
    ``f"{prefix}:{name}"`` and kinds their names (straw-queue's layout), checked: a
    mapping, not empty, a non-empty str prefix and names."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name to tensor, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise ValueError("tensors is empty; publish at least one tensor")
    if not isinstance(prefix, str) or not prefix:
        raise TypeError(f"record_prefix (else submission_id) must be a non-empty str, got "
                        f"{short_repr(prefix)}")
    records = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"tensor names must be non-empty str, got {name!r}")
        records.append(tensor_record(value, f"{prefix}:{name}", kind=name,
                                     chunk_bytes=chunk_bytes, where=f"tensors[{name!r}]"))
    return records
