"""``straw.store.MAX_RECORDS``: straw-queue's records per segment, which its callers (vime's
sample codec) batch ``publish_many`` by.  Same value; neither library refuses a call
past it, so code that batches by it and code that does not both keep working."""

from __future__ import annotations

from straw import Publication, Record, SharedFilesystemStore
from straw.store import MAX_RECORDS


def test_the_constant_has_straw_queues_value():
    assert MAX_RECORDS == 10_000


def test_a_caller_batching_by_it_and_one_that_does_not_read_back_the_same(tmp_path):
    store = SharedFilesystemStore(tmp_path, "batches")
    pubs = [Publication([Record(f"r{i}", i.to_bytes(2, "little"))]) for i in range(6_000)]
    whole = store.publish_many(pubs, submission_id="whole")  # 12,000 records with manifests
    batched, start = [], 0
    while start < len(pubs):  # one manifest per publication counts, as straw-queue's does
        stop = min(len(pubs), start + MAX_RECORDS // 2)
        batched += store.publish_many(pubs[start:stop], submission_id=f"b{start}")
        start = stop
    assert len(whole) == len(batched) == len(pubs)
    for a, b in ((whole[0], batched[0]), (whole[-1], batched[-1])):
        assert [r.payload for r in store.read(a)] == [r.payload for r in store.read(b)]
    store.close()
