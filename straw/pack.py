"""Packs' old path: ``straw.pool.pack``."""

from .checks import short_repr
from .errors import CorruptData, StorageUnavailable, UnsupportedSchema, storage_error
from .fs import Filesystem
from .pool.pack import (
    APIS,
    EXTENT_PREFIX,
    MANIFEST_VERSION,
    PACK_SUFFIX,
    READABLE_VERSIONS,
    RESERVE_RAMP_FLOOR,
    TRAILER,
    TRAILER_MAGIC,
    EncodedExtent,
    ExtentEntry,
    PackWriter,
    ScannedPack,
    decode_manifest,
    encode_extent,
    entry_from_manifest,
    manifest_size,
    read_sealed_index,
    scan_pack,
)
from .pool.refs import PACK_SUFFIXES

__all__ = [
    "APIS", "CorruptData", "decode_manifest", "encode_extent", "EncodedExtent",
    "entry_from_manifest", "EXTENT_PREFIX", "ExtentEntry", "Filesystem", "manifest_size",
    "MANIFEST_VERSION", "PACK_SUFFIX", "PACK_SUFFIXES", "PackWriter", "read_sealed_index",
    "READABLE_VERSIONS", "RESERVE_RAMP_FLOOR", "scan_pack", "ScannedPack", "short_repr",
    "storage_error", "StorageUnavailable", "TRAILER", "TRAILER_MAGIC", "UnsupportedSchema",
]
