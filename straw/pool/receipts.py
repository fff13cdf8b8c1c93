"""Other writers of a store's run, seen from it: what a writer published under a
submission id (a receipt, e.g. after a lost reply), and a writer's retirement for good.
Asking about another writer takes its lock for a moment (``straw.pool.role_lock``), so its
packs are then written by nobody; a live writer is read without it, its acknowledged
publications being durable and immutable.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from ..errors import CorruptData, WriterBusy
from . import hold_owners, role_lock
from .arguments import check_submission_id
from .parts import StoreParts
from .publisher import API_CALLS
from .recovery import incarnations, recover_writer
from .refs import RecordRef, RecordSetRef, check_name
from .writer import RETIRED, Submission


class WriterReceipts:
    """The receipt and retirement calls of one store (their contract is the store's; see
    there)."""

    def __init__(self, store: StoreParts) -> None:
        self._store = store

    def publication_receipt(self, writer_id: str, *, api: str, submission_id: str
                            ) -> list[RecordSetRef] | list[RecordRef] | None:
        store = self._store
        store._check_process()
        check_name("writer_id", writer_id)
        if api not in API_CALLS:
            raise ValueError(f"api must be one of {', '.join(sorted(API_CALLS))}, got "
                             f"{api!r}")
        check_submission_id(submission_id)
        if writer_id == store.writer_id:
            with store._write_lock:
                store._check_open()
                if store._writer is not None:
                    known = store._writer.index.get((api, submission_id))
                    return _receipt(known, api)
        try:
            with self._other_writer(writer_id) as (rel_dir, writer_dir):
                if not store.fs.exists(writer_dir):
                    if writer_id == store.writer_id:
                        return None  # this store's own writer, which published nothing
                    # straw-queue: an unknown writer is a ValueError (a wrong id), not
                    # "nothing published" (a writer creates its directory durably before
                    # its first publication is acknowledged)
                    raise ValueError(
                        f"run {store.run_id!r} has no writer {writer_id!r} at {store.root}: "
                        "it never published here; pass the writer_id of the store that "
                        "sent the request (store.writer_id)")
                history = recover_writer(store.fs, store.root, store.run_id, rel_dir,
                                         store.catalog, incarnations(store.fs, writer_dir))
        except WriterBusy as busy:
            return _receipt(self._live_writer_receipt(writer_id, api, submission_id, busy),
                            api)
        return _receipt(history.index.get((api, submission_id)), api)

    def _live_writer_receipt(self, writer_id: str, api: str, submission_id: str,
                             busy: WriterBusy) -> Submission:
        """A live writer's acknowledged publication: durable and immutable in its packs,
        so reading it needs no lock; its absence proves nothing (``busy`` is raised)."""
        store = self._store
        rel_dir = f"runs/{store.run_id}/writers/{writer_id}"
        try:
            history = recover_writer(store.fs, store.root, store.run_id, rel_dir, store.catalog,
                                     incarnations(store.fs, os.path.join(store.root, rel_dir)),
                                     live=True)
        except CorruptData:
            raise busy from None  # a frame being written: cannot tell yet
        known = history.index.get((api, submission_id))
        if known is None:
            raise WriterBusy(f"{busy}: it has published nothing durable under {api} "
                             f"submission {submission_id!r} yet, and the request may still "
                             "be in flight there") from None
        return known

    def retire_writer(self, writer_id: str, *, policy: str = "recover"
                      ) -> list[RecordSetRef] | list[Any]:
        store = self._store
        store._check_process()
        check_name("writer_id", writer_id)
        if policy not in ("recover", "abandon"):
            raise ValueError(f"policy must be 'recover' or 'abandon', got {policy!r}")
        if writer_id == store.writer_id and store._writer is not None:
            raise WriterBusy(f"writer {writer_id!r} is this store's own, live writer; close "
                             "the store first (or retire it from another store)")
        with self._other_writer(writer_id) as (rel_dir, writer_dir):
            if not store.fs.exists(writer_dir):
                raise ValueError(f"run {store.run_id!r} has no writer {writer_id!r} at "
                                 f"{store.root}")
            history = recover_writer(store.fs, store.root, store.run_id, rel_dir, store.catalog,
                                     incarnations(store.fs, writer_dir))
            store.fs.write_file_durable(os.path.join(writer_dir, RETIRED), json.dumps(
                {"retired_by": store.writer_id, "at": store.clock.now()}).encode())
            store.catalog.seal_if_open(history.packs, prefix=f"{rel_dir}/")
            # its failed requests will never be retried: their holds go (both policies)
            hold_owners.release_all(store.catalog, hold_owners.holds_of(store.catalog, writer_id))
        if policy == "abandon":
            return []
        staged: list[Any] = []
        with store.catalog.locked() as st:
            for sub in history.index.values():
                live = []
                for r in sub.refs:
                    info = st.packs.get(r.path)
                    if info is not None and not info.tombstoned \
                            and r.offset not in info.unstaged:
                        live.append(r)
                if len(live) == len(sub.refs):  # as publication_receipt reports them
                    staged.extend(_receipt(sub, sub.api) or ())
        return staged

    @contextlib.contextmanager
    def _other_writer(self, writer_id: str) -> Iterator[tuple[str, str]]:
        """Hold writer ``writer_id``'s lock for a moment (``WriterBusy`` if a live store
        holds it): its packs are then written by nobody."""
        store = self._store
        rel_dir = f"runs/{store.run_id}/writers/{writer_id}"
        writer_dir = os.path.join(store.root, rel_dir)
        if not store.fs.exists(writer_dir):
            yield rel_dir, writer_dir
            return
        fd, holder_desc = role_lock.take(store.fs, os.path.join(writer_dir, "LOCK"),
                                         store.clock,
                                         purpose=f"store of writer {store.writer_id} asking")
        if fd is None:
            raise WriterBusy(f"writer {writer_id!r} of run {store.run_id!r} is in use by "
                             f"{holder_desc}; retry once it is closed")
        try:
            yield rel_dir, writer_dir
        finally:
            role_lock.release(store.fs, fd)


def _receipt(known: Submission | None, api: str) -> list[Any] | None:
    """A submission as ``publication_receipt`` reports it: None unless published through
    ``api``; record references for ``write_records``."""
    if known is None or known.api != api:
        return None
    if api == "records":
        (ref,) = known.refs
        return [RecordRef(ref.segment, i) for i in range(ref.records)]
    return list(known.refs)

