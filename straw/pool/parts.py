"""What the parts of a store (publisher, retention, writer receipts) may use of the store
they belong to: its identity, its files, and the locks and checks every call goes through.
The store owns this state; a part holds its store and changes none of it but the writer's
slot (``_ensure_writer``)."""

from __future__ import annotations

import threading
from typing import Protocol

from ..clock import Clock
from ..fs import Filesystem
from ..read.session import ReadSession
from .catalog.catalog import Catalog
from .refs import RecordRef, RecordSetRef, SegmentRef
from .writer import WriterIncarnation


class StoreParts(Protocol):
    run_id: str
    root: str
    fs: Filesystem
    clock: Clock
    catalog: Catalog
    closed: bool
    _session: ReadSession
    _write_lock: threading.Lock
    _writer: WriterIncarnation | None

    @property
    def writer_id(self) -> str: ...

    def _check_open(self) -> None: ...

    def _check_process(self) -> None: ...

    def _in_forked_child(self) -> bool: ...

    def _ensure_writer(self) -> WriterIncarnation: ...

    def check_published(self, ref: RecordSetRef | RecordRef | SegmentRef,
                        where: str = "ref") -> None: ...
