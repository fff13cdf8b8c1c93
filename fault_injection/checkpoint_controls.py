"""The checkpoint campaign's negative controls (``CONTROLS``): one ordering of a save or
a restore broken each, through a patch of ``straw.rollout`` for the duration of a
``with`` block.  ``fault_injection.checkpoint_campaign`` must catch each, by the check it
names: the save's state files, or the model's files, named by a marker without being
fsynced first, the retention after the marker, and a restore that records its branch as
seeded before the builder's restored state is durable."""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fault_injection.checkpoint_job import SAVE
from fault_injection.controls import NO_SYNC, SkipOps
from straw.refs import RecordSetRef
from straw.rollout import checkpoint as checkpoint_mod
from straw.rollout import restore as restore_mod


def _unsynced_write_files(fs: Any, directory: str, files: Any) -> None:
    """The state files renamed into place without any fsync (of theirs or of their
    directory)."""
    fs.makedirs_durable(directory)
    for name, data in files.items():
        tmp = os.path.join(directory, name + ".tmp")
        fd = fs.open(tmp, write=True, create=True)
        try:
            fs.writev(fd, [data], 0)
        finally:
            fs.close(fd)
        fs.rename(tmp, os.path.join(directory, name))


_REAL_WRITE_FILES = checkpoint_mod.write_files


@contextlib.contextmanager
def states_unsynced() -> Iterator[None]:
    """The queue and builder state files renamed into place unsynced: the marker can be
    durable before its components (RL9 broken)."""
    checkpoint_mod.write_files = _unsynced_write_files  # type: ignore[assignment]
    try:
        yield
    finally:
        checkpoint_mod.write_files = _REAL_WRITE_FILES  # type: ignore[assignment]


@contextlib.contextmanager
def model_unsynced() -> Iterator[None]:
    """The model's files (and their directory) named in the marker without being made
    durable first: the user's unsynced save can vanish under a marker (RL9 broken)."""
    real = checkpoint_mod.Checkpointer._model_durable

    def model_durable(self: Any, paths: Any, dirs: Any) -> Any:
        fs, self.fs = self.fs, SkipOps(self.fs, NO_SYNC)
        try:
            return real(self, paths, dirs)
        finally:
            self.fs = fs

    checkpoint_mod.Checkpointer._model_durable = model_durable  # type: ignore[method-assign]
    try:
        yield
    finally:
        checkpoint_mod.Checkpointer._model_durable = real  # type: ignore[method-assign]


@contextlib.contextmanager
def retain_after_marker() -> Iterator[None]:
    """The payloads retained only after the marker is written (RL7/RL9 broken: a crash
    between them leaves a marker naming payloads nobody retains)."""
    real_save = checkpoint_mod.Checkpointer.save
    pending: list[tuple[Any, str, list[RecordSetRef]]] = []

    def late_retain(self: Any, owner: str, refs: Sequence[RecordSetRef]) -> None:
        pending.append((self, owner, list(refs)))

    def save(self: Any, step: int, save_model: Any) -> Any:
        real_retain = self.store.retain
        self.store.retain = types.MethodType(late_retain, self.store)
        try:
            marker = real_save(self, step, save_model)
        finally:
            self.store.retain = real_retain
        for _store, owner, refs in pending:
            real_retain(owner, refs)
        pending.clear()
        return marker

    checkpoint_mod.Checkpointer.save = save  # type: ignore[method-assign]
    try:
        yield
    finally:
        checkpoint_mod.Checkpointer.save = real_save  # type: ignore[method-assign]


@contextlib.contextmanager
def seeded_before_builder() -> Iterator[None]:
    """``seeded.json`` written as soon as the isolated queue is seeded, before the
    builder's restored state is durable: a crash between them makes a restart recover a
    branch whose builder never held the restored groups (they are lost)."""
    real = restore_mod.seed_isolated_queue

    def seed(store: Any, *, namespace: str, queue_id: str, **kwargs: Any) -> Any:
        out = real(store, namespace=namespace, queue_id=queue_id, **kwargs)
        branch = f"{SAVE}/branches/{queue_id}" if store.fs.exists(
            f"{SAVE}/branches/{queue_id}") else SAVE
        restore_mod.write_json(store.fs, f"{branch}/rollout/{restore_mod.SEEDED}", {
            "version": restore_mod.VERSION,
            "queue": {"namespace": namespace, "queue_id": queue_id}})
        return out

    restore_mod.seed_isolated_queue = seed  # type: ignore[assignment]
    try:
        yield
    finally:
        restore_mod.seed_isolated_queue = real  # type: ignore[assignment]


CONTROLS: dict[str, tuple[Callable[[], contextlib.AbstractContextManager[None]],
                          tuple[str, ...], str]] = {
    "states_unsynced": (states_unsynced, ("save-eager",), "RL9: committed_"),
    "model_unsynced": (model_unsynced, ("save-eager",), "RL9: committed_"),
    "retain_after_marker": (retain_after_marker, ("save-lazy",), "does not retain"),
    "seeded_before_builder": (seeded_before_builder, ("restore-salvage", "restore-exact"),
                              "neither never started nor restored"),
}
"""name -> (the patch, the workloads that must catch it, what the check that must catch
it says: a violation of another kind does not count)."""
