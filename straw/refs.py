"""References' old path: ``straw.pool.refs``."""

from .checks import INT64_MAX, INT64_MIN, UINT64_MAX, short_repr
from .errors import CorruptData, InvalidReference, UnsupportedSchema
from .pool.refs import (
    CHECKSUM_ALGORITHM,
    MAX_METADATA_DEPTH,
    NAME_RE,
    PACK_PATH_RE,
    PACK_SUFFIXES,
    SEGMENT_VERSION,
    AnyRef,
    Manifest,
    Publication,
    Record,
    RecordInfo,
    RecordRef,
    RecordSetRef,
    RefTuple,
    SegmentRef,
    alias_parts,
    canonical_metadata,
    canonical_ref,
    check_name,
    check_pack_path,
    pack_path_run,
    parse_metadata,
    payload_view,
    record_set_ref,
    record_sets_in,
    ref_from_tuple,
    ref_identity,
    ref_to_tuple,
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
