"""The writer's old path: ``straw.pool.writer``."""

from .catalog import Catalog
from .clock import Clock
from .errors import StorageUnavailable, UnsafeRecovery, WriterFenced
from .fs import Filesystem
from .pool.pack import PACK_SUFFIX, EncodedExtent, PackWriter, storage_error
from .pool.recovery import Damage, Submission, ref_from_entry
from .pool.refs import RecordSetRef
from .pool.writer import RETIRED, WriterIncarnation
from .process import ProcessBound, close_quietly

__all__ = [
    "Catalog", "Clock", "close_quietly", "Damage", "EncodedExtent", "Filesystem",
    "PACK_SUFFIX", "PackWriter", "ProcessBound", "RecordSetRef", "ref_from_entry",
    "RETIRED", "storage_error", "StorageUnavailable", "Submission", "UnsafeRecovery",
    "WriterFenced", "WriterIncarnation",
]
