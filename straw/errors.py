"""straw's exceptions: one hierarchy under ``StrawError``.

Errors are part of the interface.  Every message names the object concerned, what was
expected, and what the caller can do about it.  Bad *arguments* raise the built-in
``TypeError``/``ValueError`` (naming the field); everything about stored data,
references, storage and protocol state raises a ``StrawError`` subclass.
"""

from __future__ import annotations

import errno as _errno
import os as _os


class StrawError(RuntimeError):
    """Base class of every straw-specific error.

    A ``RuntimeError``, as in straw-queue, whose callers catch ``RuntimeError``; its name
    there, ``QueueError``, is an alias."""


QueueError = StrawError  # straw-queue 0.1.6's name for the base class


class CorruptData(StrawError):
    """A complete frame or extent failed its checksum (D6): fail closed, never retry.

    The data on disk is not what was written and acknowledged.  Restore the pool from a
    replica or backup; straw detects but does not repair corruption of data.  A damaged
    catalog transaction is the exception: ``SharedFilesystemStore.repair_catalog()`` keeps
    the damaged bytes aside and loses only that transaction (see ``straw.catalog``)."""


class InvalidReference(StrawError):
    """A reference that cannot be followed: it leaves the pool root, belongs to another
    run, names something that does not exist, or has been reclaimed."""


class UnsupportedSchema(StrawError):
    """Stored data uses a format version (or codec) this version of straw does not know.
    Upgrade straw, or read the pool with the version that wrote it."""


class IdempotencyConflict(StrawError):
    """A retry reused an idempotency id (``submission_id``/``request_id``) with different
    content (D7).  Use a new id for new content."""


class StaleAttempt(StrawError):
    """A lease or attempt is no longer current (expired, re-leased, or from an older
    coordinator epoch).  Drop the work; the task returns to the queue."""


class LeaseExpired(StaleAttempt):
    """The lease's deadline passed before it was renewed."""


class StorageUnavailable(StrawError):
    """The storage did not do what was asked (I/O error, a failed fsync, data not yet
    visible after bounded retries).  The operation did not take effect durably, unless
    the error says it is indeterminate; retry with the same idempotency id."""


class QuotaExceeded(StorageUnavailable):
    """ENOSPC or EDQUOT: free space or raise the quota, then retry with the same id."""


class IndeterminateCommit(StrawError):
    """A commit may or may not have become durable (for example, the reply was lost to a
    fence or an fsync error after the write).  Look the idempotency id up before
    retrying."""


class UnsafeRecovery(StrawError):
    """Recovery was asked to proceed where it cannot prove safety (for example another
    live holder).  Make sure the previous owner is dead, then recover explicitly."""


class DeploymentMismatch(StrawError):
    """The storage deployment contradicts its declaration (``straw.backend``): the pool is
    not on the declared kind of filesystem, or the live mount reports another value for
    a declared option.  Fix the mount or the declaration; nothing was written."""


class ResourceLimitExceeded(StrawError):
    """A configured limit would be exceeded (record size, pending tasks, concurrent
    writes).  Raise the limit or apply backpressure."""


class Fenced(StrawError):
    """This coordinator or writer lost its exclusive ownership (a newer epoch exists).
    Stop using this object; open a new one."""


class WriterBusy(StrawError):
    """Another operation holds this writer's gate (a publication in flight, or a live
    process owns the writer that ``retire_writer``/``publication_receipt`` names).  Retry
    after it returns, or make sure that process is gone."""


class WriterFenced(Fenced):
    """This writer incarnation was retired (fenced) by another client; its later
    publications are refused.  Open a new store (a new writer) to publish again."""


class ForkedProcess(StrawError):
    """This object was opened by another process, of which this one is a forked child.
    Its locks, open files and in-memory position belong to the parent: the child must
    not use them.  Open a new store (or coordinator) in the child instead."""


class TensorMismatch(InvalidReference, CorruptData):
    """A ``TensorRef`` whose dtype, shape or byte length disagrees with the published
    record it names (an edited or stale reference), refused before any payload is read
    or any buffer allocated.  Both an ``InvalidReference`` (the reference is wrong, the
    stored data is intact) and, as straw-queue reports it, a ``CorruptData``.  Restore
    the reference from its publication (``TensorRef.from_record_set``)."""


class ExtentMismatch(InvalidReference, CorruptData):
    """A ``SegmentRef`` whose size disagrees with the frame at its offset (smaller than
    any extent, or not the length the authenticated frame header states): an edited or
    stale reference, refused before its size is trusted for any read or allocation.  Both
    an ``InvalidReference`` (the stored data is intact) and, as straw-queue reports it, a
    ``CorruptData``.  Use the reference that ``publish``/``write_records`` returned."""


class Closed(StrawError, ValueError):
    """A store, read session or coordinator used after ``close()``.  A ``RuntimeError``,
    as straw-queue reports it, and a ``ValueError``, as Python reports a closed file (and
    as straw did).  Open a new one."""


class UnknownCodec(UnsupportedSchema, ValueError):
    """A record written with a codec name the store was not opened with.  An
    ``UnsupportedSchema``, as straw-queue reports it, and a ``ValueError``, as straw did
    (a bad argument).  Nothing was written.  Open the store with
    ``codecs=(..., name)``."""


class LocalDependencyOrder(InvalidReference, ValueError):
    """A ``publish_many`` publication whose integer dependency does not index an earlier
    publication of the same call (itself, a later one, a negative index).  An
    ``InvalidReference``, as straw-queue reports it, and a ``ValueError``, as straw did
    (a bad argument).  Nothing was written.  List each publication after the ones it
    depends on, or pass the dependency's ``RecordSetRef``."""


class NotAnInteger(TypeError, ValueError):
    """An argument that must be an integer (a task's priority or scheduling key) is of
    another type, a bool or a float included.  A ``TypeError``, as straw reports a bad
    type, and a ``ValueError``, as straw-queue reports it, so that either ``except``
    catches it.  Pass an int."""


class UnsupportedDtype(UnsupportedSchema, TypeError):
    """A tensor of a dtype ``tensor.v1`` does not store (complex, object, string dtypes).
    An ``UnsupportedSchema``, as straw-queue reports it (its message starts ``Unsupported
    tensor dtype``), and a ``TypeError``, as straw did.  Nothing was written.  Convert the
    tensor to a supported dtype (a complex tensor: ``torch.view_as_real``)."""


class InvalidRecordId(UnsupportedSchema, ValueError):
    """A record id that is empty or longer than 1024 characters.  An
    ``UnsupportedSchema``, as straw-queue reports it, and a ``ValueError``, as straw did.
    Nothing was written.  Give every record a non-empty id of at most 1024 characters."""


class InvalidRange(InvalidReference, ValueError):
    """A ``read_range`` whose byte range is not within its record, or whose chunk
    checksums are not one per chunk of the record.  An ``InvalidReference``, as
    straw-queue reports it, and a ``ValueError``, as straw did.  Nothing was read; pass
    ``0 <= start <= stop <= length`` and the record's whole list of chunk checksums."""


class NotATensorRecord(InvalidReference, UnsupportedSchema):
    """A tensor read (``read_tensor_range``) of a record whose codec is not
    ``tensor.v1``.  An ``UnsupportedSchema``, as straw-queue reports it, and an
    ``InvalidReference``, as straw did.  Read it with ``read_record``/``read_range``."""


class WrongReferenceKind(InvalidReference, UnsupportedSchema, TypeError):
    """A ``RecordRef`` (one record) where a ``RecordSetRef`` (a publication) is expected,
    or the reverse.  straw-queue reports it as ``InvalidReference`` (``read``,
    ``validate``) or ``UnsupportedSchema`` (``manifest``, ``read_record``); straw raised
    ``TypeError``: this class is all three.  Pass the kind of reference the call names."""


class OwnerMismatch(InvalidReference):
    """``release(owner, only_if=refs)`` of an owner that retains something other than
    ``refs``: nothing was released.  What named the owner (an archive index, a record
    handed around) was edited or names someone else's owner; ours (straw-queue has no
    conditional release)."""


def storage_error(err: OSError, what: str) -> StorageUnavailable:
    """The straw error for a failed file operation: ``QuotaExceeded`` for a full disk or
    quota (ENOSPC, EDQUOT), else ``StorageUnavailable``; the message says ``what`` (name
    the file) and the system's reason."""
    cls = QuotaExceeded if err.errno in (_errno.ENOSPC, _errno.EDQUOT) else StorageUnavailable
    return cls(f"{what}: {_os.strerror(err.errno) if err.errno else err} ({err})")


__all__ = [
    "StrawError",
    "QueueError",
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
    "WriterBusy",
    "WriterFenced",
    "ForkedProcess",
    "TensorMismatch",
    "ExtentMismatch",
    "NotAnInteger",
    "LocalDependencyOrder",
    "UnknownCodec",
    "Closed",
    "UnsupportedDtype",
    "InvalidRecordId",
    "InvalidRange",
    "NotATensorRecord",
    "WrongReferenceKind",
    "OwnerMismatch",
    "storage_error",
]
