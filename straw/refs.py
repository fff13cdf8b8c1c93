"""The old path of records and references: ``straw.pool.records``, ``straw.pool.refs``,
``straw.pool.ref_forms``."""

from .checks import INT64_MAX, INT64_MIN, UINT64_MAX, short_repr
from .errors import CorruptData, InvalidReference, UnsupportedSchema
from .pool.records import (
    Manifest,
    Publication,
    Record,
    RecordInfo,
    canonical_metadata,
    parse_metadata,
    payload_view,
)
from .pool.ref_forms import (
    AnyRef,
    RefTuple,
    alias_parts,
    canonical_ref,
    ref_from_tuple,
    ref_identity,
    ref_to_tuple,
)
from .pool.refs import (
    CHECKSUM_ALGORITHM,
    MAX_METADATA_DEPTH,
    NAME_RE,
    PACK_PATH_RE,
    PACK_SUFFIXES,
    SEGMENT_VERSION,
    RecordRef,
    RecordSetRef,
    SegmentRef,
    check_name,
    check_pack_path,
    pack_path_run,
    record_set_ref,
    record_sets_in,
    segment_id_of,
)

__all__ = [
    "alias_parts", "AnyRef", "canonical_metadata", "canonical_ref", "check_name",
    "check_pack_path", "CHECKSUM_ALGORITHM", "CorruptData", "INT64_MAX", "INT64_MIN",
    "InvalidReference", "Manifest", "MAX_METADATA_DEPTH", "NAME_RE", "PACK_PATH_RE",
    "pack_path_run", "PACK_SUFFIXES", "parse_metadata", "payload_view", "Publication",
    "Record", "record_set_ref", "record_sets_in", "RecordInfo", "RecordRef", "RecordSetRef",
    "ref_from_tuple", "ref_identity", "ref_to_tuple", "RefTuple", "segment_id_of",
    "SEGMENT_VERSION", "SegmentRef", "short_repr", "UINT64_MAX", "UnsupportedSchema",
]
