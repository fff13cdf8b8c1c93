"""A submission id names one request per publishing call, as in straw-queue 0.1.6: the
records and the record set of one request may share it; each call's retry is answered
from its own receipt, also after the writer restarts."""

from __future__ import annotations

import pytest

from straw import Record, SharedFilesystemStore
from straw.errors import IdempotencyConflict


def _request(store: SharedFilesystemStore):
    refs = store.write_records([Record("q", b"question"), Record("a", b"answer")],
                               submission_id="req-1")
    subset = store.record_set(list(refs[1:]), submission_id="req-1")
    summary = store.publish([Record("s", b"summary")], submission_id="req-1",
                            dependencies=[subset])
    return refs, subset, summary


def test_one_request_id_through_each_call_and_their_retries(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", writer_id="w1") as store:
        refs, subset, summary = _request(store)
        assert [r.payload for r in store.read(subset)] == [b"answer"]
        assert (refs, subset, summary) == _request(store)  # every retry: its own answer
        with pytest.raises(IdempotencyConflict, match="through record_set"):
            store.record_set(list(refs), submission_id="req-1")  # other content, same call
        assert store.lookup_submission("req-1") == (summary,)


def test_each_calls_receipt_survives_a_writer_restart(tmp_path):
    with SharedFilesystemStore(tmp_path, "run", writer_id="w1") as store:
        refs, subset, summary = _request(store)
    with SharedFilesystemStore(tmp_path, "run", writer_id="peer") as peer:
        assert peer.publication_receipt("w1", api="records", submission_id="req-1") == list(refs)
        assert peer.publication_receipt("w1", api="record_set",
                                        submission_id="req-1") == [subset]
        assert peer.publication_receipt("w1", api="publish", submission_id="req-1") == [summary]
    with SharedFilesystemStore(tmp_path, "run", writer_id="w1") as again:
        assert (refs, subset, summary) == _request(again)  # answered from recovered receipts
        assert again.metrics["records"] == 0  # nothing written twice
