"""Retaining many references confirms their publications in bulk (issue 15's restore
cost): ``ReadSession.confirm_published`` reads neighbouring extents' frame headers in one
read per pack span, and whatever it does not confirm is checked one by one, so the errors
(D4: what an owner retains must exist) stay those of ``check_published``."""

from __future__ import annotations

import pytest

from bench.counting import CountingFS
from straw import (
    Coordinator,
    InvalidReference,
    Publication,
    Record,
    SharedFilesystemStore,
    TaskSpec,
)
from straw.clock import ManualClock
from straw.errors import ExtentMismatch
from straw.fs import PosixFS
from tests.refedit import edited

N = 300


def _store(root, **kw) -> SharedFilesystemStore:  # type: ignore[no-untyped-def]
    kw.setdefault("reserve_bytes", 0)
    kw.setdefault("clock", ManualClock())
    kw.setdefault("visibility_retries", 1)
    return SharedFilesystemStore(str(root), "run", **kw)


def _refs(root):  # type: ignore[no-untyped-def]
    with _store(root, writer_id="w") as w:
        return w.publish_many([Publication([Record(f"r{i}", b"x" * 50)]) for i in range(N)],
                              submission_id="many")


def test_retaining_many_refs_reads_their_headers_in_bulk(tmp_path):
    refs = _refs(tmp_path)
    fs = CountingFS(PosixFS())
    with _store(tmp_path, fs=fs) as store:  # a fresh session: no manifest cached
        before = fs.snapshot()
        store.retain("branch", refs)
        reads = fs.delta(before).get("readinto", 0)
        assert reads <= 3, f"{reads} reads to retain {N} references of one pack"
        assert "branch" in store.owners()


@pytest.mark.parametrize("change, error", [
    ({"checksum": "0" * 32}, InvalidReference),
    ({"size": 10_000}, ExtentMismatch),
])
def test_an_edited_ref_among_many_is_refused_by_name_and_nothing_is_retained(
        tmp_path, change, error):
    refs = list(_refs(tmp_path))
    refs[137] = edited(refs[137], **change)
    with _store(tmp_path) as store:
        with pytest.raises(error, match=r"refs\[137\]"):
            store.retain("branch", refs)
        assert "branch" not in store.owners()
        confirmed = store._session.confirm_published([r.segment for r in refs])
        assert confirmed == [i != 137 for i in range(N)]


def test_a_ref_to_the_middle_of_an_extent_is_not_confirmed(tmp_path):
    refs = _refs(tmp_path)
    bad = edited(refs[5], offset=refs[5].offset + 8)
    with _store(tmp_path) as store:
        assert store._session.confirm_published([bad.segment, refs[6].segment]) == \
            [False, True]
        with pytest.raises((InvalidReference, ExtentMismatch)):
            store.retain("branch", [refs[6], bad])
        assert "branch" not in store.owners()


def test_tasks_sharing_one_input_confirm_it_once(tmp_path, monkeypatch):
    """D2 asks each reference a queue roots to name a publication; tasks seeded with one
    shared prompt input (a restore's) ask it once, not once per task."""
    with _store(tmp_path, writer_id="w") as store:
        ref = store.publish([Record("prompt", b"p")], submission_id="prompt")
        asked: list[object] = []
        real = store.check_published_many

        def counting(refs, where):  # type: ignore[no-untyped-def]
            asked.extend(refs)
            real(refs, where)

        monkeypatch.setattr(store, "check_published_many", counting)
        coord = Coordinator(store, queue_id="q", namespace="t")
        try:
            coord.submit_tasks("seed", [TaskSpec(f"t{i}", input_ref=ref) for i in range(50)])
            assert asked == [ref]
            assert len(coord.pending_tasks()) == 50
        finally:
            coord.close()


def test_a_queue_confirms_fresh_inputs_in_bulk(tmp_path):
    """D2's check of a refill's fresh inputs (neighbours in one pack, no manifest read
    yet): their frame headers in a read or two, not one read each; a reference that
    names no publication is still refused, naming the queue, and nothing is submitted."""
    refs = _refs(tmp_path)
    fs = CountingFS(PosixFS())
    with _store(tmp_path, fs=fs, writer_id="q") as store:  # a fresh session: none cached
        coord = Coordinator(store, queue_id="q", namespace="t")
        try:
            before = fs.snapshot()
            coord.submit_tasks("seed", [TaskSpec(f"t{i}", input_ref=r)
                                        for i, r in enumerate(refs)])
            reads = fs.delta(before).get("readinto", 0)
            assert reads <= 3, f"{reads} reads to confirm {N} inputs of one pack"
            assert len(coord.pending_tasks()) == N
            bad = edited(refs[3], offset=refs[3].offset + 8)
            with pytest.raises((InvalidReference, ExtentMismatch), match="queue"):
                coord.submit_tasks("bad", [TaskSpec("u", input_ref=bad)])
            assert coord.task_status("u") is None
        finally:
            coord.close()
