"""The store on a real shared filesystem: two JuiceFS clients of one volume.

A writer publishes through mount ``a`` (with rotation, so new pack files keep appearing)
while a reader on mount ``b`` reads every acknowledged publication back, checked, as soon
as the writer replies — the close-to-open and visibility-lag paths of ``straw.reader``
on a real client, not a simulation."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from straw import Record, RecordSetRef, SharedFilesystemStore

pytestmark = pytest.mark.juicefs


def _payload(i: int) -> bytes:
    return np.random.default_rng(i).bytes(1000 + (i * 7919) % 300_000)


@pytest.mark.parametrize("reserve_bytes", [0, 4 << 20], ids=["append", "reserved"])
def test_publish_on_one_mount_read_on_the_other_while_appending(juicefs_dirs, reserve_bytes):
    n = 60
    acked: queue.Queue[tuple[int, RecordSetRef] | None] = queue.Queue()
    errors: list[BaseException] = []
    writer = SharedFilesystemStore(juicefs_dirs.a, "run", writer_id="w",
                                   segment_target_bytes=2 << 20, reserve_bytes=reserve_bytes)

    def publish() -> None:
        try:
            for i in range(n):
                ref = writer.publish([Record("r", _payload(i), metadata={"i": i})],
                                     submission_id=f"s{i}")
                acked.put((i, ref))
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)
        finally:
            acked.put(None)

    thread = threading.Thread(target=publish)
    thread.start()
    seen = []
    with SharedFilesystemStore(juicefs_dirs.b, "run") as reader:
        while (item := acked.get(timeout=120)) is not None:
            i, ref = item
            (rec,) = reader.read(ref)  # read on the other client while appends continue
            assert bytes(rec.payload) == _payload(i)
            assert rec.metadata == {"i": i}
            seen.append(ref)
        thread.join()
        writer.close()
        assert not errors, errors
        assert len(seen) == n
        assert len({r.path for r in seen}) >= 3, "rotation created several packs"
        # after the writer sealed and closed, everything still reads on the other mount
        for i, ref in enumerate(seen):
            assert bytes(next(reader.read(ref)).payload) == _payload(i)
    # a restarted writer on the *other* client finds the originals by submission id
    with SharedFilesystemStore(juicefs_dirs.b, "run", writer_id="w") as again:
        assert again.lookup_submission("s0") == (seen[0],)
        assert again.publish([Record("r", _payload(5), metadata={"i": 5})],
                             submission_id="s5") == seen[5]
