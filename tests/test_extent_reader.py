"""Whole-extent reads (``straw.read.extent_reader``): a body that fails its checksum
and ends in zero pages may be another client's partial view, and is reread; the check
of that rule reads the pass's payload buffers, which must still be alive then."""

from __future__ import annotations

import os

import pytest

from straw import CorruptData, Record, SharedFilesystemStore
from straw.clock import ManualClock


@pytest.mark.parametrize("size", [100_000, 2 << 20, 8 << 20])
def test_a_zero_tail_that_persists_is_corrupt_data(tmp_path, size):
    writer = SharedFilesystemStore(str(tmp_path), "r", writer_id="w")
    try:
        ref = writer.publish([Record("h", os.urandom(size))], submission_id="h")
        end = ref.offset + ref.size
        cut = (end - 30000) // 4096 * 4096  # zeros from a page boundary to the end
        with open(tmp_path / ref.path, "r+b") as f:
            f.seek(cut)
            f.write(bytes(end - cut))
        clock = ManualClock()
        start = clock.now()
        with SharedFilesystemStore(str(tmp_path), "r", writer_id="r", clock=clock) as reader:
            for read in (lambda: list(reader.read(ref)), lambda: reader.validate(ref)):
                with pytest.raises(CorruptData, match="extent body checksum mismatch"):
                    read()
        assert clock.now() > start  # the open pack's zero tail was waited for, then refused
    finally:
        writer.close()
