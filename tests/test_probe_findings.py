"""Findings of the adversarial probe session (PR1..PR17): each test asserts the behaviour
straw should have and fails on the code it was written against (``xfail(strict=True)``
until fixed: an XPASS then fails the suite, so the marker is removed with the fix)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec, pool_view, rpc
from straw.catalog import Catalog
from straw.errors import CorruptData, InvalidReference, StrawError, UnsupportedSchema
from straw.fs import PosixFS
from straw.rollout import EnvironmentMix, RolloutArchive, Sample, Status
from straw.rollout.checkpoint_errors import CheckpointError
from straw.rollout.resolve import resolve_checkpoint
from straw.tensor import TensorRef, publish_tensors

QUEUE_SEGMENT = "runs/job/queues/rl/rollout/journal/j-000001-000001.log"


def _pool(root: str) -> None:
    """A closed pool: a queue (rl/rollout) with tasks, leases and two commits, an owner."""
    producer = SharedFilesystemStore(root, "job", writer_id="producer")
    worker = SharedFilesystemStore(root, "job", writer_id="gen-0")
    q = Coordinator(producer, queue_id="rollout", namespace="rl")
    refs = [producer.publish([Record("p", b"prompt %d" % i)], submission_id=f"p{i}")
            for i in range(4)]
    q.submit_tasks("admit-0", [TaskSpec(f"t{i}", input_ref=r) for i, r in enumerate(refs)])
    for a in q.acquire("gen-0", 2).assignments:
        out = worker.publish([Record("s", b"tokens", metadata={
            "task_id": a.lease.task_id, "attempt_id": a.lease.attempt_id})],
            submission_id=f"s-{a.lease.task_id}")
        q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}", result_ref=out)
    producer.retain("application:keep", [refs[0]])
    q.close()
    worker.close()
    producer.close()


def _archive(d: str) -> str:
    store = SharedFilesystemStore(os.path.join(d, "pool"), "job", writer_id="w")
    samples = [Sample(("prompt", i // 2), tokens=(1, 2, 3, 9), response_length=1,
                      status=Status.COMPLETED, reward=float(i), group_index=i // 2, index=i,
                      metadata={"task_id": f"prompt:{i // 2}"},
                      routes=np.zeros((3, 2, 2), dtype=np.uint8)) for i in range(4)]
    path = RolloutArchive.save(os.path.join(d, "r7.straw.json"), samples, rollout_id=7,
                               store=store)
    store.close()
    return path


# --- PR1: catalog-named pack paths outside the pool are unlinked by collection ---------

def test_PR1_gc_never_unlinks_a_catalog_path_outside_the_pool(tmp_path):
    root = str(tmp_path / "pool")
    absolute, relative = tmp_path / "victim.txt", tmp_path / "victim2.txt"
    absolute.write_text("precious")
    relative.write_text("precious")
    with SharedFilesystemStore(root, "job", writer_id="w") as s:
        s.publish([Record("x", b"1")], submission_id="a")
    catalog = Catalog(PosixFS(), root)  # a hostile pool: its catalog names such paths
    with catalog.locked():
        pass
    catalog.append([{"op": "sealed", "path": str(absolute), "offsets": [], "unstage": []},
                    {"op": "sealed", "path": "../victim2.txt", "offsets": [],
                     "unstage": []}])
    catalog.close()
    try:
        pool_view.collect(root, dry_run=False)  # `straw gc POOL`
    except StrawError:
        pass  # refusing the catalog is right too
    assert absolute.exists() and relative.exists()


# --- PR2: collection unlinks through a symlinked directory into another pool -----------

def test_PR2_gc_never_unlinks_through_a_symlinked_directory(tmp_path):
    victim, attacker = str(tmp_path / "victim"), str(tmp_path / "attacker")
    with SharedFilesystemStore(victim, "job", writer_id="w") as s:
        ref = s.publish([Record("x", b"precious" * 100)], submission_id="a")
        s.retain("application:keep", [ref])
        s.release_publications([ref])
    shutil.copytree(victim, attacker)
    with SharedFilesystemStore(attacker, "job", writer_id="w2") as s:
        s.release("application:keep")
    writers = os.path.join(attacker, "runs", "job", "writers")
    shutil.rmtree(writers)
    os.symlink(os.path.join(victim, "runs", "job", "writers"), writers)
    try:
        pool_view.collect(attacker, dry_run=False)
    except (StrawError, OSError):
        pass
    with SharedFilesystemStore(victim, "job") as s:
        assert next(s.read(ref)).payload == b"precious" * 100


# --- PR3: a worker token reaches the control lane (the batch builder's tasks) ----------
@pytest.fixture()
def served(tmp_path):
    store = SharedFilesystemStore(str(tmp_path / "pool"), "job", writer_id="c")
    q = Coordinator(store, queue_id="rollout")
    tokens = {"worker": "w" * 16, "consumer": "c" * 16}
    server = rpc.start(q, ("127.0.0.1", 0), tokens=tokens)
    consumer = rpc.QueueClient(server.url, token=tokens["consumer"])
    consumer.call("submit_tasks", request_id="collection:0", tasks=[
        {"task_id": "collection:0", "control": True, "estimated_records": 0}])
    yield rpc.QueueClient(server.url, token=tokens["worker"]), consumer
    server.close()
    q.close()
    store.close()


def test_PR3_worker_token_cannot_lease_the_builders_control_tasks(served):
    worker, _ = served
    try:
        got = worker.call("acquire", worker_id="evil", max_tasks=5, control=True)
    except PermissionError:
        return
    assert [a["task"]["task_id"] for a in got["assignments"]] == []


def test_PR3_task_status_does_not_reveal_a_lease_token_to_a_worker(served):
    worker, consumer = served
    consumer.call("acquire", worker_id="builder", max_tasks=1, control=True)
    try:
        status = worker.call("task_status", task_id="collection:0")
    except PermissionError:
        return
    assert "token" not in (status.get("lease") or {})


# --- PR4: a huge (sparse) journal segment or catalog is read whole into memory ---------
class _CountingFS(PosixFS):
    def __init__(self) -> None:
        self.read_bytes = 0

    def readinto(self, fd, buffer, offset):  # type: ignore[no-untyped-def]
        n = super().readinto(fd, buffer, offset)
        self.read_bytes += n
        return n


@pytest.mark.parametrize("name", [QUEUE_SEGMENT, "CATALOG"])
def test_PR4_inspect_reads_a_bounded_amount_of_a_huge_zero_tail(tmp_path, name):
    root = str(tmp_path / "pool")
    _pool(root)
    with open(os.path.join(root, name), "r+b") as f:
        f.truncate(96 << 20)  # a 96 MiB zero tail (64 GiB got `straw inspect` OOM-killed)
    fs = _CountingFS()
    try:
        pool_view.inspect(root, fs=fs)
    except StrawError:
        pass
    assert fs.read_bytes < 16 << 20


# --- PR5: deeply nested JSON is a RecursionError, not the file's straw error -----------
def test_PR5_deeply_nested_archive_index_is_corrupt_data(tmp_path):
    path = tmp_path / "x.straw.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorruptData):
        RolloutArchive(str(path))


def test_PR5_deeply_nested_checkpoint_file_is_unsupported_checkpoint(tmp_path):
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "current.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError):
        resolve_checkpoint(str(tmp_path))


def test_PR5_deeply_nested_pool_marker_is_not_a_pool(tmp_path):
    (tmp_path / "POOL").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(pool_view.NotAPool):
        pool_view.inspect(str(tmp_path))


# --- PR6/PR7: .pt dumps -----------------------------------------------------------------
def _pt_dump(torch, samples):  # type: ignore[no-untyped-def]
    from straw.rollout.archive_pt import PT_FORMAT, PT_VERSION
    return {"format": PT_FORMAT, "version": PT_VERSION, "rollout_id": 0,
            "evaluation": False, "samples": samples}


def _pt_sample(i: int, **kw):  # type: ignore[no-untyped-def]
    from straw.rollout.archive_pt import sample_dict
    d = sample_dict(Sample(("p", i), tokens=(1, 2), response_length=1,
                           status=Status.COMPLETED, reward=0.0, group_index=i, index=i))
    d.update(kw)
    return d


def test_PR6_deeply_nested_pt_metadata_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    from straw.rollout.archive_pt import load_pt
    path = tmp_path / "deep.pt"
    torch.save(_pt_dump(torch, [_pt_sample(0, metadata={"deep": "DEEP_PLACEHOLDER"})]),
               str(path))
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in files if n.endswith("data.pkl"))
    raw = files[pkl]
    at = raw.index(b"DEEP_PLACEHOLDER")
    start = at - 2 if raw[at - 2:at - 1] == b"\x8c" else at - 5  # its string opcode
    n = 5_000  # EMPTY_LIST x (n + 1), APPEND x n: lists nested n deep
    files[pkl] = raw[:start] + b"]" * (n + 1) + b"a" * n + raw[at + 16:]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    with pytest.raises((CorruptData, UnsupportedSchema)):
        load_pt(str(path))


def test_PR7_pt_views_sharing_one_storage_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    from straw.rollout.archive_pt import load_pt
    shared = torch.zeros(1 << 16, dtype=torch.uint8)  # 64 KiB stored once ...
    samples = [_pt_sample(i, routes=shared.view(1, 256, 256)) for i in range(64)]
    path = tmp_path / "amp.pt"
    torch.save(_pt_dump(torch, samples), str(path))  # ... materialised 64 times (4 MiB)
    assert os.path.getsize(path) < 256 << 10
    with pytest.raises(CorruptData):
        load_pt(str(path))


# --- PR8: NaN/Infinity in an archive index ----------------------------------------------
def test_PR8_nan_in_an_archive_index_is_corrupt_data(tmp_path):
    path = _archive(str(tmp_path))
    with open(path) as f:
        index = json.load(f)
    index["pool_id"] = float("nan")
    with open(path, "w") as f:
        json.dump(index, f)  # allow_nan: what Python's json writes by default
    with pytest.raises(CorruptData, match="r7.straw.json"):
        RolloutArchive(path)


# --- PR9: a directory where a file is read: an OSError naming no file -------------------
def test_PR9_a_directory_in_place_of_a_file_is_named(tmp_path):
    index = tmp_path / "dir.straw.json"
    index.mkdir()
    with pytest.raises(Exception) as archive_error:
        RolloutArchive(str(index))
    assert str(index) in str(archive_error.value)
    (tmp_path / "save" / "rollout" / "current.json").mkdir(parents=True)
    with pytest.raises(Exception) as resolve_error:
        resolve_checkpoint(str(tmp_path / "save"))
    assert "current.json" in str(resolve_error.value)


# --- PR10: malformed branch.json / dataset cursor: raw KeyError/TypeError ---------------
def test_PR10_malformed_branch_file_is_a_checkpoint_error(tmp_path):
    save = tmp_path / "save"
    (save / "rollout").mkdir(parents=True)
    (save / "rollout" / "current.json").write_text(json.dumps(
        {"version": 1, "directory": str(save), "tracker": ""}))
    (save / "rollout" / "branch.json").write_text(json.dumps(
        {"version": 1, "parent": "x", "queue": {"namespace": "branches", "queue_id": "q"}}))
    with pytest.raises(CheckpointError, match="branch.json"):
        resolve_checkpoint(str(save))


def test_PR10_dataset_cursor_without_cursor_is_a_checkpoint_error(tmp_path):
    save = tmp_path / "save"
    (save / "iter_0000001").mkdir(parents=True)
    (save / "iter_0000001" / "w.bin").write_bytes(b"w")
    (save / "rollout").mkdir()
    (save / "rollout" / "dataset_cursor_1.json").write_text('{"version": 1}')
    with pytest.raises(CheckpointError, match="dataset_cursor_1.json"):
        resolve_checkpoint(str(save), str(save), 1)


# --- PR11: checkpoint state files with missing fields: raw KeyError at open_job ---------
def test_PR11_state_file_without_tasks_is_a_checkpoint_error(tmp_path):
    from tests.rollout.ckpt_job import Job
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    job = Job(pool, save)
    job.train()
    job.save(0)
    job.close()
    state = os.path.join(save, "rollout", "queue_state_0.json")
    with open(state) as f:
        value = json.load(f)
    del value["tasks"]
    data = json.dumps(value).encode()
    with open(state, "wb") as f:
        f.write(data)
    marker = os.path.join(save, "rollout", "committed_0.json")
    with open(marker) as f:
        m = json.load(f)
    m["files"]["rollout/queue_state_0.json"] = {
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(marker, "w") as f:
        json.dump(m, f)  # a checkpoint handed over: consistent hashes, bad content
    with pytest.raises(CheckpointError, match="queue_state_0.json"):
        Job(pool, save, step=0)


# --- PR12: a journal segment that is a symlink is followed ------------------------------
def test_PR12_a_symlinked_journal_segment_is_not_followed(tmp_path):
    here, other = str(tmp_path / "a"), str(tmp_path / "b")
    _pool(here)
    _pool(other)
    segment = os.path.join(here, QUEUE_SEGMENT)
    os.unlink(segment)
    os.symlink(os.path.join(other, QUEUE_SEGMENT), segment)  # another pool's queue
    try:
        view = pool_view.inspect(here)
    except StrawError:
        return
    assert view["errors"], "the queue was read from another pool's journal"


# --- PR13/PR14: hostile values raise raw Python errors ----------------------------------
def test_PR13_tensor_ref_dict_with_a_list_dtype_is_invalid_reference(tmp_path):
    with SharedFilesystemStore(str(tmp_path / "pool"), "job") as s:
        (ref,) = publish_tensors(s, {"a": np.arange(4, dtype=np.int32)}, submission_id="t")
        value = dict(ref.to_dict(), dtype=["int32"])
        with pytest.raises(InvalidReference):
            TensorRef.from_dict(value, s)


def test_PR14_environment_weight_too_large_for_a_float_is_a_value_error():
    with pytest.raises((ValueError, TypeError), match="weights"):
        EnvironmentMix({"a": 10**400, "b": 1}, 4)




def test_PR2_a_wrapped_filesystem_still_unlinks_only_beneath(tmp_path):
    # the backend wraps PosixFS (straw.backend's sync observer): a wrapper must forward
    # unlink_beneath, not fall back to a path-following unlink
    from straw.fs import NotBeneath
    from straw.fs_delegating import DelegatingFilesystem
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "pack-000001.pack").write_bytes(b"precious")
    root = tmp_path / "pool"
    root.mkdir()
    os.symlink(outside, root / "writers")
    with pytest.raises(NotBeneath):
        DelegatingFilesystem(PosixFS()).unlink_beneath(str(root), "writers/pack-000001.pack")
    assert (outside / "pack-000001.pack").exists()


# --- PR15: history segments and journal cleanup follow a symlinked file or directory ----
def _history(fs: PosixFS, directory: str):  # type: ignore[no-untyped-def]
    from straw.queue.history import Delta, History
    delta = Delta(tasks=[(f"t{i}", [i, {}]) for i in range(3)], status={"completed": 3})
    return History(fs, directory).extended(delta, epoch=1, seq=1)


def test_PR15_history_and_journal_cleanup_never_go_through_a_symlink(tmp_path):
    from straw.durable.journal_snapshot import _delete_before
    from straw.queue.history import History, Segment
    fs = PosixFS()
    here, other = tmp_path / "a" / "q", tmp_path / "b" / "q"
    theirs = _history(fs, str(other / "history"))
    (name,) = theirs.names()
    (here / "history").mkdir(parents=True)
    os.symlink(other / "history" / name, here / "history" / name)  # another pool's segment
    with pytest.raises(CorruptData, match=name):
        History.from_manifest(fs, str(here / "history"), theirs.manifest())
    with pytest.raises(CorruptData, match=name):
        Segment(fs, str(here / "history"), theirs.segments[0].entry).get("t", "t1")
    manifest = theirs.manifest()  # a name that leaves the directory
    manifest["segments"][0]["name"] = f"../../../b/q/history/{name}"
    with pytest.raises(CorruptData, match="not a history segment's name"):
        History.from_manifest(fs, str(here / "history"), manifest)
    # cleanup through a symlinked history/ or journal/ directory deletes nothing there
    shutil.rmtree(here / "history")
    os.symlink(other / "history", here / "history")
    History(fs, str(here / "history")).cleanup(epoch=1)
    assert (other / "history" / name).exists()
    (other / "journal").mkdir()
    (other / "journal" / "j-000001-000001.log").write_bytes(b"theirs")
    os.symlink(other / "journal", here / "journal")

    class _J:
        dir = str(here / "journal")
        last_cleanup_error = None
        _m = {"cleanup_errors": 0, "deleted_files": 0, "dir_fsyncs": 0}

    _J.fs = fs  # type: ignore[attr-defined]
    _delete_before(_J(), (1, 5, 0))  # type: ignore[arg-type]
    assert (other / "journal" / "j-000001-000001.log").exists()


# --- PR16: a forged frame length (2**60) is allocated or read before it is checked ------
def _forged_header(kind: int, offset: int) -> bytes:
    import struct

    import xxhash

    from straw.durable import framing
    first = struct.pack("<4sHHQQ16s", framing.MAGIC, framing.FORMAT_VERSION, kind, 2**60,
                        offset, bytes(16))
    return first + xxhash.xxh3_128_digest(first)


def test_PR16_a_forged_frame_length_is_bounded_by_the_file(tmp_path):
    from straw.durable import framing
    from straw.durable.journal_files import Reader
    from straw.durable.recovery import _read_snapshot
    from straw.pool.catalog.read import read_state
    fs = _CountingFS()
    good = framing.encode_frame(framing.KIND_JOURNAL, b"\x03", group_start=0)
    # a file of frames (a pack, an acknowledgement log): the forged tail is torn
    path = tmp_path / "frames"
    path.write_bytes(good + _forged_header(framing.KIND_EXTENT, len(good)) + bytes(4096))
    fd = fs.open(str(path))
    scan = framing.scan_frames(framing.read_at_fn(fs, fd), os.path.getsize(path))
    fs.close(fd)
    assert (len(scan.frames), scan.end, scan.torn) == (1, len(good), True)
    # a journal segment with a zero tail is read to its clean end, not to its end
    journal = tmp_path / "q" / "journal"
    journal.mkdir(parents=True)
    segment = journal / "j-000001-000001.log"
    segment.write_bytes(good + _forged_header(framing.KIND_JOURNAL, len(good)))
    os.truncate(segment, 64 << 20)
    stats = {"files_read": 0, "bytes_read": 0, "fsyncs": 0}
    fs.read_bytes = 0
    Reader(fs, str(journal), stats).read(segment.name)
    assert fs.read_bytes < 16 << 20
    # a journal snapshot: CorruptData naming it
    (journal / "s-000001-000001-000000000000.snap").write_bytes(
        _forged_header(framing.KIND_SNAPSHOT, 0) + bytes(2 << 20))
    with pytest.raises(CorruptData, match="s-000001-000001-000000000000.snap"):
        _read_snapshot(Reader(fs, str(journal), stats), (1, 1, 0))  # type: ignore[arg-type]
    # a history segment whose index names a frame it cannot hold
    theirs = _history(PosixFS(), str(tmp_path / "q" / "history"))
    segment_of = theirs.segments[0]
    segment_of.entry["index"] = [segment_of.entry["index"][0], 2**60]
    with pytest.raises(CorruptData, match=segment_of.name):
        segment_of.index()
    # a catalog: its forged final frame is a torn tail, never read
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "CATALOG").write_bytes(_forged_header(framing.KIND_CATALOG, 0))
    assert not read_state(fs, str(pool)).live_packs()


# --- PR17: a writer's directory replaced by a symlink redirects its packs --------------
def test_PR17_a_symlinked_writer_directory_is_refused(tmp_path):
    root, outside = tmp_path / "pool", tmp_path / "outside"
    with SharedFilesystemStore(str(root), "job", writer_id="w") as s:
        s.publish([Record("x", b"first")], submission_id="a")
    writer_dir = root / "runs" / "job" / "writers" / "w"
    shutil.move(str(writer_dir), str(outside))
    os.symlink(outside, writer_dir)
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    with pytest.raises(CorruptData, match="writers/w"):
        with SharedFilesystemStore(str(root), "job", writer_id="w") as s:
            s.publish([Record("x", b"second")], submission_id="b")
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
