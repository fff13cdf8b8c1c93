"""The sample-group codec: a ``SampleGroup`` as records and back, a pure function pair.

``group_records(group)`` returns the records of one publication and the publications it
must depend on; ``group_from_records(records)`` rebuilds the group.  Neither touches a
store, so the queue wiring only publishes what the first returns (``store.publish(records,
submission_id=..., dependencies=deps)``) and hands what ``store.read(ref)`` returns to the
second.

The format is the core's sample codec (``straw.codec``, ``sample.v1``; one implementation
of sample encoding): record 0 holds the group as a msgpack structure of plain values
(schema ``GROUP_SCHEMA`` version ``GROUP_VERSION``; prompt, token ids as one int32 (or
int64) little-endian buffer, status, reward, version spans, indices, metadata per
sample), and every capture tensor (R3 routes, top-k ids and log-probs: NumPy or torch) is
its own ``tensor.v1`` record (chunk checksums, zero-copy writes, row-sliced lazy reads).
A capture that is already a ``TensorRef``
(shared with an earlier publication) is stored as a reference: no bytes copied, its
publication becomes a dependency.  Record 0's token count is the group's token count, so
the publication's ``RecordSetRef.tokens`` can size the queue task.

Decoding never unpickles; it builds only the values listed above, and a stored structure
that is not a valid group (missing or mistyped fields, a sample that fails validation,
e.g. a NaN reward) is ``CorruptData`` naming the field; another schema or version is
``UnsupportedSchema``.  ``tensors=TensorRef.from_record_set_many(store, ref)`` with
``lazy_tensors_over=N`` leaves captures larger than N bytes lazy (the batch builder reads
only a rank's rows); without it the captures are decoded from the records.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from straw.codec import sample_from_records, sample_records
from straw.errors import CorruptData, UnsupportedSchema
from straw.refs import Record, RecordSetRef
from straw.tensor import TensorRef

from .samples import Sample, SampleGroup, VersionSpan, token_ids_from_buffer

GROUP_SCHEMA = "straw.rollout.group"
GROUP_VERSION = 1
_CAPTURES = ("routes", "topk_ids", "topk_logprobs")
_SAMPLE_KEYS = frozenset({"prompt", "tokens", "response_length", "status", "reward",
                          "versions", "group_index", "index", "metadata", *_CAPTURES})


_TOKEN_DTYPES: dict[int, np.dtype[Any]] = {4: np.dtype("<i4"), 8: np.dtype("<i8")}


# the stdlib array types of 4- and 8-byte signed ints (C int and long long on every
# platform we run on; checked here, NumPy is the fallback)
_ARRAY_CODES = {4: "i", 8: "q"} if array.array("i").itemsize == 4 \
    and array.array("q").itemsize == 8 else None


def _token_bytes(tokens: tuple[int, ...]) -> list[Any]:
    """``[width, bytes]``: the ids as int32 when they fit (they do for every vocabulary
    in use), else int64, little-endian.  (``array.array`` converts a tuple of ints twice
    as fast as NumPy: this runs for every sample a client returns and every prompt a
    refill publishes.)"""
    if not tokens:
        return [4, b""]
    if _ARRAY_CODES is None:
        wide = np.asarray(tokens, dtype=np.int64)  # (Sample checked the int64 range)
        width = 4 if int(wide.min()) >= -(2**31) and int(wide.max()) < 2**31 else 8
        return [width, wide.astype(_TOKEN_DTYPES[width]).tobytes()]
    try:
        width, ids = 4, array.array(_ARRAY_CODES[4], tokens)
    except OverflowError:  # an id past int32
        width, ids = 8, array.array(_ARRAY_CODES[8], tokens)
    if sys.byteorder != "little":
        ids.byteswap()
    return [width, ids.tobytes()]


def _tokens(value: Any, where: str) -> tuple[int, ...]:
    if not (isinstance(value, list) and len(value) == 2 and value[0] in _TOKEN_DTYPES
            and isinstance(value[1], bytes) and len(value[1]) % value[0] == 0):
        raise CorruptData(f"{where}.tokens is not [4 or 8, little-endian token bytes]")
    return token_ids_from_buffer(value[1], value[0])  # (checked ints by construction)


def _sample_value(s: Sample) -> dict[str, Any]:
    value: dict[str, Any] = {
        "prompt": s.prompt,
        # token ids as one little-endian buffer, not a msgpack int per token (40x faster)
        "tokens": _token_bytes(s.tokens),
        "response_length": s.response_length,
        "status": s.status.value,
        "reward": s.reward,
        "versions": [[v.start, v.stop, v.version] for v in s.versions],
        "group_index": s.group_index,
        "index": s.index,
        "metadata": dict(s.metadata),
    }
    for name in _CAPTURES:
        value[name] = getattr(s, name)
    return value


def group_value(group: SampleGroup) -> dict[str, Any]:
    """The plain structure ``group`` is stored as (what record 0 encodes)."""
    if not isinstance(group, SampleGroup):
        raise TypeError(f"group must be a SampleGroup, got {type(group).__name__}")
    return {"schema": GROUP_SCHEMA, "version": GROUP_VERSION,
            "environment": group.environment, "metadata": dict(group.metadata),
            "samples": [_sample_value(s) for s in group.samples]}


def group_records(group: SampleGroup) -> tuple[list[Record], list[RecordSetRef]]:
    """The records of ``group``'s publication, and the publications it depends on (those
    of its ``TensorRef`` captures)."""
    return sample_records(group_value(group), tokens=group.tokens)


def _field(value: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str
           ) -> Any:
    if key not in value:
        raise CorruptData(f"{where} lacks {key!r}")
    got = value[key]
    if not isinstance(got, kind):
        raise CorruptData(f"{where}.{key} is a {type(got).__name__}, not what a stored "
                          "group holds there")
    return got


def _sample_from_value(value: Any, where: str) -> Sample:
    if not isinstance(value, dict) or set(value) != _SAMPLE_KEYS:
        got = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
        raise CorruptData(f"{where} is not a stored sample (keys {got})")
    spans = _field(value, "versions", list, where)
    for j, span in enumerate(spans):
        if not isinstance(span, list) or len(span) != 3:
            raise CorruptData(f"{where}.versions[{j}] is not [start, stop, version]")
    try:
        versions = tuple(VersionSpan(*span) for span in spans)
        return Sample(
            prompt=value["prompt"],
            tokens=_tokens(value["tokens"], where),
            response_length=value["response_length"],
            status=value["status"],
            reward=value["reward"],
            versions=versions,
            group_index=value["group_index"],
            index=value["index"],
            metadata=_field(value, "metadata", dict, where),
            **{name: value[name] for name in _CAPTURES},
        )
    except (TypeError, ValueError) as e:  # the stored sample fails validation
        raise CorruptData(f"{where} does not make a valid sample: {e}") from None


def group_from_value(value: Any) -> SampleGroup:
    """The group a decoded structure holds (checked: see the module docstring)."""
    if not isinstance(value, dict) or value.get("schema") != GROUP_SCHEMA:
        raise UnsupportedSchema(f"the sample is not a {GROUP_SCHEMA} (schema "
                                f"{value.get('schema') if isinstance(value, dict) else None!r})")
    if value.get("version") != GROUP_VERSION:
        raise UnsupportedSchema(f"{GROUP_SCHEMA} version {value.get('version')!r}; this straw "
                                f"reads version {GROUP_VERSION}")
    where = "stored group"
    samples = _field(value, "samples", list, where)
    built = tuple(_sample_from_value(s, f"{where}.samples[{i}]") for i, s in enumerate(samples))
    try:
        return SampleGroup(built, _field(value, "environment", str, where),
                           _field(value, "metadata", dict, where))
    except (TypeError, ValueError) as e:
        raise CorruptData(f"{where} does not make a valid group: {e}") from None


def group_from_records(records: Sequence[Record], *,
                       tensors: Mapping[int, TensorRef] | None = None,
                       lazy_tensors_over: int | None = None, store: Any = None
                       ) -> SampleGroup:
    """The group ``records`` hold (``group_records``' output or ``store.read``'s)."""
    value = sample_from_records(records, tensors=tensors, lazy_tensors_over=lazy_tensors_over,
                                store=store)
    return group_from_value(value)


__all__ = ["GROUP_SCHEMA", "GROUP_VERSION", "group_value", "group_records", "group_from_value",
           "group_from_records"]
