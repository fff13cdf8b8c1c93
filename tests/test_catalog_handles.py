"""The catalog opens itself once per locked section (issue 13: a queue completion's
adoption is one locked section; an open is a round trip to the metadata server on
JuiceFS).  The refresh opens the catalog after the lock is taken (close-to-open
visibility) and the appends under that lock reuse the handle; it is closed before the
lock is released, also when an append fails."""

from __future__ import annotations

import errno
import os
import re

import pytest

from bench.counting import CountingFS
from fault_injection import FaultyFS
from straw import StorageUnavailable
from straw.catalog import CATALOG_NAME, Catalog
from straw.fs import PosixFS


class _PathCounts(CountingFS):
    """Counts opens and closes of one path's descriptors."""

    def __init__(self, inner, path: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.path = path
        self.fds: set[int] = set()
        self.opens = self.closes = 0

    def open(self, path: str, **kw) -> int:  # type: ignore[no-untyped-def, override]
        fd = super().open(path, **kw)
        if path == self.path:
            self.opens += 1
            self.fds.add(fd)
        return fd

    def close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.discard(fd)
            self.closes += 1
        super().close(fd)


def test_one_open_of_the_catalog_per_locked_section_with_appends(tmp_path):
    root = str(tmp_path)
    fs = _PathCounts(PosixFS(), os.path.join(root, CATALOG_NAME))
    cat = Catalog(fs, root, "run")
    cat.retain("warm", [])  # creates the catalog, its init and the lock descriptor
    held = set(fs.fds)  # the lock descriptor stays open for the handle's life
    fs.opens = fs.closes = 0
    for i in range(5):
        cat.pack_open(f"runs/run/packs/w/p{i}.pack")
        assert cat.adopt("queue:q", 1, add=[(f"runs/run/packs/w/p{i}.pack", 0)])
    with cat.locked():
        cat.append([{"op": "open", "path": "runs/run/packs/w/x.pack"}])
        cat.append([{"op": "open", "path": "runs/run/packs/w/y.pack"}])
    # 11 locked sections (5 pack_open, 5 adopt, 1 with two appends): one open each
    assert fs.opens == 11
    assert fs.closes == 11 and fs.fds == held  # nothing left open past its lock
    assert ("run", "queue:q") in cat.state.owners
    cat.close()


def test_a_failed_append_closes_the_handle_and_the_next_lock_works(tmp_path):
    root = str(tmp_path)
    faulty = FaultyFS(PosixFS())
    fs = _PathCounts(faulty, os.path.join(root, CATALOG_NAME))
    cat = Catalog(fs, root, "run")
    cat.retain("warm", [])
    held = set(fs.fds)
    faulty.plan.fail("fdatasync", errno.EIO, path=re.escape(CATALOG_NAME) + "$", count=1)
    with pytest.raises(StorageUnavailable):
        cat.pack_open("runs/run/packs/w/a.pack")
    assert fs.fds == held  # the section's handle was closed with the lock
    cat.pack_open("runs/run/packs/w/b.pack")
    assert fs.fds == held
    assert "runs/run/packs/w/b.pack" in cat.state.packs
    cat.close()
