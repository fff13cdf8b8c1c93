"""Debug archives (issue 16): save, open, keys, load_samples, release, bad input (``.pt``
dumps: test_archive_pt.py; replay selection: test_replay.py).  What each test pins is in
its name; the claims are the module docstring's (``straw.rollout.archive``)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from straw import Record, SharedFilesystemStore
from straw.errors import CorruptData, InvalidReference, OwnerMismatch, UnsupportedSchema
from straw.refs import RecordSetRef
from straw.rollout import RolloutArchive, Sample, Status
from straw.rollout.archive import ADJACENT_POOL, ADJACENT_RUN, CHUNK_SAMPLES, FORMAT, VERSION
from straw.tensor import TensorRef

from .pool import published_samples


def _sample(i: int, *, index: int | None = -1, task: bool = True,
            routes: object = None) -> Sample:
    tokens = tuple(range(i, i + 8))
    return Sample(("prompt", i), tokens=tokens, response_length=4, status=Status.COMPLETED,
                  reward=float(i), group_index=i, index=i if index == -1 else index,
                  metadata={"task_id": f"prompt:{i}"} if task else {}, routes=routes)


def _routes(i: int) -> np.ndarray:
    return np.full((7, 4, 2), i, dtype=np.int32)


@pytest.fixture
def pool(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "job")
    yield store
    store.close()


def _archive(tmp_path, store, samples, name="rollout_7.straw.json", **kw):
    return RolloutArchive.save(tmp_path / name, samples, rollout_id=kw.pop("rollout_id", 7),
                               store=store, **kw)


def _index(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _rewrite(path, index: dict) -> None:
    os.chmod(path, 0o644)
    with open(path, "w") as f:
        json.dump(index, f)


# --- save and the index ---------------------------------------------------------------


def test_index_names_format_pool_run_manifest_owner_and_every_sample(tmp_path, pool):
    samples = [_sample(0), _sample(1, index=None),
               dataclasses.replace(_sample(2, task=False), group_index=None)]
    path = _archive(tmp_path, pool, samples)
    index = _index(path)
    assert (index["format"], index["version"]) == (FORMAT, VERSION)
    assert (index["rollout_id"], index["evaluation"]) == (7, False)
    assert (index["root"], index["pool_id"], index["run_id"]) == \
        (pool.root, pool.pool_id, "job")
    owner = index["storage_owner"]
    assert owner.startswith("archive:7:") and owner in pool.owners()
    deps = pool.checked_manifest(RecordSetRef.from_dict(index["manifest"])).dependencies
    assert [d.to_dict() for d in deps] == index["chunks"]
    assert index["samples"] == [
        {"sample_key": "sample:0", "task_key": "prompt:0", "group_index": 0, "chunk": 0,
         "ordinal": 0},
        {"sample_key": "position:1", "task_key": "prompt:1", "group_index": 1, "chunk": 0,
         "ordinal": 1},
        {"sample_key": "sample:2", "task_key": None, "group_index": None, "chunk": 0,
         "ordinal": 2}]
    assert len(index["checksum"]) == 64


def test_evaluation_rollouts_use_eval_id(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)], rollout_id="eval_3",
                    name="eval_3.straw.json")
    index = _index(path)
    assert (index["rollout_id"], index["evaluation"]) == (3, True)
    assert index["storage_owner"].startswith("archive:eval_3:")
    with RolloutArchive(path) as archive:
        assert archive.key == "eval_3"


def test_samples_are_packed_in_chunks_in_one_write(tmp_path, pool):
    samples = [_sample(i) for i in range(2 * CHUNK_SAMPLES + 2)]
    before = pool.metrics["segments"]
    path = _archive(tmp_path, pool, samples)
    index = _index(path)
    assert len(index["chunks"]) == 3
    assert [e["chunk"] for e in index["samples"]] == \
        [i // CHUNK_SAMPLES for i in range(len(samples))]
    # three chunks and the manifest: four publications, not one per sample
    assert pool.metrics["segments"] - before == 4


def test_large_copied_rollouts_are_written_in_batches(tmp_path, pool, monkeypatch):
    from straw.rollout import archive as archive_module
    monkeypatch.setattr(archive_module, "WRITE_BATCH_BYTES", 1)  # every chunk at once
    calls = []
    real = pool.publish_many
    monkeypatch.setattr(pool, "publish_many",
                        lambda pubs, **kw: calls.append(len(pubs)) or real(pubs, **kw))
    samples = [_sample(i, routes=_routes(i)) for i in range(2 * CHUNK_SAMPLES + 1)]
    path = _archive(tmp_path, pool, samples)
    assert calls == [1, 1, 1, 1]  # three chunks, then the manifest alone
    with RolloutArchive(path) as archive:
        for i in (0, CHUNK_SAMPLES, 2 * CHUNK_SAMPLES):
            got = archive.load_samples(sample_key=f"sample:{i}")[0]
            np.testing.assert_array_equal(got.routes.load(framework="numpy"), _routes(i))


def test_tensors_already_in_the_pool_are_shared_not_copied(tmp_path, pool):
    big = [np.full((255, 16, 8), i, dtype=np.int32) for i in range(4)]  # 130 KB each
    samples = published_samples(pool, [Sample(("p", i), tokens=tuple(range(256)),
                                       response_length=8, status=Status.COMPLETED,
                                       reward=1.0, index=i, routes=big[i])
                                for i in range(4)])
    before = pool.metrics["payload_bytes"]
    path = _archive(tmp_path, pool, samples)
    new = pool.metrics["payload_bytes"] - before
    assert new < 8 * 1024, new  # token ids and pointers, none of the 520 KB of routes
    with RolloutArchive(path) as archive:
        got = archive.load_samples(sample_key="sample:2")[0]
        assert isinstance(got.routes, TensorRef)
        assert got.routes.record_ref == samples[2].routes.record_ref
        np.testing.assert_array_equal(got.routes.load(framework="numpy"), big[2])


def test_in_memory_captures_round_trip(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(i, routes=_routes(i)) for i in range(3)])
    with RolloutArchive(path) as archive:
        got = archive.load_samples(sample_key="sample:1")
        assert got == [_sample(1)]  # (captures are compared by nothing)
        np.testing.assert_array_equal(got[0].routes.load(framework="numpy"), _routes(1))


def test_tensors_of_another_pool_are_copied_in(tmp_path, pool):
    other = SharedFilesystemStore(tmp_path / "other", "job")
    samples = published_samples(other, [_sample(i, routes=_routes(i)) for i in range(2)])
    path = _archive(tmp_path, pool, samples)
    other.close()
    shutil.rmtree(tmp_path / "other")
    with RolloutArchive(path) as archive:
        got = archive.load_samples(sample_key="sample:1")[0]
        np.testing.assert_array_equal(got.routes.load(framework="numpy"), _routes(1))


def test_without_a_store_it_creates_a_straw_data_pool_next_to_the_index(tmp_path):
    path = RolloutArchive.save(tmp_path / "d" / "r.straw.json", [_sample(0, routes=_routes(0))],
                               rollout_id=0)
    index = _index(path)
    assert index["root"] == str(tmp_path / "d" / ADJACENT_POOL)
    assert index["run_id"] == ADJACENT_RUN
    assert os.path.exists(tmp_path / "d" / ADJACENT_POOL / "POOL")
    with RolloutArchive(path) as archive:
        assert archive.keys() == [("sample:0", "prompt:0")]


def test_an_adjacent_pool_moved_with_its_index_is_found_beside_it(tmp_path):
    RolloutArchive.save(tmp_path / "d" / "r.straw.json", [_sample(0, routes=_routes(0))],
                        rollout_id=0)
    shutil.move(tmp_path / "d", tmp_path / "moved")
    with RolloutArchive(tmp_path / "moved" / "r.straw.json") as archive:
        got = archive.load_samples(sample_key="sample:0")[0]
        np.testing.assert_array_equal(got.routes.load(framework="numpy"), _routes(0))
        assert archive._store.root == str(tmp_path / "moved" / ADJACENT_POOL)
    shutil.rmtree(tmp_path / "moved" / ADJACENT_POOL)
    with pytest.raises(FileNotFoundError, match="is missing"):
        RolloutArchive(tmp_path / "moved" / "r.straw.json")
    assert not os.path.exists(tmp_path / "moved" / ADJACENT_POOL)


def test_an_empty_rollout_is_an_empty_archive(tmp_path, pool):
    with RolloutArchive(_archive(tmp_path, pool, [])) as archive:
        assert archive.keys() == [] and len(archive) == 0
        with pytest.raises(KeyError):
            archive.load_samples(sample_key="sample:0")


def test_saving_over_an_existing_path_is_refused_and_writes_nothing(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    before, owners, data = pool.metrics["segments"], pool.owners(), open(path).read()
    with pytest.raises(FileExistsError, match="immutable"):
        _archive(tmp_path, pool, [_sample(1)])
    assert (pool.metrics["segments"], pool.owners(), open(path).read()) == \
        (before, owners, data)


@pytest.mark.parametrize("bad, error", [
    (-1, ValueError), ("eval_x", ValueError), ("7", ValueError), (True, ValueError),
    (None, ValueError)])
def test_a_bad_rollout_id_is_refused(tmp_path, pool, bad, error):
    before = pool.metrics["segments"]
    with pytest.raises(error, match="rollout_id"):
        _archive(tmp_path, pool, [_sample(0)], rollout_id=bad)
    assert pool.metrics["segments"] == before and pool.owners() == []
    assert not os.path.exists(tmp_path / "rollout_7.straw.json")


def test_bad_paths_and_samples_are_refused(tmp_path, pool):
    with pytest.raises(ValueError, match=r"\.straw\.json"):
        RolloutArchive.save(tmp_path / "r.json", [_sample(0)], rollout_id=0, store=pool)
    with pytest.raises(TypeError, match=r"samples\[1\]"):
        _archive(tmp_path, pool, [_sample(0), "not a sample"])
    with pytest.raises(TypeError, match="list"):
        _archive(tmp_path, pool, _sample(0))
    assert pool.owners() == [] and not os.path.exists(tmp_path / "rollout_7.straw.json")


# --- keys and lookups -----------------------------------------------------------------


def test_keys_in_archive_order_with_duplicates(tmp_path, pool):
    samples = [_sample(3), _sample(1), _sample(3), _sample(9, index=None, task=False)]
    with RolloutArchive(_archive(tmp_path, pool, samples)) as archive:
        assert archive.keys() == [("sample:3", "prompt:3"), ("sample:1", "prompt:1"),
                                  ("sample:3", "prompt:3"), ("position:3", None)]
        assert len(archive.load_samples(sample_key="sample:3")) == 2
        assert archive.load_samples(sample_key="position:3") == [
            _sample(9, index=None, task=False)]


def test_a_lookup_reads_only_the_chunk_it_needs(tmp_path, pool):
    samples = [_sample(i) for i in range(130)]
    samples[129] = _sample(128)  # sample:128 twice, both in the last chunk
    with RolloutArchive(_archive(tmp_path, pool, samples)) as archive:
        got = archive.load_samples(sample_key="sample:128")
        assert got == [_sample(128), _sample(128)]
        assert archive.chunks_read == 1
        assert archive.load_samples(task_key="prompt:5") == [_sample(5)]
        assert archive.chunks_read == 2


def test_lookups_by_task_key_and_both_keys(tmp_path, pool):
    samples = [_sample(0), _sample(1)]
    samples.append(Sample(("prompt", 0), tokens=(1, 2), index=7,
                          metadata={"task_id": "prompt:0"}))
    with RolloutArchive(_archive(tmp_path, pool, samples)) as archive:
        assert [s.index for s in archive.load_samples(task_key="prompt:0")] == [0, 7]
        assert [s.index for s in archive.load_samples(sample_key="sample:7",
                                                      task_key="prompt:0")] == [7]
        assert len(archive.load_samples()) == 3
        with pytest.raises(KeyError):
            archive.load_samples(sample_key="sample:7", task_key="prompt:1")


def test_a_missing_key_is_a_key_error_and_a_malformed_one_a_clear_error(tmp_path, pool):
    with RolloutArchive(_archive(tmp_path, pool, [_sample(0)])) as archive:
        with pytest.raises(KeyError):
            archive.load_samples(sample_key="sample:1")
        with pytest.raises(KeyError):
            archive.load_samples(task_key="prompt:1")
        for bad in ("sample:x", "42", "sample:-1", "sample:01", "prompt:0"):
            with pytest.raises(ValueError, match="sample:<index>"):
                archive.load_samples(sample_key=bad)
        with pytest.raises(TypeError):
            archive.load_samples(sample_key=0)
        with pytest.raises(ValueError):
            archive.load_samples(task_key="")
        assert archive.chunks_read == 0


# --- retention ------------------------------------------------------------------------


def test_the_archive_keeps_its_data_through_gc_until_released(tmp_path, pool):
    samples = published_samples(pool, [_sample(i, routes=_routes(i)) for i in range(3)])
    path = _archive(tmp_path, pool, samples)
    pool.seal()
    pool.release_publications([s.routes.blob_set for s in samples])  # the queue let go
    pool.collect_garbage()
    with RolloutArchive(path) as archive:
        got = archive.load_samples(sample_key="sample:2")[0]
        np.testing.assert_array_equal(got.routes.load(framework="numpy"), _routes(2))
        assert archive.release() is True
        assert archive.release() is False
    assert pool.collect_garbage()["reclaimed_files"] >= 1
    with pytest.raises(InvalidReference, match="released and collected"):
        RolloutArchive(path)


def test_release_leaves_other_owners_theirs(tmp_path, pool):
    samples = published_samples(pool, [_sample(i, routes=_routes(i)) for i in range(2)])
    pool.retain("mine", [s.routes.blob_set for s in samples])
    pool.release_publications([s.routes.blob_set for s in samples])
    path = _archive(tmp_path, pool, samples)
    with RolloutArchive(path) as archive:
        archive.release()
    pool.seal()
    pool.collect_garbage()
    assert "mine" in pool.owners()
    np.testing.assert_array_equal(samples[1].routes.load(framework="numpy"), _routes(1))


def test_closing_releases_the_reader_not_the_data(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    archive = RolloutArchive(path)
    owner = archive.storage_owner
    archive.close()
    assert archive._store.closed
    with pytest.raises(ValueError, match="closed"):
        archive.keys()
    with pytest.raises(ValueError, match="closed"):
        archive.load_samples(sample_key="sample:0")
    assert owner in pool.owners()
    with RolloutArchive(path, store=pool) as again:  # a caller's store stays open
        assert again.load_samples(sample_key="sample:0") == [_sample(0)]
    assert not pool.closed


# --- bad indexes ----------------------------------------------------------------------


def test_a_truncated_index_is_a_clear_error(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    data = open(path, "rb").read()
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(CorruptData, match="truncated"):
        RolloutArchive(path)


@pytest.mark.parametrize("edit", [
    lambda ix: ix["samples"][0].update(sample_key="sample:9"),
    lambda ix: ix.update(rollout_id=8),
    lambda ix: ix.update(storage_owner="someone-else"),
    lambda ix: ix["samples"].reverse(),
])
def test_an_edited_index_is_a_clear_error(tmp_path, pool, edit):
    path = _archive(tmp_path, pool, [_sample(0), _sample(1)])
    index = _index(path)
    edit(index)
    _rewrite(path, index)
    owners = pool.owners()
    with pytest.raises(CorruptData, match="checksum"):
        RolloutArchive(path)
    assert pool.owners() == owners


def test_another_format_or_version_is_unsupported(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    index = _index(path)
    index["version"] = 2
    _rewrite(path, index)
    with pytest.raises(UnsupportedSchema, match="version 1"):
        RolloutArchive(path)


def test_a_missing_pool_is_a_clear_error_and_no_pool_is_created(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    pool.close()
    shutil.rmtree(tmp_path / "pool")
    with pytest.raises(FileNotFoundError, match="pool .* is missing"):
        RolloutArchive(path)
    assert not os.path.exists(tmp_path / "pool")


def test_an_index_whose_root_holds_another_pool_is_refused(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    pool.close()
    shutil.rmtree(tmp_path / "pool")
    SharedFilesystemStore(tmp_path / "pool", "job").close()  # a new pool, a new id
    with pytest.raises(InvalidReference, match="belongs to pool"):
        RolloutArchive(path)


def test_a_store_of_another_run_or_pool_is_refused(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(0)])
    with SharedFilesystemStore(tmp_path / "pool", "other-run") as other:
        with pytest.raises(InvalidReference, match="own pool and run"):
            RolloutArchive(path, store=other)
    with SharedFilesystemStore(tmp_path / "elsewhere", "job") as elsewhere:
        with pytest.raises(InvalidReference, match="own pool and run"):
            RolloutArchive(path, store=elsewhere)


def test_a_missing_index_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no rollout archive index"):
        RolloutArchive(tmp_path / "none.straw.json")


# --- consistent but wrong indexes (checksum recomputed): clear errors, nothing changed --


def _forge(path, edit) -> None:
    """Edit the index and recompute its checksum, as a careless tool (or a copy of another
    archive's fields) would: the checks beyond the checksum must catch it."""
    from straw.rollout.archive import _checksum
    index = _index(path)
    edit(index)
    index.pop("checksum")
    index["checksum"] = _checksum(index)
    _rewrite(path, index)


def _tree(root) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("edit, error, message", [
    # the index names a run its references do not belong to (another run of the pool)
    (lambda ix: ix.update(run_id="other-run"), CorruptData, "belongs to run 'job'"),
    (lambda ix: ix.update(pool_id="0" * 32), InvalidReference, "belongs to pool 0000"),
    (lambda ix: ix.update(root="/nonexistent/pool"), FileNotFoundError, "is missing"),
    (lambda ix: ix["chunks"].reverse(), CorruptData, "not the manifest's"),
    (lambda ix: ix["samples"][1].update(sample_key="sample:01"), CorruptData,
     r"samples\[1\] is not a sample entry"),
    (lambda ix: ix["samples"][0].update(sample_key="prompt:0"), CorruptData,
     r"samples\[0\] is not a sample entry"),
    (lambda ix: ix["samples"][0].update(group_index="0"), CorruptData,
     r"samples\[0\] is not a sample entry"),
    (lambda ix: ix["samples"][0].update(chunk=5), CorruptData,
     r"samples\[0\] is not a sample entry"),
    (lambda ix: ix["samples"][0].pop("group_index"), CorruptData,
     r"samples\[0\] is not a sample entry"),
    (lambda ix: ix.update(rollout_id="7"), CorruptData, "rollout_id is a str"),
    (lambda ix: ix.update(manifest={"not": "a reference"}), CorruptData,
     "manifest is not a publication reference"),
    (lambda ix: ix.pop("storage_owner"), CorruptData, "its fields are"),
])
def test_a_consistent_but_wrong_index_is_a_clear_error_and_changes_nothing(
        tmp_path, pool, edit, error, message):
    path = _archive(tmp_path, pool, [_sample(0), _sample(1)] * 40)  # two chunks
    _forge(path, edit)
    owners, tree = pool.owners(), _tree(tmp_path / "pool")
    with pytest.raises(error, match=message):
        RolloutArchive(path)
    assert pool.owners() == owners and _tree(tmp_path / "pool") == tree
    assert not os.path.exists("/nonexistent/pool")


def test_an_index_of_another_archive_in_the_same_pool_is_refused(tmp_path, pool):
    """Two archives' fields mixed (another archive's manifest, this one's chunks)."""
    first = _archive(tmp_path, pool, [_sample(0)], name="a.straw.json")
    second = _archive(tmp_path, pool, [_sample(1)], name="b.straw.json")
    _forge(second, lambda ix: ix.update(manifest=_index(first)["manifest"]))
    with pytest.raises(CorruptData, match="not the manifest's"):
        RolloutArchive(second)


# --- issue 39, ARCH1: an index cannot release someone else's data --------------------------


def test_arch1_an_index_forged_to_name_a_checkpoints_owner_is_refused(tmp_path, pool):
    kept = pool.publish([Record("weights", b"w" * 64)], submission_id="ckpt")
    pool.retain("checkpoint:7", [kept])
    path = _archive(tmp_path, pool, [_sample(0)])
    _forge(path, lambda ix: ix.update(storage_owner="checkpoint:7"))
    with pytest.raises(CorruptData, match="storage_owner 'checkpoint:7' is not an archive"):
        RolloutArchive(path)
    assert "checkpoint:7" in pool.owners()


def test_arch1_an_index_forged_to_name_another_archives_owner_releases_nothing(
        tmp_path, pool):
    victim = RolloutArchive(_archive(tmp_path, pool, [_sample(1)], name="a.straw.json"))
    path = _archive(tmp_path, pool, [_sample(0)], name="b.straw.json")
    _forge(path, lambda ix: ix.update(storage_owner=victim.storage_owner))
    forged = RolloutArchive(path)
    owners = pool.owners()
    with pytest.raises(OwnerMismatch, match="not released"):
        forged.release()
    assert pool.owners() == owners  # the victim's owner, and the forged index's own, stay
    pool.collect_garbage()
    assert [s.tokens for s in victim.load_samples()] == [_sample(1).tokens]
    assert victim.release() and not victim.release()


def test_arch4_an_index_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    # issue 39 ARCH4: RolloutArchive(path) blocked for ever on a FIFO (run in a child, so
    # that a regression fails this test instead of hanging the suite)
    import subprocess
    import sys
    fifo = tmp_path / "rollout_1.straw.json"
    os.mkfifo(fifo)
    code = ("from straw.rollout import RolloutArchive\n"
            "from straw.fs import SpecialFile\n"
            "try:\n"
            f"    RolloutArchive({str(fifo)!r})\n"
            "except SpecialFile as e:\n"
            "    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "is a FIFO, not a regular file" in p.stdout


def test_fd1_a_full_disk_fails_an_archive_save_naming_the_index(tmp_path):
    # issue 39 FD1: a bare OSError naming no file
    import errno

    from fault_injection.faultyfs import FaultyFS
    from straw.errors import QuotaExceeded
    fs = FaultyFS()
    fs.plan.fail("writev", errno.ENOSPC, path=r"rollout_7\.straw\.json$")
    with SharedFilesystemStore(tmp_path / "full", "job", fs=fs) as store:
        owners = store.owners()
        with pytest.raises(QuotaExceeded, match=r"archive index .*rollout_7\.straw\.json"):
            _archive(tmp_path, store, [_sample(0)])
        assert not (tmp_path / "rollout_7.straw.json").exists()
        assert store.owners() == owners  # its retention released: nothing names it


_KILLED_SAVE = """
import os, signal, sys
import numpy as np
from straw import SharedFilesystemStore
from straw.rollout import RolloutArchive, Sample, Status
from straw.rollout import archive
def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[2] == "before-index":
    archive._write_exclusive = die
else:  # the index is durable; the owner's retain never happens
    SharedFilesystemStore.retain = die
samples = [Sample(("prompt", i), tokens=(1, 2, 3), response_length=1,
                  status=Status.COMPLETED, index=i, routes=np.full((64, 4), i, np.int32))
           for i in range(3)]
RolloutArchive.save(sys.argv[1], samples, rollout_id=3)
"""


@pytest.mark.parametrize("point", ["before-index", "after-index"])
def test_arch2_a_save_killed_before_its_owner_is_named_leaves_nothing_retained(
        tmp_path, point):
    # issue 39 ARCH2: a SIGKILL between the retain and the index left an archive owner
    # that nothing names, its data kept for ever
    import signal
    import subprocess
    import sys
    index = tmp_path / "rollout_3.straw.json"
    p = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(index), point],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert index.exists() == (point == "after-index")
    with SharedFilesystemStore(tmp_path / ADJACENT_POOL, ADJACENT_RUN) as store:
        assert [o for o in store.owners() if o.startswith("archive:")] == []
        assert store.owners() != []  # the dead saver's hold, until a collection
        store.collect_garbage()  # drops the hold of the dead writer ...
        assert store.owners() == []
        reclaimed = store.collect_garbage()["reclaimed_files"]  # ... then its data goes
        assert reclaimed >= 1
        packs = [n for _, _, names in os.walk(tmp_path / ADJACENT_POOL) for n in names
                 if n.endswith(".pack")]
        assert packs == []
    if point == "after-index":
        with pytest.raises(InvalidReference, match="killed before retaining it"):
            RolloutArchive(index)


def test_arch2_a_finished_save_leaves_its_owner_and_no_hold(tmp_path, pool):
    path = _archive(tmp_path, pool, [_sample(i, routes=_routes(i)) for i in range(2)])
    assert pool.owners() == [_index(path)["storage_owner"]]


def test_arch2_an_owner_retain_that_fails_removes_the_index_and_the_hold(
        tmp_path, pool, monkeypatch):
    from straw.errors import QuotaExceeded

    def full(*a, **k):
        raise QuotaExceeded("no space for the catalog")
    monkeypatch.setattr(pool, "retain", full)
    with pytest.raises(QuotaExceeded):
        _archive(tmp_path, pool, [_sample(i) for i in range(2)])
    assert not (tmp_path / "rollout_7.straw.json").exists()
    assert pool.owners() == []
