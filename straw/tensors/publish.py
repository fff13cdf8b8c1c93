"""Publishing tensors: ``publish_tensors(store, {name: tensor}, *, submission_id)``
publishes NumPy arrays and torch tensors (dtypes uint8, int8, int16, int32, int64,
float16, bfloat16, float32, float64, bool; any shape, scalars and empty tensors included)
as ``tensor.v1`` records of ONE publication on any store (``tensor.v1`` is a built-in
codec), and returns one ``TensorRef`` per tensor, in the order of the mapping; and the
release of their staging protection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..pool.refs import RecordSetRef
from .records import _granularity, tensor_records
from .ref import TensorRef, published


def publish_tensors(store: Any, tensors: Mapping[str, Any], *, submission_id: str,
                    record_prefix: str | None = None,
                    dependencies: Sequence[RecordSetRef] = (),
                    chunk_bytes: int | None = None) -> tuple[TensorRef, ...]:
    """Publish ``{name: tensor}`` as one publication; one ``TensorRef`` per tensor in the
    mapping's order, bound to ``store``.  Record ids are ``f"{record_prefix or
    submission_id}:{name}"`` and each ref's ``kind`` is its ``name`` (straw-queue's
    layout).  Idempotent per ``submission_id`` (D7).  ``chunk_bytes`` is the checksum
    granularity (default ``CHUNK_BYTES`` at the call)."""
    chunk_bytes = _granularity(chunk_bytes)
    prefix = submission_id if record_prefix is None else record_prefix
    records = tensor_records(tensors, prefix, chunk_bytes)
    return published(store, records, submission_id=submission_id, dependencies=dependencies)


def release_tensor_publications(store: Any, tensors: Sequence[TensorRef]) -> list[RecordSetRef]:
    """Release the staging protection of the publications holding ``tensors`` (each
    publication once; sibling tensors published together go with it).  Readers must hold
    their own owner.  Returns the publications released.  Needs a store with retention
    (``release_publications``); never silently does nothing."""
    pubs: list[RecordSetRef] = []
    for i, t in enumerate(tensors):
        if not isinstance(t, TensorRef):
            raise TypeError(f"tensors[{i}] must be a TensorRef, got {type(t).__name__}")
        if t._publication() not in pubs:
            pubs.append(t._publication())
    release = getattr(store, "release_publications", None)
    if release is None:
        raise NotImplementedError(
            f"{type(store).__name__} has no release_publications (retention is not "
            "available in this store); nothing was released"
        )
    release(pubs)
    return pubs
