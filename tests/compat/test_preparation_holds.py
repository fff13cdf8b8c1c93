"""Preparation holds (``straw.holds``): a request that fails before its publication is
durable keeps its dependencies protected for its retry, until the retry succeeds, the
writer's store closes, the writer is retired, or a collection finds the writer dead
(straw-queue's documented behaviour)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from straw import Record, SharedFilesystemStore
from straw.errors import InvalidReference, UnknownCodec
from straw.holds import HOLD_PREFIX


def _store(root, **kw):
    return SharedFilesystemStore(root, "holds", segment_target_bytes=0, **kw)


def _bad(store, sid, deps):
    with pytest.raises(UnknownCodec):
        store.publish([Record("bad", b"x", codec="unsupported")], submission_id=sid,
                      dependencies=deps)


def _holds(store):
    return [o for o in store.owners() if o.startswith(HOLD_PREFIX)]


def _packs(root):
    return sorted(p for _, _, files in os.walk(root) for p in files if p.endswith(".pack"))


def test_a_failed_requests_dependencies_survive_their_release_until_the_retry(tmp_path):
    with _store(tmp_path) as source, _store(tmp_path) as writer:
        dep = source.publish([Record("dep", b"keep")], submission_id="dep")
        _bad(writer, "result", [dep])
        assert len(_holds(writer)) == 1
        source.release_publications([dep])
        assert source.collect_garbage()["reclaimed_files"] == 0
        assert next(source.read(dep)).payload == b"keep"
        # the retry with good content publishes and its edges take over from the hold
        result = writer.publish([Record("good", b"good")], submission_id="result",
                                dependencies=[dep])
        assert _holds(writer) == []
        assert source.collect_garbage()["reclaimed_files"] == 0
        assert next(source.read(dep)).payload == b"keep"
        writer.release_publications([result])
        got = writer.collect_garbage()  # (the writer's collection seals its full pack)
        assert got["owners"] == 0 and got["reclaimed_files"] == 2


def test_each_failed_request_has_its_own_hold_and_close_drops_them(tmp_path):
    with _store(tmp_path) as source:
        deps = [source.publish([Record(str(i), b"keep")], submission_id=str(i))
                for i in range(3)]
        writer = _store(tmp_path)
        for i, dep in enumerate(deps):
            _bad(writer, str(i), [dep])
        assert len(set(_holds(writer))) == 3
        source.release_publications(deps)
        assert source.collect_garbage()["reclaimed_files"] == 0
        writer.publish([Record("good", b"good")], submission_id="0", dependencies=deps[:1])
        assert len(_holds(writer)) == 2
        writer.close()
        assert _holds(source) == []
        assert source.collect_garbage()["reclaimed_files"] == 2  # deps 1 and 2
        assert next(source.read(deps[0])).payload == b"keep"  # the result's dependency


def test_retire_writer_drops_the_holds_of_the_retired_writer(tmp_path):
    with _store(tmp_path) as source:
        dep = source.publish([Record("dep", b"keep")], submission_id="dep")
        writer = _store(tmp_path, writer_id="retiring")
        _bad(writer, "result", [dep])
        writer.close()  # (its close dropped them already; fail again from a new one)
        writer = _store(tmp_path, writer_id="retiring")
        _bad(writer, "result", [dep])
        writer._writer.release()  # its process "stops" without closing: lock free
        writer._writer = None
        writer.closed = True
        assert len(_holds(source)) == 1
        assert source.retire_writer("retiring") == []
        assert _holds(source) == []
        source.release_publications([dep])
        assert source.collect_garbage()["reclaimed_files"] == 1


def _fail_and_die(root, writer_id, dep_dict):  # in a forked child: a process that dies
    from straw import RecordSetRef

    store = _store(root, writer_id=writer_id)
    try:
        store.publish([Record("bad", b"x", codec="unsupported")], submission_id="result",
                      dependencies=[RecordSetRef.from_dict(dep_dict)])
    except UnknownCodec:
        pass
    os._exit(0)  # no close: the hold stays, the writer lock goes with the process


def _die_after_failing(root, writer_id, dep):
    child = multiprocessing.get_context("fork").Process(
        target=_fail_and_die, args=(root, writer_id, dep.to_dict()))
    child.start()
    child.join(30)
    assert child.exitcode == 0


def test_a_collection_drops_the_holds_of_a_dead_writer(tmp_path):
    with _store(tmp_path) as source:
        dep = source.publish([Record("dep", b"keep")], submission_id="dep")
        _die_after_failing(str(tmp_path), "dies", dep)
        assert len(_holds(source)) == 1
        source.release_publications([dep])
        # the collection finds the writer dead and drops its hold; the next reclaims
        assert source.collect_garbage()["reclaimed_files"] == 0
        assert _holds(source) == []
        assert source.collect_garbage()["reclaimed_files"] == 1


def test_a_restarted_writer_keeps_its_predecessors_holds_for_its_retry(tmp_path):
    with _store(tmp_path) as source:
        dep = source.publish([Record("dep", b"keep")], submission_id="dep")
        _die_after_failing(str(tmp_path), "restarts", dep)
        source.release_publications([dep])
        with _store(tmp_path, writer_id="restarts") as again:
            again.publish([Record("other", b"o")], submission_id="other")  # writer starts
            assert again.collect_garbage()["reclaimed_files"] == 0  # its own holds: kept
            assert source.collect_garbage()["reclaimed_files"] == 0  # it is alive
            result = again.publish([Record("good", b"good")], submission_id="result",
                                   dependencies=[dep])
            assert _holds(again) == []
            again.release_publications([result])
        got = source.collect_garbage()
        # dep and result; "other" is still staged
        assert got["reclaimed_files"] == 2 and _holds(source) == []


def test_a_dependency_of_another_pool_gets_no_hold(tmp_path):
    with _store(tmp_path / "other") as other, _store(tmp_path / "pool") as writer:
        foreign = other.publish([Record("dep", b"x")], submission_id="dep")
        with pytest.raises(InvalidReference):
            writer.publish([Record("r", b"x")], submission_id="r", dependencies=[foreign])
        assert _holds(writer) == []


def test_a_record_set_names_each_record_once(tmp_path):
    with _store(tmp_path) as store:
        raw = store.write_records([Record("raw", b"x")], submission_id="raw")
        with pytest.raises(InvalidReference, match="names each record once"):
            store.record_set([*raw, *raw], submission_id="twice")
        # the failed request holds its members for a retry of it
        assert len(_holds(store)) == 1
        store.release_publications(raw)
        assert store.collect_garbage()["reclaimed_files"] == 0
        ref = store.record_set(raw, submission_id="twice")
        assert _holds(store) == [] and store.read_record(raw[0]).payload == b"x"
        store.release_publications([ref])
        assert store.collect_garbage()["reclaimed_files"] == 2  # the records', the set's
