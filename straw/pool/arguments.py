"""A store's arguments, checked before any byte is written: publications normalised into
what the writer lays out (records, dependencies, the logical digest), submission ids,
owner names and lists of references.

Every refusal is a ``TypeError``/``ValueError`` (or the straw error straw-queue raises)
naming the field; counts and sizes are ints within 64 bits, bools refused
(``straw.checks``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from ..checks import check_count, check_seconds, check_u64, check_usage_total, short_repr
from ..errors import (
    InvalidRecordId,
    InvalidReference,
    LocalDependencyOrder,
    ResourceLimitExceeded,
    UnknownCodec,
)
from .records import Publication, Record, RecordInfo, canonical_metadata, payload_view
from .refs import NAME_RE, RecordRef, RecordSetRef, check_name

BUILTIN_CODECS = ("bytes.v1", "json.v1", "tensor.v1", "sample.v1")
# straw-queue's manifest codecs, which every straw-queue store accepts for callers' own
# records too: labels here (straw never interprets a stored record by them; our manifests
# are extents, and a manifest ordinal reads back labelled "record-set.v2")
MANIFEST_CODECS = ("record-set.v1", "record-set.v2")

# Owner names straw uses itself live under the two prefixes straw-queue 0.1.6 also
# reserves ("queue:" and "publication:"), so that no name a straw-queue caller can use
# (it refuses those two) meets one of ours: a coordinator owns ``queue:<ns>/<id>``, an
# unnamed pin is ``publication:pin:<host>:<pid>:<uuid>``.  Every other name ("pin:...",
# "checkpoint:...", "staged:...", which straw-queue callers do use) is the application's.
# Pools written before this rule may hold unnamed pins called ``pin:<host>:<pid>:<uuid>``:
# they stay ordinary owners (they protect their data until released), and ``release``
# drops them like any application owner.
RESERVED_OWNER_PREFIXES = ("queue:", "publication:")
# An unnamed pin left behind by a reader that died: ``release`` may drop it (an operator
# cleaning up), ``retain`` may not create one.
PIN_OWNER_PREFIX = "publication:pin:"


@dataclass
class Normalized:
    """One validated publication: its records (id, codec, metadata JSON, tokens, payload
    view, payload hash), dependencies (references or indices of earlier publications of
    the call), logical digest, the records of a ``record_set`` (manifest rows, and the
    references with their entries), the bytes it writes itself, and its payload bytes and
    tokens without its dependencies."""

    recs: list[tuple[str, str, str, int, memoryview, bytes]]
    deps: list[Any]
    digest: bytes
    member_rows: list[list[Any]]
    members: list[tuple[RecordRef, RecordInfo]]
    own_bytes: int
    pub_bytes: int
    pub_tokens: int


@dataclass(frozen=True)
class PublicationRules:
    """What a store accepts in a publication, fixed when it opens: records of its
    ``codecs`` (payloads of at most ``max_record_bytes`` with ``enforce_limits``) and
    dependencies of its run (``canonical`` resolves an in-pool alias to its pack)."""

    run_id: str
    codecs: frozenset[str]
    enforce_limits: bool
    max_record_bytes: int
    canonical: Callable[[Any], Any]

    def normalize(self, pub: object, i: int, where: str | None = None, *,
                  earlier: Sequence[bytes] = (),
                  members: Sequence[tuple[RecordRef, RecordInfo]] = ()) -> Normalized:
        """Validate one publication; returns its records, dependencies and digest.

        The digest is layout-independent: it hashes each record's id, codec, metadata,
        token count and payload hash, and each dependency's *logical digest*, the same
        whether the dependency is a reference or the index of a publication of the same
        call (whose digest is known: publications are normalised in order), and the same
        for a ``record_set`` of records as for a publication of those records."""
        where = where or f"publications[{i}]"
        if not isinstance(pub, Publication):
            raise TypeError(f"{where} must be a straw.Publication, got {type(pub).__name__}")
        if isinstance(pub.records, (str, bytes)) or not isinstance(pub.records, Sequence):
            raise TypeError(f"{where}.records must be a list of straw.Record")
        ident: list[Any] = []
        recs, own_bytes, pub_tokens = self._records(pub.records, where, ident)
        member_rows, member_bytes, member_tokens = _members(members, ident)
        deps, dep_ident = self._dependencies(pub.dependencies, i, where, earlier)
        digest = xxhash.xxh3_128_digest(msgpack.packb([ident, dep_ident], use_bin_type=True))
        return Normalized(recs, deps, digest, member_rows, list(members), own_bytes,
                          own_bytes + member_bytes, pub_tokens + member_tokens)

    def _records(self, records: Sequence[Any], where: str, ident: list[Any]
                 ) -> tuple[list[tuple[str, str, str, int, memoryview, bytes]], int, int]:
        """The records checked, with their bytes and tokens; their identities appended
        to ``ident``."""
        seen: set[str] = set()
        recs = []
        own_bytes = 0
        pub_tokens = 0
        for j, r in enumerate(records):
            rw = f"{where}.records[{j}]"
            if not isinstance(r, Record):
                raise TypeError(f"{rw} must be a straw.Record, got {type(r).__name__}")
            if not isinstance(r.record_id, str):
                raise TypeError(f"{rw}.record_id must be a str, got {type(r.record_id).__name__}")
            if not r.record_id or len(r.record_id) > 1024:
                raise InvalidRecordId(f"{rw}.record_id must be a non-empty str of at most "
                                      f"1024 chars, got {short_repr(r.record_id)}")
            if r.record_id in seen:
                raise ValueError(f"{rw}.record_id {r.record_id!r} is a duplicate; record ids "
                                 "must be unique within a publication")
            seen.add(r.record_id)
            if not isinstance(r.codec, str):
                raise TypeError(f"{rw}.codec must be a str, got {type(r.codec).__name__}")
            if r.codec not in self.codecs:
                hint = "" if NAME_RE.match(r.codec) else " (not a valid codec name)"
                raise UnknownCodec(
                    f"{rw}.codec {r.codec!r} is not registered{hint}; open the store with "
                    f"codecs=({r.codec!r},) (built-ins: {', '.join(BUILTIN_CODECS)})"
                )
            if r.tokens is not None:  # None means "no token count": stored as 0
                check_u64(f"{rw}.tokens", r.tokens)  # unsigned, as straw-queue's
            tokens = r.tokens or 0
            meta = canonical_metadata(r.metadata, rw)
            view = payload_view(r.payload, rw)
            if self.enforce_limits and view.nbytes > self.max_record_bytes:
                raise ResourceLimitExceeded(
                    f"{rw}.payload holds {view.nbytes} bytes, more than max_record_bytes="
                    f"{self.max_record_bytes} of this store; open it with a larger "
                    "max_record_bytes, or split the payload")
            h = xxhash.xxh3_128_digest(view)
            recs.append((r.record_id, r.codec, meta, tokens, view, h))
            ident.append([r.record_id, r.codec, meta, _ident_tokens(tokens), h])
            own_bytes += view.nbytes
            pub_tokens += tokens
        return recs, own_bytes, pub_tokens

    def _dependencies(self, dependencies: object, i: int, where: str,
                      earlier: Sequence[bytes]) -> tuple[list[Any], list[Any]]:
        """The dependencies checked (references of this run, or indices of earlier
        publications of the call) and their logical digests."""
        deps: list[Any] = []
        dep_ident: list[Any] = []
        if isinstance(dependencies, (str, bytes, RecordSetRef)) or \
                not isinstance(dependencies, Sequence):
            raise TypeError(f"{where}.dependencies must be a list of RecordSetRef (or "
                            "indices of earlier publications of a publish_many call)")
        for k, d in enumerate(dependencies):
            dw = f"{where}.dependencies[{k}]"
            if isinstance(d, int) and not isinstance(d, bool):
                if not 0 <= d < i:
                    # straw-queue's phrase first (its callers match it), then ours.
                    raise LocalDependencyOrder(
                        f"Local dependencies must precede publication: {dw} = {d} must "
                        "index an earlier publication of this call ("
                        + (f"0..{i - 1}" if i else "there is none before the first")
                        + "); list each publication after the ones it depends on")
                deps.append(d)
                dep_ident.append(earlier[d].hex())
            elif isinstance(d, RecordSetRef):
                d = self.canonical(d)
                d.check()
                if d.run_id != self.run_id:
                    raise InvalidReference(f"{dw} belongs to run {d.run_id!r}; dependencies "
                                           f"must be in this store's run {self.run_id!r}")
                deps.append(d)
                dep_ident.append(d.digest)
            else:
                raise TypeError(f"{dw} must be a RecordSetRef or an int index, got "
                                f"{type(d).__name__}")
        return deps, dep_ident


def _members(members: Sequence[tuple[RecordRef, RecordInfo]], ident: list[Any]
             ) -> tuple[list[list[Any]], int, int]:
    """A ``record_set``'s records as manifest rows, with their bytes and tokens; their
    identities appended to ``ident``."""
    member_rows = []
    member_bytes = 0
    member_tokens = 0
    for m, info in members:
        meta = canonical_metadata(info.metadata, f"record {info.record_id!r}")
        h = bytes.fromhex(info.checksum)
        ident.append([info.record_id, info.codec, meta, _ident_tokens(info.tokens or 0), h])
        member_bytes += info.length
        member_tokens += info.tokens or 0
        seg = m.segment
        member_rows.append([seg.path, seg.offset, seg.size, bytes.fromhex(seg.checksum),
                            m.ordinal, info.record_id, info.codec, meta, info.tokens,
                            info.length, h])
    return member_rows, member_bytes, member_tokens


def _ident_tokens(tokens: int) -> int | None:
    """A record's token count as the digest hashes it: 0 as None, the previous straw's
    "no count", so that the digest of a publication without dependencies is the one the
    previous straw computed (idempotent retries across an upgrade)."""
    return tokens or None


def check_usage(normalized: list[Normalized]) -> None:
    """Each publication's payload bytes and tokens, its dependencies' included
    transitively (what its manifest and reference carry), fit in 64 unsigned bits:
    ``ValueError`` ("overflow") before anything is written, never a wrapped count (a
    record's tokens may each be up to 2**64-1, as in straw-queue)."""
    totals: list[tuple[int, int]] = []
    for i, n in enumerate(normalized):
        deps = [totals[d] if isinstance(d, int) else (d.payload_bytes, d.tokens)
                for d in n.deps]
        payload_bytes = n.pub_bytes + sum(b for b, _ in deps)
        tokens = n.pub_tokens + sum(t for _, t in deps)
        check_usage_total(f"publications[{i}] payload bytes (dependencies included)",
                          payload_bytes)
        check_usage_total(f"publications[{i}] tokens (dependencies included)", tokens)
        totals.append((payload_bytes, tokens))


def check_submission_id(submission_id: object) -> None:
    if not isinstance(submission_id, str):
        raise TypeError(f"submission_id must be a str, got {type(submission_id).__name__}")
    if not submission_id or len(submission_id) > 1024:
        raise ValueError("submission_id must be a non-empty str of at most 1024 characters")


def check_owner(owner: object) -> str:
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, got {type(owner).__name__}")
    if not owner or len(owner) > 1024:
        raise ValueError("owner must be a non-empty str of at most 1024 characters")
    if owner.startswith(RESERVED_OWNER_PREFIXES):
        raise ValueError(
            f"owner {owner!r} uses a reserved prefix ({', '.join(RESERVED_OWNER_PREFIXES)}: "
            "straw's own queue and pin owners); choose another name"
        )
    return owner


def sequence_of(value: Any) -> Sequence[Any]:
    """``value`` as a sequence to look through for dependencies, or () if it is none."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return ()
    return value


def listed(refs: Any) -> Any:
    """``refs`` as a list, so that it can be walked twice (a single reference is left as
    it is, for ``checked`` to refuse)."""
    if isinstance(refs, (RecordSetRef, RecordRef, str, bytes)):
        return refs
    return list(refs)


def checked(refs: Iterable[Any], where: str, run_id: str, canonical: Callable[[Any], Any]
            ) -> list[RecordSetRef | RecordRef]:
    """``refs`` with in-pool aliases resolved (``canonical``), each structurally checked
    and of run ``run_id`` (``TypeError``/``InvalidReference`` naming ``where[i]``
    otherwise)."""
    if isinstance(refs, (RecordSetRef, RecordRef, str, bytes)):
        raise TypeError(f"{where} must be a list of references, not a single one")
    out = []
    for i, r in enumerate(refs):
        if not isinstance(r, (RecordSetRef, RecordRef)):
            raise TypeError(f"{where}[{i}] must be a RecordSetRef or RecordRef, got "
                            f"{type(r).__name__}")
        r = canonical(r)  # an in-pool alias names its pack's identity
        r.check()
        if r.segment.run_id != run_id:
            raise InvalidReference(f"{where}[{i}] belongs to run {r.segment.run_id!r}, "
                                   f"this store is run {run_id!r}")
        out.append(r)
    return out


def check_options(segment_target_bytes: int, max_record_bytes: int, max_buffer_bytes: int,
                  reserve_bytes: int, visibility_retries: int, visibility_backoff: float,
                  online_gc: bool, enforce_limits: bool, codecs: Iterable[str]) -> set[str]:
    """The store's options checked (``TypeError``/``ValueError`` naming the first wrong
    one); the codec names it adds to the built-ins."""
    check_count("segment_target_bytes", segment_target_bytes)
    check_count("max_record_bytes", max_record_bytes, minimum=1)
    check_count("max_buffer_bytes", max_buffer_bytes, minimum=1)
    check_count("reserve_bytes", reserve_bytes)
    check_count("visibility_retries", visibility_retries)
    check_seconds("visibility_backoff", visibility_backoff, positive=False)
    if not isinstance(online_gc, bool):
        raise TypeError(f"online_gc must be a bool, got {type(online_gc).__name__}")
    if not isinstance(enforce_limits, bool):
        raise TypeError(f"enforce_limits must be a bool, got {type(enforce_limits).__name__}")
    if isinstance(codecs, str):
        raise TypeError("codecs must be an iterable of codec names, not one str")
    extra = set()
    for c in codecs:
        extra.add(check_name("codec name", c))
    return extra
