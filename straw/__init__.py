"""straw: durable filesystem queues and packed tensor storage for RL jobs.

The public API keeps straw-queue's vocabulary (see DESIGN.md).  File I/O goes through
``straw.fs.Filesystem``; time through an injectable ``straw.clock.Clock``.
"""

from .errors import (
    CorruptData,
    DeploymentMismatch,
    Fenced,
    ForkedProcess,
    IdempotencyConflict,
    IndeterminateCommit,
    InvalidReference,
    LeaseExpired,
    QuotaExceeded,
    ResourceLimitExceeded,
    StaleAttempt,
    StorageUnavailable,
    StrawError,
    UnsafeRecovery,
    UnsupportedSchema,
    WriterBusy,
    WriterFenced,
)
from .pool.records import Manifest, Publication, Record, RecordInfo
from .pool.refs import RecordRef, RecordSetRef, SegmentRef
from .pool.store import SharedFilesystemStore
from .protocol import Limits, TaskSpec
from .queue.coordinator import Coordinator
from .read.session import ReadSession

__version__ = "0.1.0"

__all__ = [
    "SharedFilesystemStore",
    "Coordinator",
    "TaskSpec",
    "Limits",
    "ReadSession",
    "Record",
    "Publication",
    "RecordSetRef",
    "RecordRef",
    "SegmentRef",
    "RecordInfo",
    "Manifest",
    "StrawError",
    "CorruptData",
    "InvalidReference",
    "UnsupportedSchema",
    "IdempotencyConflict",
    "StaleAttempt",
    "LeaseExpired",
    "StorageUnavailable",
    "QuotaExceeded",
    "IndeterminateCommit",
    "UnsafeRecovery",
    "DeploymentMismatch",
    "ResourceLimitExceeded",
    "Fenced",
    "ForkedProcess",
    "WriterBusy",
    "WriterFenced",
]
