"""``store.hold`` / ``release_hold``: retention that lives as long as its writer
(``straw.holds``), so a step killed before it names what it kept leaves nothing for ever."""

from __future__ import annotations

import subprocess
import sys

import pytest

from straw import Record, SharedFilesystemStore
from straw.holds import HOLD_PREFIX

_DIES_HOLDING = """
import os, signal, sys
from straw import Record, SharedFilesystemStore
store = SharedFilesystemStore(sys.argv[1], "job", writer_id="saver")
ref = store.publish([Record("r", b"x" * 4096)], submission_id="s")
store.seal()
store.hold("step-1", [ref])
store.release_publications([ref])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_hold_keeps_data_until_released(tmp_path):
    with SharedFilesystemStore(tmp_path, "job") as store:
        ref = store.publish([Record("r", b"x")], submission_id="s")
        store.seal()
        store.hold("step-1", [ref])
        store.release_publications([ref])
        assert [o for o in store.owners() if o.startswith(HOLD_PREFIX)]
        assert store.collect_garbage()["reclaimed_files"] == 0
        assert store.release_hold("step-1") is True
        assert store.release_hold("step-1") is False
        assert store.owners() == []
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_a_store_drops_its_holds_when_it_closes(tmp_path):
    with SharedFilesystemStore(tmp_path, "job") as store:
        ref = store.publish([Record("r", b"x")], submission_id="s")
        store.hold("k", [ref])
    with SharedFilesystemStore(tmp_path, "job") as store:
        assert store.owners() == []


def test_a_dead_writers_hold_goes_at_the_next_collection(tmp_path):
    p = subprocess.run([sys.executable, "-c", _DIES_HOLDING, str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode < 0, p.stderr
    with SharedFilesystemStore(tmp_path, "job") as store:
        assert [o for o in store.owners() if o.startswith(HOLD_PREFIX)]
        store.collect_garbage()
        assert store.owners() == []
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_hold_names_are_checked_like_owners(tmp_path):
    with SharedFilesystemStore(tmp_path, "job") as store:
        ref = store.publish([Record("r", b"x")], submission_id="s")
        with pytest.raises(ValueError, match="reserved prefix"):
            store.hold("queue:x", [ref])
        with pytest.raises(TypeError):
            store.release_hold(7)  # type: ignore[arg-type]
