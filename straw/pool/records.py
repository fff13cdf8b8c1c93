"""Records and publications: the values users hand to a store, and what a checked
manifest tells of them.

Record metadata is JSON (``canonical_metadata``): dicts with str keys, lists, str, bool,
None, finite floats, and integers that fit in 64 bits (-2**63..2**64-1, what msgpack
carries: the coordinator journals metadata as msgpack), nested at most
``MAX_METADATA_DEPTH`` containers deep and without cycles.  Anything else is a
``TypeError``/``ValueError`` naming the path of the offending value, never an
``OverflowError`` or ``RecursionError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import INT64_MIN, UINT64_MAX, short_repr
from ..errors import CorruptData
from .refs import MAX_METADATA_DEPTH, RecordRef, RecordSetRef


@dataclass(frozen=True, eq=False)
class Record:
    """One named payload with its codec name, JSON metadata and token count.

    ``payload`` accepts any C-contiguous buffer (bytes, bytearray, memoryview, NumPy
    arrays); records read back carry ``bytes`` (read straight into the bytes object, no
    second copy; tensors and ranges read into their destination instead, see
    ``straw.tensor`` and ``read_range``).  ``tokens`` defaults to 0 as in straw-queue;
    None is accepted on input as "no count" and reads back as 0."""

    record_id: str
    payload: Any
    codec: str = "bytes.v1"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tokens: int | None = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (
            self.record_id == other.record_id
            and self.codec == other.codec
            and dict(self.metadata) == dict(other.metadata)
            and self.tokens == other.tokens
            and bytes(memoryview(self.payload).cast("B")) == bytes(
                memoryview(other.payload).cast("B")
            )
        )


@dataclass(frozen=True)
class Publication:
    """One logical publication for ``publish_many``: records plus dependencies, each a
    ``RecordSetRef`` or the index of an earlier publication in the same call."""

    records: Sequence[Record]
    dependencies: Sequence[RecordSetRef | int] = ()


def payload_view(payload: object, where: str) -> memoryview:
    """A flat byte view of a payload, without copying; clear errors otherwise."""
    if isinstance(payload, str):
        raise TypeError(f"{where}.payload is a str; encode it to bytes first (e.g. .encode())")
    try:
        mv = memoryview(payload)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{where}.payload must be a bytes-like buffer (bytes, bytearray, memoryview, "
            f"NumPy array), got {type(payload).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise ValueError(
            f"{where}.payload is not C-contiguous; pass numpy.ascontiguousarray(x) or "
            "tensor.contiguous()"
        )
    return mv.cast("B") if (mv.ndim != 1 or mv.format != "B") else mv


def _check_json(value: Any, where: str, depth: int = 0,
                active: set[int] | None = None) -> None:
    """Refuse what JSON (or the msgpack journal) cannot carry.  ``depth`` counts the
    containers around ``value``; ``active`` holds the ids of those containers, so that a
    cycle is a ValueError naming where it closes (the recursion stays below
    ``MAX_METADATA_DEPTH`` frames, never near Python's recursion limit)."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= UINT64_MAX:
            raise ValueError(f"{where} is {short_repr(value)}, which does not fit in 64 bits; "
                             "metadata integers must lie in -2**63..2**64-1 (store larger "
                             "numbers as str)")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; metadata numbers must be finite")
        return
    if isinstance(value, (Mapping, list, tuple)):
        if depth >= MAX_METADATA_DEPTH:
            raise ValueError(f"{where}: metadata nests deeper than {MAX_METADATA_DEPTH} "
                             "containers; flatten it, or put the structure in a payload")
        active = set() if active is None else active
        if id(value) in active:
            raise ValueError(f"{where} refers back to a container that encloses it: "
                             "metadata must not contain cycles")
        active.add(id(value))
        try:
            if isinstance(value, Mapping):
                for k, v in value.items():
                    if not isinstance(k, str):
                        raise TypeError(f"{where} has key {short_repr(k)}; JSON metadata keys must "
                                        "be str")
                    _check_json(v, f"{where}[{k!r}]", depth + 1, active)
            else:
                for i, v in enumerate(value):
                    _check_json(v, f"{where}[{i}]", depth + 1, active)
        finally:
            active.discard(id(value))
        return
    raise TypeError(
        f"{where} is a {type(value).__name__}; metadata must be JSON (dict, list, str, "
        "finite int/float, bool, None); put large or binary content in a payload"
    )


def canonical_metadata(metadata: object, where: str) -> str:
    """Validated, canonical JSON text of a record's metadata."""
    if not isinstance(metadata, Mapping):
        raise TypeError(f"{where}.metadata must be a dict, got {type(metadata).__name__}")
    _check_json(metadata, f"{where}.metadata")
    return json.dumps(metadata, sort_keys=True, separators=(",", ":"), allow_nan=False)


def parse_metadata(text: str, where: str) -> dict[str, Any]:
    """Stored metadata text back as a dict.  It passed its checksum, so text that is not
    a JSON object was crafted or written wrong: ``CorruptData`` naming ``where``."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting past the C parser
        raise CorruptData(f"{where}: stored metadata is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise CorruptData(f"{where}: stored metadata is a {type(value).__name__}, not a "
                          "JSON object")
    return value


@dataclass(frozen=True)
class RecordInfo:
    """A manifest entry: everything about a record except its bytes."""

    record_id: str
    codec: str
    metadata: Mapping[str, Any]
    tokens: int | None
    length: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """The checked manifest of a publication."""

    ref: RecordSetRef
    submission_id: str
    records: tuple[RecordInfo, ...]
    dependencies: tuple[RecordSetRef, ...]
    record_refs: tuple[RecordRef, ...]
