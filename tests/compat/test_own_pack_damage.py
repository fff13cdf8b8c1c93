"""A store reading the pack it is itself writing: its own writes went through this client,
so there is no visibility lag to wait for.  A truncated or zeroed extent there is
``CorruptData`` at once (straw-queue's class; the read does not spend the retry window
first), its file moved away is ``StorageUnavailable`` (straw-queue's class; the store
reads again once it is back).  Another store of the pool, which may lag, still retries."""

from __future__ import annotations

import os
import time

import pytest

from straw import Record, SharedFilesystemStore
from straw.errors import CorruptData, StorageUnavailable

# a retry window long enough that spending it would show in the elapsed time
SLOW = {"visibility_retries": 6, "visibility_backoff": 0.2}


@pytest.mark.parametrize("cut", [1, 40, 150])
def test_own_truncated_pack_is_corrupt_data_at_once(tmp_path, cut):
    with SharedFilesystemStore(tmp_path, "run", **SLOW) as store:
        ref = store.publish([Record("r", b"payload" * 20)], submission_id="s")
        path = tmp_path / ref.path
        os.truncate(path, ref.offset + ref.size - cut)
        started = time.monotonic()
        with pytest.raises(CorruptData, match="this store wrote pack"):
            list(store.read(ref))
        assert time.monotonic() - started < 1.0  # no retry window spent


def test_own_zeroed_extent_is_corrupt_data_at_once(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", **SLOW) as store:
        ref = store.publish([Record("r", b"payload" * 20)], submission_id="s")
        with open(tmp_path / ref.path, "r+b") as f:
            f.seek(ref.offset)
            f.write(bytes(ref.size))
        started = time.monotonic()
        with pytest.raises(CorruptData):
            store.validate(ref)
        assert time.monotonic() - started < 1.0


def test_own_pack_moved_away_is_storage_unavailable_then_reads_again(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", **SLOW) as store:
        ref = store.publish([Record("r", b"payload")], submission_id="s")
        path = tmp_path / ref.path
        hidden = path.with_suffix(".hidden")
        path.rename(hidden)
        with pytest.raises(StorageUnavailable, match="which this store is writing"):
            next(store.read(ref))
        hidden.rename(path)
        assert next(store.read(ref)).payload == b"payload"


def test_another_store_still_treats_a_short_open_pack_as_lag(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as writer, \
            SharedFilesystemStore(tmp_path, "run", visibility_retries=2,
                                  visibility_backoff=0.01) as reader:
        ref = writer.publish([Record("r", b"payload" * 20)], submission_id="s")
        os.truncate(tmp_path / ref.path, ref.offset + ref.size - 10)
        # not this reader's pack: the writer's bytes may not be visible here yet
        with pytest.raises(StorageUnavailable, match="visibility lag"):
            list(reader.read(ref))
