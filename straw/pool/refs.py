"""References: the values a store hands back for what it published, and their checks.

References are small, frozen, hashable, and serialise with ``to_dict``/``from_dict`` (or
``dataclasses.asdict``).  They hold only paths *relative to the pool root*, in one fixed
shape (``runs/<run>/writers/<writer>/i<incarnation>/pack-<n>.pack``); ``check_pack_path``
refuses anything else, so a reference can never make straw open a file outside the pool.
A reference's offsets, sizes and counts are ints in 0..2**63-1 (``InvalidReference``
otherwise): what a file offset can be.  Records and publications are in
``straw.pool.records``; aliases and the stored tuple form in ``straw.pool.ref_forms``.

Every name and path pattern is anchored at the very end of the string (not with ``$``,
which also matches before a final newline).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import INT64_MAX, UINT64_MAX, short_repr
from ..errors import InvalidReference, UnsupportedSchema

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
# A pack is ``pack-<n>.pack`` (straw-queue's suffix, which its callers glob for to size a
# pool); packs written before were ``pack-<n>.strw`` and are read as before.  One writer
# incarnation writes one of the two only (each incarnation has a directory of its own),
# so a pack's location-derived segment id, which drops the suffix, names one file.
PACK_SUFFIXES = (".pack", ".strw")
PACK_PATH_RE = re.compile(
    r"^runs/(?P<run>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/writers/[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
    r"/i[0-9]{6,}/pack-[0-9]{6,}\.(?:pack|strw)\Z"
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


@functools.lru_cache(maxsize=4096)
def pack_path_run(path: str) -> str | None:
    """The run of a canonical pack path, None if ``path`` is not one.  Cached: every
    reference check asks it, of the few pack paths a process reads (the match costs
    several times the lookup)."""
    m = PACK_PATH_RE.match(path)
    return None if m is None else m.group("run")


def check_pack_path(path: object, run_id: str) -> str:
    """Refuse absolute paths, ``..``, odd shapes and other runs (``InvalidReference``)."""
    if not isinstance(path, str):
        raise InvalidReference(f"reference path must be a str, got {type(path).__name__}")
    run = pack_path_run(path)
    if run is None:
        raise InvalidReference(
            f"reference path {path!r} is not a pack path inside the pool "
            "(expected runs/<run>/writers/<writer>/i<n>/pack-<n>.pack, relative, without '..')"
        )
    if run != run_id:
        raise InvalidReference(
            f"reference path {path!r} belongs to run {run!r}, this store is run "
            f"{run_id!r}; open a store of that run to read it"
        )
    return path


# --- references -------------------------------------------------------------------------
#
# straw-queue's reference shapes, over our packs.  A ``SegmentRef`` is ONE EXTENT of one
# of our packs (the version-2 form of straw-queue's segment reference: it names a frame by
# path, offset, size and checksum); a ``RecordRef`` is record ``ordinal`` of an extent; a
# ``RecordSetRef`` is a publication, named by the ``RecordRef`` of its manifest.  Each of
# our extents holds one publication: ordinals ``0..n-1`` are its own records (n = the
# records stored in the extent) and ordinal ``n`` names its manifest, which comes after
# them, as in straw-queue's version-2 layout.  A publication made by ``record_set`` stores
# no records of its own (its records live in other extents), so its manifest is ordinal 0.
#
# ``segment_id`` is derived from the location, ``<writer>/i<n>/pack-<n>@<offset>``: stable
# (the same extent always has the same id) and checked (``InvalidReference`` unless it is
# the id of the path and offset it travels with).

SEGMENT_VERSION = 2  # the only segment reference version this straw reads
CHECKSUM_ALGORITHM = "xxh3-128"


def segment_id_of(path: str, offset: int) -> str:
    """The segment id of the extent at ``offset`` of pack ``path`` (a checked pack path)."""
    return f"{_writer_part(path)}@{offset}"


@functools.lru_cache(maxsize=4096)
def _writer_part(path: str) -> str:
    """``<writer>/i<n>/pack-<n>`` of a pack path (cached as ``pack_path_run``: a restore
    checks thousands of references into the same few packs)."""
    return path.split("/", 3)[3][:-len(".pack")]  # both suffixes are 5 characters


def _check_int(where: str, name: str, v: object, hi: int = INT64_MAX) -> None:
    if type(v) is int and 0 <= v <= hi:  # the common case, decided at once
        return
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= hi:
        bound = "2**64-1" if hi == UINT64_MAX else "2**63-1"
        raise InvalidReference(f"{where}: {name} must be an int in 0..{bound}, got "
                               f"{short_repr(v)}")


def _is_u64(v: object) -> bool:
    return type(v) is int and 0 <= v <= UINT64_MAX


def _in_range(a: object, b: object = 0, c: object = 0) -> bool:
    """``a``, ``b`` and ``c`` plain ints in 0..2**63-1: the common case, decided before
    any error message is formatted (``_check_int`` then names the culprit, and accepts
    int subclasses other than bool, which this refuses)."""
    return type(a) is int and type(b) is int and type(c) is int \
        and 0 <= a <= INT64_MAX and 0 <= b <= INT64_MAX and 0 <= c <= INT64_MAX


def _fields(cls: type, value: object, required: tuple[str, ...],
            optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of a reference dict: all of ``required``, any of ``optional``, nothing
    else (``InvalidReference`` naming the class otherwise)."""
    if not isinstance(value, Mapping):
        raise InvalidReference(f"not a {cls.__name__} dict: {short_repr(value)}")
    need, allowed = _key_sets(required, optional)
    keys = value.keys()
    if need <= keys and keys <= allowed:  # the common case: one set comparison each way
        return dict(value)
    missing = [k for k in required if k not in value]
    extra = [k for k in value if k not in required and k not in optional]
    if missing or extra:
        raise InvalidReference(
            f"not a {cls.__name__} dict: {short_repr(value)} "
            f"({'missing ' + ', '.join(map(str, missing)) if missing else ''}"
            f"{'; ' if missing and extra else ''}"
            f"{'unknown ' + ', '.join(map(str, extra)) if extra else ''})")
    return dict(value)


@functools.lru_cache(maxsize=64)
def _key_sets(required: tuple[str, ...], optional: tuple[str, ...]
              ) -> tuple[frozenset[str], frozenset[str]]:
    return frozenset(required), frozenset(required + optional)


@dataclass(frozen=True)
class SegmentRef:
    """One extent of a pack: where it lies, its size and the xxh3-128 of its body."""

    run_id: str
    path: str
    segment_id: str
    size: int
    checksum: str
    version: int = SEGMENT_VERSION
    checksum_algorithm: str = CHECKSUM_ALGORITHM
    offset: int = 0

    @classmethod
    def at(cls, run_id: str, path: str, offset: int, size: int, checksum: str) -> SegmentRef:
        """The reference of the extent at ``offset`` of ``path`` (its id derived)."""
        return cls(run_id, path, segment_id_of(path, offset), size, checksum,
                   SEGMENT_VERSION, CHECKSUM_ALGORITHM, offset)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "path": self.path, "segment_id": self.segment_id,
                "size": self.size, "checksum": self.checksum, "version": self.version,
                "checksum_algorithm": self.checksum_algorithm, "offset": self.offset}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> SegmentRef:
        ref = cls._parsed(value)
        ref.check()
        return ref

    @classmethod
    def _parsed(cls, value: Mapping[str, Any]) -> SegmentRef:
        """The fields of ``value``, not yet ``check``ed: the caller checks the reference
        holding it once (not once per nesting level)."""
        return cls(**_fields(cls, value, ("run_id", "path", "segment_id", "size", "checksum"),
                             ("version", "checksum_algorithm", "offset")))

    def check(self) -> None:
        """Structural validity (no I/O): a readable version and algorithm, types, ranges,
        a pool-relative pack path and the segment id of that location."""
        if self.version != SEGMENT_VERSION or isinstance(self.version, bool):
            raise UnsupportedSchema(
                f"segment reference version {short_repr(self.version)}: this straw reads "
                f"version {SEGMENT_VERSION} (extents of its own packs)")
        if self.checksum_algorithm != CHECKSUM_ALGORITHM:
            raise UnsupportedSchema(
                f"segment reference checksum algorithm {short_repr(self.checksum_algorithm)}: "
                f"this straw's packs are checked with {CHECKSUM_ALGORITHM}")
        if not isinstance(self.run_id, str):
            raise InvalidReference(f"{self!r}: run_id must be a str")
        check_pack_path(self.path, self.run_id)
        if not _in_range(self.offset, self.size):  # the message only when it is raised
            _check_int(f"reference to {self.path}", "offset", self.offset)
            _check_int(f"reference to {self.path}", "size", self.size)
        if not isinstance(self.checksum, str) or not _HEX32.match(self.checksum):
            raise InvalidReference(f"{self!r}: checksum must be 32 lowercase hex digits")
        if self.segment_id != segment_id_of(self.path, self.offset):
            raise InvalidReference(
                f"{self!r}: segment_id {short_repr(self.segment_id)} is not the id of the "
                f"extent at {self.path} offset {self.offset} "
                f"({segment_id_of(self.path, self.offset)!r}); the reference is edited")


@dataclass(frozen=True)
class RecordRef:
    """Record ``ordinal`` of an extent (see above: the ordinal past its own records names
    the extent's manifest)."""

    segment: SegmentRef
    ordinal: int

    def to_dict(self) -> dict[str, Any]:
        return {"segment": self.segment.to_dict(), "ordinal": self.ordinal}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RecordRef:
        if isinstance(value, Mapping) and "record_set" in value:
            return _legacy_record_ref(value)
        ref = cls._parsed(value)
        ref.check()  # checks its segment too
        return ref

    @classmethod
    def _parsed(cls, value: Mapping[str, Any]) -> RecordRef:
        """Not yet ``check``ed (``SegmentRef._parsed``)."""
        d = _fields(cls, value, ("segment", "ordinal"))
        return cls(SegmentRef._parsed(d["segment"]), d["ordinal"])

    def check(self) -> None:
        if not isinstance(self.segment, SegmentRef):
            raise InvalidReference(f"{self!r}: segment must be a SegmentRef")
        self.segment.check()
        if not _in_range(self.ordinal):
            _check_int(f"record reference into {self.segment.path}", "ordinal", self.ordinal)


@dataclass(frozen=True)
class RecordSetRef:
    """A publication: the reference of its manifest, its logical digest, its number of
    records, and its payload bytes and tokens (both including its dependencies,
    transitively).

    ``digest`` identifies the logical content (records, codecs, metadata, payloads and
    the digests of its dependencies) independent of where it was written (an xxh3-128 hex:
    treat it as opaque).  ``run_id``, ``path``, ``offset``, ``size``, ``checksum`` and
    ``segment`` are those of the extent that holds the manifest."""

    manifest: RecordRef
    digest: str
    records: int
    payload_bytes: int
    tokens: int
    _checked = False  # not a field (no annotation): ``check`` sets it on the instance

    def __init__(self, manifest: RecordRef, digest: str, records: int, payload_bytes: int,
                 tokens: int, *, segment: SegmentRef | None = None) -> None:
        # ``segment=`` (ours: the extent that holds the manifest) replaces the manifest's
        # segment, so that ``dataclasses.replace(ref, segment=...)`` moves a record set as
        # it moves a RecordRef (code written for straw-queue does that without asking
        # which kind of reference it holds).
        if segment is not None:
            if not isinstance(manifest, RecordRef):
                raise InvalidReference(f"RecordSetRef(segment=...): manifest must be a "
                                       f"RecordRef, got {type(manifest).__name__}")
            manifest = RecordRef(segment, manifest.ordinal)
        # set as a frozen dataclass's own __init__ sets them (no loop over a tuple built
        # per call: a restore constructs one per restored reference)
        setattr_ = object.__setattr__
        setattr_(self, "manifest", manifest)
        setattr_(self, "digest", digest)
        setattr_(self, "records", records)
        setattr_(self, "payload_bytes", payload_bytes)
        setattr_(self, "tokens", tokens)

    @property
    def segment(self) -> SegmentRef:
        return self.manifest.segment

    @property
    def run_id(self) -> str:
        return self.manifest.segment.run_id

    @property
    def path(self) -> str:
        return self.manifest.segment.path

    @property
    def offset(self) -> int:
        return self.manifest.segment.offset

    @property
    def size(self) -> int:
        return self.manifest.segment.size

    @property
    def checksum(self) -> str:
        return self.manifest.segment.checksum

    def to_dict(self) -> dict[str, Any]:
        return {"manifest": self.manifest.to_dict(), "digest": self.digest,
                "records": self.records, "payload_bytes": self.payload_bytes,
                "tokens": self.tokens}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RecordSetRef:
        exact = _exact_record_set(value)
        if exact is not None:  # the shape to_dict writes: checked as the general path does
            exact.check()
            return exact
        if isinstance(value, Mapping) and "manifest" not in value and "path" in value:
            return _legacy_record_set_ref(value)
        d = _fields(cls, value, ("manifest", "digest", "records", "payload_bytes", "tokens"))
        m = d["manifest"]
        if isinstance(m, Mapping):  # checked once, below, with the rest of the reference
            manifest = RecordRef.from_dict(m) if "record_set" in m else RecordRef._parsed(m)
        else:
            manifest = m
        if not isinstance(manifest, RecordRef):
            raise InvalidReference(f"not a RecordSetRef dict: {short_repr(value)}")
        ref = cls(manifest, d["digest"], d["records"], d["payload_bytes"], d["tokens"])
        ref.check()
        return ref

    def check(self) -> None:
        """Structural validity (no I/O): types, ranges, and a pool-relative pack path.
        Decided once per object: a reference is frozen (its fields, and its manifest's and
        segment's, are immutable str and int once they pass), so a reference that passed
        stays valid, however many times it is parsed, retained and named again."""
        if self._checked:
            return
        if not isinstance(self.manifest, RecordRef):
            raise InvalidReference(f"{self!r}: manifest must be a RecordRef")
        self.manifest.check()
        if not (_in_range(self.records) and _is_u64(self.payload_bytes)
                and _is_u64(self.tokens)):
            where = f"reference to {self.manifest.segment.path}"
            _check_int(where, "records", self.records)
            # "Invalid result usage": straw-queue's phrase for a bad payload_bytes/tokens
            # (the usage a result is accounted with), which its callers match.  Both are
            # unsigned 64-bit, as straw-queue's (a publication's tokens may reach
            # 2**64-1; the reader then checks them against the manifest).
            for name in ("payload_bytes", "tokens"):
                _check_int(f"Invalid result usage in {where}", name, getattr(self, name),
                           UINT64_MAX)
        if not isinstance(self.digest, str) or not _HEX32.match(self.digest):
            raise InvalidReference(f"{self!r}: digest must be 32 lowercase hex digits")
        # not a field: equality, hashing, repr and asdict never see it
        object.__setattr__(self, "_checked", True)


_RECORD_SET_KEYS = frozenset(("manifest", "digest", "records", "payload_bytes", "tokens"))
_RECORD_REF_KEYS = frozenset(("segment", "ordinal"))
_SEGMENT_KEYS = frozenset(("run_id", "path", "segment_id", "size", "checksum", "version",
                           "checksum_algorithm", "offset"))


def _exact_record_set(value: object) -> RecordSetRef | None:
    """``value`` parsed, NOT yet checked, when it is a dict of exactly the shape
    ``RecordSetRef.to_dict`` writes (every key of every level, nothing else); None for
    any other shape, which the general path of ``from_dict`` parses or refuses.  The same
    reference the general path builds from such a dict, without its per-level dict copies
    and keyword calls (a checkpoint restore parses one per restored reference)."""
    if type(value) is not dict or value.keys() != _RECORD_SET_KEYS:
        return None
    m = value["manifest"]
    if type(m) is not dict or m.keys() != _RECORD_REF_KEYS:
        return None
    s = m["segment"]
    if type(s) is not dict or s.keys() != _SEGMENT_KEYS:
        return None
    seg = SegmentRef(s["run_id"], s["path"], s["segment_id"], s["size"], s["checksum"],
                     s["version"], s["checksum_algorithm"], s["offset"])
    return RecordSetRef(RecordRef(seg, m["ordinal"]), value["digest"], value["records"],
                        value["payload_bytes"], value["tokens"])


def record_sets_in(value: Any, *, strict: bool = True) -> tuple[Any, list[RecordSetRef]]:
    """``value`` (JSON-like state, e.g. a producer's) with every ``RecordSetRef`` in it
    replaced by its dict form, and the references it names: those objects and every dict
    of exactly a RecordSetRef's five keys (``asdict(ref)``), at any depth.  Such a dict
    that is not a valid reference is ``InvalidReference`` (state that looks like a
    reference and is not one would otherwise keep nothing alive, silently); with
    ``strict=False`` it is skipped (state journaled by a straw that did not check it must
    not stop a recovery: it was never a root).  Containers
    past ``MAX_METADATA_DEPTH`` and shared or cyclic ones are left for
    ``canonical_metadata`` to refuse or accept; each is walked once."""
    refs: list[RecordSetRef] = []
    done: dict[int, Any] = {}

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, RecordSetRef):
            v.check()
            refs.append(v)
            return v.to_dict()
        if not isinstance(v, (dict, list, tuple)) or depth > MAX_METADATA_DEPTH:
            return v
        if id(v) in done:
            return done[id(v)]
        done[id(v)] = v  # a cycle back to v meets v itself (refused later)
        if isinstance(v, dict):
            if v.keys() == _RECORD_SET_KEYS:
                try:
                    refs.append(RecordSetRef.from_dict(v))
                except (InvalidReference, UnsupportedSchema):
                    if strict:
                        raise
                out: Any = v
            else:
                out = {k: walk(x, depth + 1) for k, x in v.items()}
        else:
            out = [walk(x, depth + 1) for x in v]
        done[id(v)] = out
        return out

    return walk(value, 1), refs


def record_set_ref(run_id: str, path: str, offset: int, size: int, checksum: str,
                   digest: str, records: int, ordinal: int, payload_bytes: int,
                   tokens: int) -> RecordSetRef:
    """The reference of the publication in the extent at ``offset`` of ``path``
    (``ordinal``: how many records the extent stores itself, i.e. its manifest's)."""
    return RecordSetRef(RecordRef(SegmentRef.at(run_id, path, offset, size, checksum),
                                  ordinal), digest, records, payload_bytes, tokens)


def _legacy_record_set_ref(value: Mapping[str, Any]) -> RecordSetRef:
    """The dict form of the previous straw (flat: run_id, path, offset, size, checksum,
    digest, records), e.g. inside samples written before: same extent, counts not
    recorded (see ``ref_from_tuple``)."""
    d = _fields(RecordSetRef, value, ("run_id", "path", "offset", "size", "checksum",
                                      "digest", "records"))
    if not isinstance(d["run_id"], str):
        raise InvalidReference(f"not a RecordSetRef dict: {short_repr(value)}")
    check_pack_path(d["path"], d["run_id"])
    _check_int(f"reference to {d['path']}", "offset", d["offset"])
    ref = record_set_ref(d["run_id"], d["path"], d["offset"], d["size"], d["checksum"],
                         d["digest"], d["records"], d["records"], 0, 0)
    ref.check()
    return ref


def _legacy_record_ref(value: Mapping[str, Any]) -> RecordRef:
    """The previous straw's record reference dict (record_set, record_id, index, offset,
    length, checksum): record ``index`` of that publication's extent."""
    d = _fields(RecordRef, value, ("record_set", "record_id", "index", "offset", "length",
                                   "checksum"))
    rs = _legacy_record_set_ref(d["record_set"])
    ref = RecordRef(rs.segment, d["index"])
    ref.check()
    return ref
