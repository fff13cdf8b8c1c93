"""The coordinator's negative controls (``QUEUE_CONTROLS``): deliberately broken
coordinators, made by patching ``straw`` for the duration of a ``with`` block.  The
coordinator crash campaign (``fault_injection.queue_campaign``) and the queue fuzz
scenario (``fault_injection.queue_fuzz``) must report a violation under each."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from fault_injection.controls import NO_SYNC, SkipOps
from fault_injection.journal_campaign import JOURNAL_CONTROLS
from straw.catalog import Catalog
from straw.coordinator import Coordinator
from straw.fs import Filesystem
from straw.queue import history as history_mod


@contextlib.contextmanager
def _no_fencing() -> Iterator[None]:
    """The coordinator skips its fence check after each sync, and ignores the catalog's
    refusal of an old epoch: a paused old coordinator acknowledges."""
    fence, adopt = Coordinator._fence_check, Catalog.adopt

    def adopt_anyway(self: Catalog, *a: Any, **k: Any) -> bool:
        adopt(self, *a, **k)
        return True

    Coordinator._fence_check = lambda self: None  # type: ignore[method-assign]
    Catalog.adopt = adopt_anyway  # type: ignore[method-assign]
    try:
        yield
    finally:
        Coordinator._fence_check = fence  # type: ignore[method-assign]
        Catalog.adopt = adopt  # type: ignore[method-assign]


@contextlib.contextmanager
def _reply_before_durable() -> Iterator[None]:
    """The coordinator replies without waiting for its journal group to be durable."""
    orig = Coordinator._wait

    def wait(self: Coordinator, seq: int, adopted: Any = ()) -> None:
        j = self.journal
        j.wait = lambda seq: seq  # type: ignore[method-assign, assignment]
        try:
            orig(self, seq, adopted)
        finally:
            del j.wait

    Coordinator._wait = wait  # type: ignore[method-assign]
    try:
        yield
    finally:
        Coordinator._wait = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _no_started_mark() -> Iterator[None]:
    """The coordinator never marks its epoch started: a journal that lost every segment
    of the newest epoch recovers the older epoch's state."""
    orig = Coordinator._mark_started
    Coordinator._mark_started = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Coordinator._mark_started = orig  # type: ignore[method-assign]


@contextlib.contextmanager
def _history_not_durable() -> Iterator[None]:
    """History segments are written without fsync (spec H1 broken: the journal snapshot
    names a segment that a power loss may take away)."""
    orig = history_mod.write_segment

    def write(fs: Filesystem, *a: Any, **k: Any) -> Any:
        return orig(SkipOps(fs, NO_SYNC), *a, **k)  # type: ignore[arg-type]

    history_mod.write_segment = write  # type: ignore[assignment]
    try:
        yield
    finally:
        history_mod.write_segment = orig


QUEUE_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "queue-no-fencing": _no_fencing,
    "queue-reply-before-durable": _reply_before_durable,
    "queue-no-started-mark": _no_started_mark,
    "queue-journal-no-confirm": JOURNAL_CONTROLS["journal-no-confirm"],
    "queue-history-not-durable": _history_not_durable,
}
"""Deliberately broken coordinators: each must make the campaign report a violation."""
