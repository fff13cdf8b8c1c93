"""A pack's space reservation: blocks allocated past the end of file, growing with the pack
(``PackWriter._step``), while the file's size is always what was written.

Nothing may trim the reserved blocks of a dead writer's open pack (a writer whose lock
expired may still append within its lock-check window, D4), so they stay allocated until
the pack is collected.  With a fixed 64 MiB step every short-lived writer (a generation
actor, a restarted job) left 64 MiB behind: the demo found 195 MB on disk for a 5 MB job.
The step now starts at 1 MiB and doubles with the pack up to ``reserve_bytes``.  The
reservation keeps the file size (``FALLOC_FL_KEEP_SIZE``): callers that size a pool by its
``*.pack`` files see their data (``tests/compat/test_pack_files.py``).
"""

from __future__ import annotations

import os

import pytest

from straw import Record, SharedFilesystemStore
from straw.fs import PosixFS
from straw.pack import RESERVE_RAMP_FLOOR
from straw.store import DEFAULT_RESERVE
from tests.test_writer_gc import _killed_writer


@pytest.fixture(autouse=True)
def _reserving_filesystem(tmp_path):
    fd = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT)
    try:
        supported = PosixFS().reserve(fd, 0, 4096)
    finally:
        os.close(fd)
        os.unlink(tmp_path / "probe")
    if not supported:
        pytest.skip("this filesystem has no fallocate(FALLOC_FL_KEEP_SIZE): packs append")


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_killed_writer_leaves_what_it_wrote_and_about_the_floor_allocated(tmp_path):
    refs = _killed_writer(tmp_path, "short", "a", "b")  # 2 small publications, then SIGKILL
    (path,) = {ref.path for ref in refs.values()}
    end = max(ref.offset + ref.size for ref in refs.values())
    assert os.path.getsize(tmp_path / path) == end  # the size is what was written
    # the killed writer reserved 1 MiB; under the default it would reserve 64 MiB: see below
    assert _allocated(tmp_path / path) <= RESERVE_RAMP_FLOOR + 4096
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        store.publish([Record("x", b"x" * 100)], submission_id="x")
        pack = store._writer.pack
        own = os.path.join(str(tmp_path), pack.path)
        assert os.path.getsize(own) == pack.data_end
        assert _allocated(own) >= RESERVE_RAMP_FLOOR
        assert store.reserve_bytes == DEFAULT_RESERVE  # the default step is still the cap


def test_the_reservation_doubles_with_the_pack_up_to_reserve_bytes(tmp_path):
    cap = 4 << 20
    payload = b"z" * (512 << 10)
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w",
                               reserve_bytes=cap, segment_target_bytes=1 << 30) as store:
        reserved, ends = [], []
        for i in range(48):  # 24 MiB in 512 KiB publications
            store.publish([Record(f"r{i}", payload)], submission_id=f"s{i}")
            pack = store._writer.pack
            path = os.path.join(str(tmp_path), pack.path)
            assert os.path.getsize(path) == pack.data_end
            reserved.append(pack.reserved)
            ends.append(pack.data_end)
        assert _allocated(path) >= pack.reserved  # the blocks are really allocated
    steps = sorted({b - a for a, b in zip(reserved, reserved[1:], strict=False) if b > a})
    # 1, 1, 2 MiB while the pack is small, then the cap (4 MiB) from there on
    assert steps[0] == RESERVE_RAMP_FLOOR and steps[-1] == cap
    assert all(s in (1 << 20, 2 << 20, cap) for s in steps), steps
    # reserved blocks past the data: at most the floor or what the pack holds (its
    # doubling), and never more than the cap
    assert all(r - end <= min(cap, max(RESERVE_RAMP_FLOOR, end))
               for r, end in zip(reserved, ends, strict=True))
    # a handful of reservations for 24 MiB: sustained writes still land in reserved space
    growths = sum(b > a for a, b in zip(reserved, reserved[1:], strict=False))
    assert growths <= 3 + 24 // 4 + 1


def test_a_small_cap_is_used_as_is(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w",
                               reserve_bytes=16 << 10) as store:
        store.publish([Record("a", b"a" * 100)], submission_id="a")
        pack = store._writer.pack
        assert pack.reserved == 16 << 10
        assert os.path.getsize(os.path.join(str(tmp_path), pack.path)) == pack.data_end


def test_sealing_frees_the_unused_reservation(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        ref = store.publish([Record("a", b"a" * 100)], submission_id="a")
        path = tmp_path / ref.path
        assert _allocated(path) >= RESERVE_RAMP_FLOOR
    # closing the store sealed its pack: the size is its data and index, and the blocks
    # past it are released
    assert _allocated(path) <= -(-os.path.getsize(path) // 4096) * 4096
