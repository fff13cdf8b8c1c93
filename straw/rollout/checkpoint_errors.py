"""The errors of checkpoints, resolution and restore (issue 15).  Each names the file or
directory concerned and the fix; each subclasses ``CheckpointError`` (a ``StrawError``) and,
where one fits, the core's class for the same kind of fault, so a caller catching
``CorruptData`` or ``InvalidReference`` also catches the checkpoint's."""

from __future__ import annotations

from straw.errors import CorruptData, InvalidReference, StrawError, UnsupportedSchema


class CheckpointError(StrawError):
    """Base class of the checkpoint layer's errors."""


class CheckpointExists(CheckpointError):
    """A commit marker for this step already exists: nothing was written (a committed
    checkpoint is never overwritten; save under another step or another branch)."""


class ComponentChanged(CheckpointError, CorruptData):
    """A component the commit marker lists is missing, or its size or sha256 differs."""


class StateOmitted(CheckpointError):
    """The checkpoint omitted optimizer or RNG state: it cannot resume training exactly."""


class ForeignRun(CheckpointError, InvalidReference):
    """The checkpoint belongs to another straw run id than the store's."""


class ForeignPool(CheckpointError, InvalidReference):
    """The checkpoint's payloads live in another pool than the store's."""


class UncommittedSnapshot(CheckpointError):
    """A queue or builder snapshot exists for a step without its commit marker (the save
    was interrupted): it is never used, and it does not allow an empty-queue fallback."""


class MissingModel(CheckpointError):
    """The model checkpoint of the selected step does not exist (or is empty)."""


class UnsupportedCheckpoint(CheckpointError, UnsupportedSchema):
    """A checkpoint file has a version this straw does not read."""


class NoCheckpoint(CheckpointError):
    """No committed checkpoint for the requested step in the branch history searched."""


class BranchStarted(CheckpointError):
    """The branch (its isolated queue) was started already: resolve again."""


class SaveDirLocked(CheckpointError):
    """Another controller holds the save directory's lock (the message names it)."""


class BranchChanged(CheckpointError):
    """``rollout/current.json`` changed under us (another job moved the active branch)."""


__all__ = ["CheckpointError", "CheckpointExists", "ComponentChanged", "StateOmitted",
           "ForeignRun", "ForeignPool", "UncommittedSnapshot", "MissingModel",
           "UnsupportedCheckpoint", "NoCheckpoint", "BranchStarted", "SaveDirLocked",
           "BranchChanged"]
