"""A pack's space reservation grows with the pack (``PackWriter._step``).

Nothing may trim the reserved zeros at the tail of a dead writer's open pack (a writer whose
lock expired may still append within its lock-check window, D4), so they stay on disk until
the pack is collected.  With a fixed 64 MiB step every short-lived writer (a generation
actor, a restarted job) left 64 MiB behind: the demo found 195 MB on disk for a 5 MB job.
The step now starts at 1 MiB and doubles with the pack up to ``reserve_bytes``.
"""

from __future__ import annotations

import os

from straw import Record, SharedFilesystemStore
from straw.pack import RESERVE_RAMP_FLOOR
from straw.store import DEFAULT_RESERVE
from tests.test_writer_gc import _killed_writer


def test_a_killed_writer_leaves_about_what_it_wrote_not_the_full_reservation(tmp_path):
    refs = _killed_writer(tmp_path, "short", "a", "b")  # 2 small publications, then SIGKILL
    (path,) = {ref.path for ref in refs.values()}
    size = os.path.getsize(tmp_path / path)
    # the killed writer asked for 1 MiB; under the default it asks for 64 MiB: see below
    assert size <= RESERVE_RAMP_FLOOR
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        store.publish([Record("x", b"x" * 100)], submission_id="x")
        own = store._writer.pack.path
        assert os.path.getsize(os.path.join(str(tmp_path), own)) == RESERVE_RAMP_FLOOR
        assert store.reserve_bytes == DEFAULT_RESERVE  # the default step is still the cap


def test_the_reservation_doubles_with_the_pack_up_to_reserve_bytes(tmp_path):
    cap = 4 << 20
    payload = b"z" * (512 << 10)
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w",
                               reserve_bytes=cap, segment_target_bytes=1 << 30) as store:
        sizes, ends = [], []
        for i in range(48):  # 24 MiB in 512 KiB publications
            store.publish([Record(f"r{i}", payload)], submission_id=f"s{i}")
            pack = store._writer.pack
            sizes.append(os.path.getsize(os.path.join(str(tmp_path), pack.path)))
            ends.append(pack.data_end)
    steps = sorted({b - a for a, b in zip(sizes, sizes[1:], strict=False) if b > a})
    # 1, 1, 2 MiB while the pack is small, then the cap (4 MiB) from there on
    assert steps[0] == RESERVE_RAMP_FLOOR and steps[-1] == cap
    assert all(s in (1 << 20, 2 << 20, cap) for s in steps), steps
    # reserved zeros past the data: at most the floor or what the pack holds (its doubling),
    # and never more than the cap
    assert all(size - end <= min(cap, max(RESERVE_RAMP_FLOOR, end))
               for size, end in zip(sizes, ends, strict=True))
    # a handful of reservations for 24 MiB: sustained writes still land in reserved space
    growths = sum(b > a for a, b in zip(sizes, sizes[1:], strict=False))
    assert growths <= 3 + 24 // 4 + 1


def test_a_small_cap_is_used_as_is(tmp_path):
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w",
                               reserve_bytes=16 << 10) as store:
        store.publish([Record("a", b"a" * 100)], submission_id="a")
        assert os.path.getsize(os.path.join(str(tmp_path), store._writer.pack.path)) == 16 << 10
