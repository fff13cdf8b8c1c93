"""Recovery's old path: ``straw.pool.recovery``."""

from .catalog import Catalog
from .clock import Clock
from .errors import CorruptData, StrawError
from .fs import Filesystem
from .pool.pack import ExtentEntry, read_sealed_index, scan_pack, storage_error
from .pool.recovery import (
    Damage,
    Submission,
    WriterHistory,
    incarnations,
    recover_writer,
    ref_from_entry,
    seal_dead_writers,
)
from .pool.refs import PACK_PATH_RE, RecordSetRef, record_set_ref

__all__ = [
    "Catalog", "Clock", "CorruptData", "Damage", "ExtentEntry", "Filesystem",
    "incarnations", "PACK_PATH_RE", "read_sealed_index", "record_set_ref", "RecordSetRef",
    "recover_writer", "ref_from_entry", "scan_pack", "seal_dead_writers", "storage_error",
    "StrawError", "Submission", "WriterHistory",
]
