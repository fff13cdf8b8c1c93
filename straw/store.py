"""The store's old path, kept for straw-queue callers and vime: ``straw.pool.store``."""

from .backend import FilesystemBackend
from .catalog import Catalog, Extent
from .checks import check_count, check_seconds, check_u64, check_usage_total, short_repr
from .clock import Clock, SystemClock
from .errors import (
    Closed,
    CorruptData,
    IdempotencyConflict,
    InvalidRecordId,
    InvalidReference,
    LocalDependencyOrder,
    ResourceLimitExceeded,
    StorageUnavailable,
    StrawError,
    UnknownCodec,
    UnsupportedSchema,
    WriterBusy,
    storage_error,
)
from .fs import Filesystem, PosixFS
from .pool.arguments import (
    BUILTIN_CODECS,
    MANIFEST_CODECS,
    PIN_OWNER_PREFIX,
    RESERVED_OWNER_PREFIXES,
    check_owner,
)
from .pool.opening import ONLINE_GC_MARKER, POOL_FORMAT
from .pool.pack import EXTENT_PREFIX, encode_extent
from .pool.records import (
    Manifest,
    Publication,
    Record,
    RecordInfo,
    canonical_metadata,
    payload_view,
)
from .pool.recovery import (
    Submission,
    incarnations,
    recover_writer,
    ref_from_entry,
    seal_dead_writers,
)
from .pool.refs import NAME_RE, PACK_SUFFIXES, RecordRef, RecordSetRef, SegmentRef, check_name
from .pool.retention import HOLD_API, Pin
from .pool.store import (
    DEFAULT_MAX_BUFFER_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_RESERVE,
    DEFAULT_SEGMENT_TARGET,
    MAX_RECORDS,
    SharedFilesystemStore,
)
from .pool.writer import RETIRED, WriterIncarnation
from .process import ProcessBound
from .reader import PackStatus, ReadSession, drop_reclaimed, envelope_dict

__all__ = [
    "BUILTIN_CODECS", "canonical_metadata", "Catalog", "check_count", "check_name",
    "check_owner", "check_seconds", "check_u64", "check_usage_total", "Clock", "Closed",
    "CorruptData", "DEFAULT_MAX_BUFFER_BYTES", "DEFAULT_MAX_RECORD_BYTES",
    "DEFAULT_RESERVE", "DEFAULT_SEGMENT_TARGET", "drop_reclaimed", "encode_extent",
    "envelope_dict", "Extent", "EXTENT_PREFIX", "Filesystem", "FilesystemBackend",
    "HOLD_API", "IdempotencyConflict", "incarnations", "InvalidRecordId",
    "InvalidReference", "LocalDependencyOrder", "Manifest", "MANIFEST_CODECS",
    "MAX_RECORDS", "NAME_RE", "ONLINE_GC_MARKER", "PACK_SUFFIXES", "PackStatus",
    "payload_view", "Pin", "PIN_OWNER_PREFIX", "POOL_FORMAT", "PosixFS", "ProcessBound",
    "Publication", "ReadSession", "Record", "RecordInfo", "RecordRef", "RecordSetRef",
    "recover_writer", "ref_from_entry", "RESERVED_OWNER_PREFIXES", "ResourceLimitExceeded",
    "RETIRED", "seal_dead_writers", "SegmentRef", "SharedFilesystemStore", "short_repr",
    "storage_error", "StorageUnavailable", "StrawError", "Submission", "SystemClock",
    "UnknownCodec", "UnsupportedSchema", "WriterBusy", "WriterIncarnation",
]
