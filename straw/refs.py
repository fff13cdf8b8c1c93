"""Records, publications and references: the values users hand to and get from a store.

References are small, frozen, hashable, and serialise with ``to_dict``/``from_dict`` (or
``dataclasses.asdict``).  They hold only paths *relative to the pool root*, in one fixed
shape (``runs/<run>/writers/<writer>/i<incarnation>/pack-<n>.strw``); ``check_pack_path``
refuses anything else, so a reference can never make straw open a file outside the pool.
A reference's offsets, sizes and counts are ints in 0..2**63-1 (``InvalidReference``
otherwise): what a file offset can be.

Record metadata is JSON (``canonical_metadata``): dicts with str keys, lists, str, bool,
None, finite floats, and integers that fit in 64 bits (-2**63..2**64-1, what msgpack
carries: the coordinator journals metadata as msgpack), nested at most
``MAX_METADATA_DEPTH`` containers deep and without cycles.  Anything else is a
``TypeError``/``ValueError`` naming the path of the offending value, never an
``OverflowError`` or ``RecursionError``.

Every name and path pattern is anchored at the very end of the string (not with ``$``,
which also matches before a final newline).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checks import INT64_MAX, INT64_MIN, UINT64_MAX, short_repr
from .errors import CorruptData, InvalidReference

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
PACK_PATH_RE = re.compile(
    r"^runs/(?P<run>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/writers/[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
    r"/i[0-9]{6,}/pack-[0-9]{6,}\.strw\Z"
)
_HEX32 = re.compile(r"^[0-9a-f]{32}\Z")
MAX_METADATA_DEPTH = 100  # nested containers in record/task metadata, the top dict included


def check_name(kind: str, value: object) -> str:
    """Validate a run id or writer id: it becomes one path component."""
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, got {type(value).__name__}")
    if not NAME_RE.match(value):
        raise ValueError(
            f"{kind} {value!r} is not a valid name: use 1-128 characters of letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return value


def check_pack_path(path: object, run_id: str) -> str:
    """Refuse absolute paths, ``..``, odd shapes and other runs (``InvalidReference``)."""
    if not isinstance(path, str):
        raise InvalidReference(f"reference path must be a str, got {type(path).__name__}")
    m = PACK_PATH_RE.match(path)
    if m is None:
        raise InvalidReference(
            f"reference path {path!r} is not a pack path inside the pool "
            "(expected runs/<run>/writers/<writer>/i<n>/pack-<n>.strw, relative, without '..')"
        )
    if m.group("run") != run_id:
        raise InvalidReference(
            f"reference path {path!r} belongs to run {m.group('run')!r}, this store is run "
            f"{run_id!r}; open a store of that run to read it"
        )
    return path


# --- records ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Record:
    """One named payload with its codec name, JSON metadata and an optional token count.

    ``payload`` accepts any C-contiguous buffer (bytes, bytearray, memoryview, NumPy
    arrays); records read back carry a read-only ``memoryview`` (zero-copy: use
    ``bytes(record.payload)`` if you need a copy)."""

    record_id: str
    payload: Any
    codec: str = "bytes.v1"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tokens: int | None = None

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


# --- references -------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentRef:
    """A pack file of the pool."""

    run_id: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "path": self.path}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> SegmentRef:
        try:
            run_id, path = value["run_id"], value["path"]
        except (KeyError, TypeError):
            raise InvalidReference(f"not a SegmentRef dict: {short_repr(value)}") from None
        check_pack_path(path, run_id)
        return cls(run_id, path)


@dataclass(frozen=True)
class RecordSetRef:
    """A publication: where its extent lies, its checksum and its logical digest.

    ``size`` is the whole extent frame (header included); ``checksum`` is the xxh3-128 of
    the extent body (hex); ``digest`` identifies the logical content (records, codecs,
    metadata, payloads, dependencies) independent of where it was written."""

    run_id: str
    path: str
    offset: int
    size: int
    checksum: str
    digest: str
    records: int

    @property
    def segment(self) -> SegmentRef:
        return SegmentRef(self.run_id, self.path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": self.path,
            "offset": self.offset,
            "size": self.size,
            "checksum": self.checksum,
            "digest": self.digest,
            "records": self.records,
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RecordSetRef:
        try:
            ref = cls(
                value["run_id"], value["path"], value["offset"], value["size"],
                value["checksum"], value["digest"], value["records"],
            )
        except (KeyError, TypeError):
            raise InvalidReference(f"not a RecordSetRef dict: {short_repr(value)}") from None
        ref.check()
        return ref

    def check(self) -> None:
        """Structural validity (no I/O): types, ranges, and a pool-relative pack path."""
        if not isinstance(self.run_id, str):
            raise InvalidReference(f"{self!r}: run_id must be a str")
        check_pack_path(self.path, self.run_id)
        for name in ("offset", "size", "records"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= INT64_MAX:
                raise InvalidReference(f"reference to {self.path}: {name} must be an int in "
                                       f"0..2**63-1, got {short_repr(v)}")
        for name in ("checksum", "digest"):
            v = getattr(self, name)
            if not isinstance(v, str) or not _HEX32.match(v):
                raise InvalidReference(f"{self!r}: {name} must be 32 lowercase hex digits")


@dataclass(frozen=True)
class RecordRef:
    """One record of a publication: its position inside the pack and its checksum."""

    record_set: RecordSetRef
    record_id: str
    index: int
    offset: int  # absolute offset of the payload in the pack
    length: int
    checksum: str  # xxh3-128 of the payload (hex)

    def to_dict(self) -> dict[str, Any]:
        return {
            "record_set": self.record_set.to_dict(),
            "record_id": self.record_id,
            "index": self.index,
            "offset": self.offset,
            "length": self.length,
            "checksum": self.checksum,
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RecordRef:
        try:
            ref = cls(
                RecordSetRef.from_dict(value["record_set"]), value["record_id"],
                value["index"], value["offset"], value["length"], value["checksum"],
            )
        except (KeyError, TypeError):
            raise InvalidReference(f"not a RecordRef dict: {short_repr(value)}") from None
        rs = ref.record_set
        for name in ("index", "offset", "length"):
            v = getattr(ref, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= INT64_MAX:
                raise InvalidReference(f"reference to record {short_repr(ref.record_id)} of "
                                       f"{rs.path}: {name} must be an int in 0..2**63-1, got "
                                       f"{short_repr(v)}")
        if not (rs.offset <= ref.offset and ref.offset + ref.length <= rs.offset + rs.size):
            raise InvalidReference(f"{ref!r}: record range lies outside its publication")
        return ref


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
