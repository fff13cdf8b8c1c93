"""straw-queue 0.1.6's peripheral modules, used as its callers use them: ``straw.rpc``
(a coordinator served to a worker process), ``straw.backend`` (declarations, pool paths,
the sync hook), ``straw.inspect`` (offline report and stopped-run cleanup through our
GC), ``straw.reporting`` and the ``straw`` console script.

Written against the public surface only and without relying on the exact fields of
references or leases (dicts are rebuilt the straw-queue way: ``Lease(**d)``,
``RecordSetRef.from_dict(d)``)."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from straw import Coordinator, IdempotencyConflict, Record, SharedFilesystemStore, TaskSpec
from straw.errors import InvalidReference, StorageUnavailable, StrawError, UnsafeRecovery
from straw.protocol import Lease
from straw.refs import RecordSetRef

REPO = Path(__file__).resolve().parents[2]


def _payload(store: SharedFilesystemStore, ref: RecordSetRef) -> bytes:
    return bytes(next(iter(store.read(ref))).payload)  # a list today, an iterator later


# --- straw.rpc ----------------------------------------------------------------------------
WORKER = r"""
import sys
from straw import Record, SharedFilesystemStore
from straw.rpc import QueueClient
from straw.protocol import Lease

url, token, root = sys.argv[1:4]
client = QueueClient(url, token=token, timeout=30)
page = client.call("acquire", worker_id="worker-1", max_tasks=1)
assert page["status"] == "acquired", page
assignment = page["assignments"][0]
lease = Lease(**assignment["lease"])  # straw-queue's idiom: the lease dict rebuilds the Lease
meta = {"task_id": lease.task_id}
for key in ("attempt", "attempt_id"):  # whichever the lease names its attempt by
    if key in assignment["lease"]:
        meta[key] = assignment["lease"][key]
with SharedFilesystemStore(root, "run", writer_id="worker-1") as store:
    ref = store.publish([Record("out", b"from the worker", metadata=meta)],
                        submission_id="result-" + lease.task_id)
receipt = client.call("complete_task", lease=lease, submission_id="result-" + lease.task_id,
                      result_ref=ref, result_digest=ref.digest)
assert receipt["task_id"] == lease.task_id, receipt
print(lease.task_id)
"""


@pytest.fixture
def served(tmp_path):
    from straw import rpc
    store = SharedFilesystemStore(tmp_path / "pool", "run", writer_id="controller")
    coordinator = Coordinator(store)
    token = secrets.token_hex(16)
    server = rpc.start(coordinator, ("127.0.0.1", 0), token=token)
    try:
        yield store, coordinator, server, token
    finally:
        server.close()
        coordinator.close()
        store.close()


def test_rpc_worker_process_acquires_and_completes(served, tmp_path):
    store, coordinator, server, token = served
    coordinator.submit_tasks("submit-1", [TaskSpec("task-a")])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", WORKER, server.url, token,
                           str(tmp_path / "pool")], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "task-a"
    page = coordinator.read_commits()
    assert [c.task_id for c in page.commits] == ["task-a"]
    assert _payload(store, page.commits[0].result_ref) == b"from the worker"
    assert coordinator.task_status("task-a")["state"] == "completed"


def test_rpc_refuses_a_wrong_token_and_changes_nothing(served):
    from straw.rpc import QueueClient
    store, coordinator, server, token = served
    with pytest.raises(PermissionError, match="refused the token"):
        QueueClient(server.url, token=token + "x").call(
            "submit_tasks", request_id="r", tasks=[TaskSpec("t")])
    assert coordinator.pending_tasks() == []
    with pytest.raises(ValueError, match="token"):
        QueueClient(server.url, token="")


def test_rpc_carries_errors_back_as_their_classes(served):
    from straw.rpc import QueueClient
    store, coordinator, server, token = served
    client = QueueClient(server.url, token=token)
    client.call("submit_tasks", request_id="r1", tasks=[TaskSpec("t1")])
    client.call("submit_tasks", request_id="r1", tasks=[TaskSpec("t1")])  # a retry: same result
    with pytest.raises(IdempotencyConflict, match="r1"):
        client.call("submit_tasks", request_id="r1", tasks=[TaskSpec("other")])
    # an unknown method and a wrong keyword: ValueError/TypeError there, and straw errors
    # here (straw-queue's client raised its QueueError, a RuntimeError, for them)
    with pytest.raises(ValueError, match="unknown control operation 'close'") as exc:
        client.call("close")
    assert isinstance(exc.value, StrawError) and isinstance(exc.value, RuntimeError)
    with pytest.raises(TypeError) as exc2:
        client.call("task_status", no_such_keyword=1)
    assert isinstance(exc2.value, RuntimeError)
    with pytest.raises(TypeError, match="payload bytes"):
        client.call("submit_tasks", request_id="r2", tasks=[], blob=b"x")
    assert [t.task_id for t in coordinator.pending_tasks()] == ["t1"]


def test_rpc_complete_and_acquire_returns_the_receipt_and_the_next_lease(served):
    """straw's addition travels like the other calls: a list [receipt, acquire result]."""
    from straw.rpc import QueueClient
    store, coordinator, server, token = served
    client = QueueClient(server.url, token=token)
    client.call("submit_tasks", request_id="r", tasks=[TaskSpec("a"), TaskSpec("b")])
    lease = Lease(**client.call("acquire", worker_id="w")["assignments"][0]["lease"])
    ref = store.publish([Record("out", b"x", metadata={"task_id": lease.task_id,
                                                       "attempt_id": lease.attempt_id})],
                        submission_id="out-a")
    receipt, got = client.call("complete_and_acquire", lease=lease, submission_id="done-a",
                               result_ref=ref)
    assert receipt["task_id"] == "a" and got["status"] == "acquired"
    assert got["assignments"][0]["lease"]["task_id"] == "b"
    assert coordinator.task_status("a")["state"] == "completed"
    assert coordinator.task_status("b")["state"] == "leased"


SERVER = r"""
import sys
from straw import Coordinator, SharedFilesystemStore
from straw.rpc import serve

store = SharedFilesystemStore(sys.argv[1], "run")
serve(Coordinator(store), ("127.0.0.1", 0), token="t",
      ready=lambda address: print(address[1], flush=True))
"""


def test_rpc_serve_reports_its_address(tmp_path):
    """straw-queue's entry point, in a process of its own (it serves until the end)."""
    from straw import rpc
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / "pool")], env=env,
                              cwd=str(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())  # printed by ready(bound address)
        client = rpc.QueueClient(f"http://127.0.0.1:{port}", token="t")
        client.call("submit_tasks", request_id="r", tasks=[TaskSpec("x")])
        assert client.call("task_status", task_id="x")["state"] == "pending"
    finally:
        server.terminate()
        server.wait(30)
    with SharedFilesystemStore(tmp_path / "pool", "run") as store:
        coordinator = Coordinator(store, recover=True)  # the killed server's queue
        try:
            with pytest.raises(ValueError, match="token"):
                rpc.serve(coordinator, ("127.0.0.1", 0), token="")
        finally:
            coordinator.close()


# --- straw.backend ------------------------------------------------------------------------
JUICEFS = {"direct_mount": True, "writeback": False, "open_cache": 0, "readdir_cache": False,
           "client_version": "test-only", "durability_description": "not an admission certificate"}


def test_backend_juicefs_declaration_accepted_and_refused_as_straw_queue(tmp_path):
    from straw.backend import FilesystemBackend
    backend = FilesystemBackend(tmp_path, profile="juicefs", declaration=JUICEFS)
    diag = backend.diagnostics()
    assert diag["profile"] == "juicefs" and diag["declaration"] == JUICEFS
    assert diag["mount_options_automatically_verified"] is False  # not checked yet
    assert diag["multi_machine_admission"] == "not_verified"
    with pytest.raises(ValueError, match="declaration"):
        FilesystemBackend(tmp_path, profile="juicefs")
    for bad in ({**JUICEFS, "writeback": True}, {**JUICEFS, "open_cache": 1},
                {k: v for k, v in JUICEFS.items() if k != "client_version"},
                {**JUICEFS, "durability_description": ""}):
        with pytest.raises(ValueError):
            FilesystemBackend(tmp_path, profile="juicefs", declaration=bad)
    with pytest.raises(ValueError, match="'nfs'"):
        FilesystemBackend(tmp_path, profile="nfs")
    # ours checks it against the live mount when a store starts (tmp_path is no JuiceFS)
    from straw import DeploymentMismatch
    with pytest.raises(DeploymentMismatch, match="fuse.juicefs"):
        SharedFilesystemStore(tmp_path / "pool", "run", backend=FilesystemBackend(
            tmp_path / "pool", profile="juicefs", declaration=JUICEFS))
    assert not (tmp_path / "pool").exists()


def test_backend_root_is_resolved_and_paths_stay_inside(tmp_path):
    from straw.backend import FilesystemBackend
    (tmp_path / "real" / "a").mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "out").symlink_to("/etc")
    backend = FilesystemBackend(tmp_path / "via")
    assert backend.root == (tmp_path / "real").resolve() and isinstance(backend.root, Path)
    assert backend.profile == "local" and backend.declaration == {}
    assert backend.metrics == {"syncs": 0}
    assert backend.path("a/b.json") == backend.root / "a" / "b.json"
    for bad in ("../x", "/etc/passwd", "a/../b", "", ".", "a//b", "a/./b", "out/passwd", 5):
        with pytest.raises(InvalidReference):
            backend.path(bad)  # type: ignore[arg-type]
    # a store on the symlinked name accepts the backend of its resolved root
    with SharedFilesystemStore(tmp_path / "via", "run", backend=backend) as store:
        store.publish([Record("r", b"x")], submission_id="s")
    assert backend.metrics["syncs"] > 0  # every sync of the store is counted
    syncs = backend.metrics["syncs"]
    backend.sync_directory(backend.root)
    assert backend.metrics["syncs"] == syncs + 1
    assert json.loads(backend.open_committed("POOL").read())["format"] == "straw-pool"
    with pytest.raises(InvalidReference):
        backend.open_committed("../POOL")


def test_backend_fault_hook_fails_a_sync_and_nothing_is_published(tmp_path):
    from straw.backend import FilesystemBackend
    phases: list[str] = []

    def failing(phase):
        if phase == "before_file_sync":
            raise OSError(errno.EIO, "injected before the sync")

    backend = FilesystemBackend(tmp_path / "pool", fault=phases.append)
    with SharedFilesystemStore(tmp_path / "pool", "run", backend=backend) as store:
        assert "before_directory_sync" in phases  # the pool's creation went through it
        store.backend.fault = failing  # straw-queue's tests swap the hook this way
        with pytest.raises(StorageUnavailable):
            store.publish([Record("r", b"lost")], submission_id="s1")
        store.backend.fault = lambda phase: None
        assert store.lookup_submission("s1") is None
        ref = store.publish([Record("r", b"kept")], submission_id="s2")
        assert _payload(store, ref) == b"kept"


@pytest.mark.parametrize("err", [OSError("flush failed"), OSError(errno.EIO, "flush failed")])
def test_a_failed_directory_sync_of_a_new_writer_is_a_straw_error_and_leaves_no_pack(
        tmp_path, err):
    # vime's transport test: a first publication whose writer directory cannot be made
    # durable raises StorageUnavailable naming the directory (it was a bare OSError), no
    # pack file exists, and the next publication succeeds
    def failing(phase):
        if phase == "before_directory_sync":
            raise err

    with SharedFilesystemStore(tmp_path / "pool", "run") as store:
        store.backend.fault = failing
        with pytest.raises(StorageUnavailable, match="writer .*flush failed"):
            store.publish([Record("r", b"lost")], submission_id="s1")
        assert not list((tmp_path / "pool").rglob("*.pack"))
        store.backend.fault = lambda phase: None
        ref = store.publish([Record("r", b"kept")], submission_id="s1")
        assert _payload(store, ref) == b"kept"


# --- straw.inspect ------------------------------------------------------------------------
def _pool_with_an_orphan(root: Path) -> tuple[RecordSetRef, RecordSetRef]:
    """A queue-accepted result (retained) and a publication released by its writer
    without any owner (an orphan pack of its own)."""
    with SharedFilesystemStore(root, "run", writer_id="controller") as store:
        coordinator = Coordinator(store)
        coordinator.submit_tasks("r", [TaskSpec("t")])
        lease = coordinator.acquire("w").assignments[0].lease
        meta = {"task_id": lease.task_id}
        for key in ("attempt", "attempt_id"):
            if hasattr(lease, key):
                meta[key] = getattr(lease, key)
        kept = store.publish([Record("k", b"accepted", metadata=meta)], submission_id="k")
        coordinator.complete_task(lease, submission_id="k", result_ref=kept,
                                  result_digest=kept.digest)
        coordinator.close()
    with SharedFilesystemStore(root, "run", writer_id="scratch") as scratch:
        orphan = scratch.publish([Record("o", b"never accepted")], submission_id="o")
        scratch.release_publications([orphan])
    return kept, orphan


def _path(ref: RecordSetRef) -> str:
    return ref.segment.path  # the pack of a reference, both before and after its reshaping


def test_inspect_run_reports_retained_and_orphan_packs(tmp_path):
    from straw.inspect import inspect_run
    kept, orphan = _pool_with_an_orphan(tmp_path / "pool")
    report = inspect_run(tmp_path / "pool")
    assert report["run_id"] == "run" and report["requires_stopped_run"] is True
    assert _path(kept) in report["retained_paths"]
    assert report["unaccepted_sealed"] == [_path(orphan)]
    assert report["partial"] == [] and report["retained_dependency_errors"] == []
    assert report["deletion_allowed"] is True
    # straw-queue's key for the digest of what the report was computed from
    assert report["journal_sha256"] == report["catalog_sha256"]
    assert len(report["journal_sha256"]) == 64
    assert inspect_run(tmp_path / "pool") == report  # read-only: the same report again
    from straw.pool_view import NotAPool
    with pytest.raises(NotAPool):
        inspect_run(tmp_path)


def test_cleanup_orphans_only_when_stopped_and_unchanged(tmp_path):
    from straw.inspect import cleanup_orphans, inspect_run
    root = tmp_path / "pool"
    kept, orphan = _pool_with_an_orphan(root)
    report = inspect_run(root)
    with pytest.raises(UnsafeRecovery, match="stopped"):
        cleanup_orphans(root, report, all_participants_stopped=False)
    assert (root / _path(orphan)).exists()
    with SharedFilesystemStore(root, "run", writer_id="late") as late:  # the pool changes
        late.publish([Record("x", b"y")], submission_id="x")
    with pytest.raises(UnsafeRecovery, match="changed"):
        cleanup_orphans(root, report, all_participants_stopped=True)
    assert (root / _path(orphan)).exists()
    report = inspect_run(root)
    deleted = cleanup_orphans(root, report, all_participants_stopped=True)
    assert deleted == [_path(orphan)]
    assert not (root / _path(orphan)).exists()
    with SharedFilesystemStore(root, "run", writer_id="reader") as store:
        assert _payload(store, kept) == b"accepted"  # retained data is never touched
    assert inspect_run(root)["unaccepted_sealed"] == []


def test_offline_tools_refuse_a_pool_managed_by_online_gc(tmp_path):
    """straw-queue's offline inspector refuses a pool with a shared catalog; ours refuses
    one a store opened with online_gc=True, even given a report made before, and its
    retained data stays readable and collected by the stores."""
    from straw.inspect import cleanup_orphans, inspect_run
    root = tmp_path / "pool"
    kept, orphan = _pool_with_an_orphan(root)
    report = inspect_run(root)  # not managed yet
    with SharedFilesystemStore(root, "run", writer_id="gc", online_gc=True) as managed:
        with pytest.raises(UnsafeRecovery, match="managed by online GC through its shared "
                                                 "catalog"):
            inspect_run(root)  # while its store is live...
    for call in (lambda: inspect_run(root),  # ...and once it stopped
                 lambda: cleanup_orphans(root, report, all_participants_stopped=True)):
        with pytest.raises(UnsafeRecovery, match="catalog"):
            call()
    assert (root / _path(orphan)).exists()  # nothing deleted
    with SharedFilesystemStore(root, "run", writer_id="gc", online_gc=True) as managed:
        assert _payload(managed, kept) == b"accepted"
        assert managed.collect_garbage()["reclaimed_files"] == 1  # the orphan, online
    assert not (root / _path(orphan)).exists()


def test_offline_tools_refuse_when_the_layout_cannot_be_established(tmp_path, monkeypatch):
    from straw.fs import PosixFS
    from straw.inspect import inspect_run
    root = tmp_path / "pool"
    _pool_with_an_orphan(root)
    probe = PosixFS.probe

    def unreadable(self, path):
        if path.endswith("ONLINE_GC"):
            raise PermissionError(13, "Permission denied", path)
        return probe(self, path)

    monkeypatch.setattr(PosixFS, "probe", unreadable)
    with pytest.raises(UnsafeRecovery, match="Cannot establish standalone") as caught:
        inspect_run(root)
    assert isinstance(caught.value.__cause__, PermissionError)


def test_inspect_main_prints_the_report(tmp_path, capsys):
    from straw.inspect import main
    _pool_with_an_orphan(tmp_path / "pool")
    assert main([str(tmp_path / "pool")]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "run"
    assert main([str(tmp_path / "pool"), "--delete-orphans"]) == 1  # not stopped: refused
    assert "UnsafeRecovery" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere")]) == 2


# --- straw.reporting ----------------------------------------------------------------------
def test_write_report_is_canonical_atomic_and_durable(tmp_path):
    from straw.reporting import write_report
    target = tmp_path / "deep" / "dir" / "report.json"
    value = {"b": [1, 2.5, None], "a": {"z": "é", "y": True}}
    write_report(target, value)
    assert target.read_bytes() == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                             ensure_ascii=False).encode()
    write_report(target, 7)  # a bare JSON value, replacing the previous report
    assert target.read_bytes() == b"7"
    for bad in ({"x": math.nan}, {"x": b"bytes"}):
        with pytest.raises((ValueError, TypeError)):
            write_report(target, bad)
    assert target.read_bytes() == b"7"  # a value that cannot be encoded writes nothing
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]


# --- the console script -------------------------------------------------------------------
def test_console_script_points_at_a_working_main(capsys):
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    target = re.search(r'^straw\s*=\s*"([^"]+)"', section, re.M)
    assert target is not None, "pyproject.toml installs no `straw` console script"
    module, _, name = target.group(1).partition(":")
    import importlib
    main = getattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "inspect" in capsys.readouterr().out


# --- straw.tracing and straw.benchmark ----------------------------------------------------
def test_tracing_emits_payload_free_lines_per_process(tmp_path, monkeypatch):
    import numpy as np

    from straw import tracing
    monkeypatch.delenv("STRAW_TRACE_DIR", raising=False)
    tracing.emit("write", root=tmp_path, size=1, seconds=0.1)  # off: nothing anywhere
    trace = tmp_path / "trace"
    monkeypatch.setenv("STRAW_TRACE_DIR", str(trace))
    assert tracing.enabled() and not trace.exists()
    records = [Record("a", b"secret payload", metadata={"task": "private"}, tokens=3),
               Record("b", np.zeros((4, 8), dtype=np.int32), codec="tensor.v1",
                      metadata={"shape": [4, 8], "dtype": "int32", "kind": "numpy"})]
    tracing.emit("write", root=tmp_path / "pool", size=200, seconds=0.01, records=records)
    tracing.emit("read_range", root=tmp_path / "pool", size=64, seconds=0.002, checked_bytes=96)
    pid = os.fork()
    if pid == 0:  # a forked child traces into its own file
        tracing.emit("read", root="r", size=1, seconds=0.0)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    files = sorted(trace.iterdir())
    assert [f.name.rsplit("-", 1)[1] for f in files] == sorted([f"{os.getpid()}.jsonl",
                                                                 f"{pid}.jsonl"])
    mine = [json.loads(line) for line in
            (trace / f"{socket.gethostname()}-{os.getpid()}.jsonl").read_text().splitlines()]
    assert [e["op"] for e in mine] == ["write", "read_range"]
    assert mine[0]["records"] == [
        {"bytes": 14, "codec": "bytes.v1", "tokens": 3},
        {"bytes": 128, "codec": "tensor.v1", "tokens": 0, "shape": [4, 8],
         "dtype": "int32", "kind": "numpy"}]
    assert mine[1]["checked_bytes"] == 96 and mine[0]["root"] == str(tmp_path / "pool")
    assert "secret" not in files[0].read_text() + files[1].read_text()
    assert "private" not in files[0].read_text() + files[1].read_text()


def test_benchmark_profile_from_traces(tmp_path, monkeypatch):
    from straw import benchmark, tracing
    trace = tmp_path / "trace"
    monkeypatch.setenv("STRAW_TRACE_DIR", str(trace))
    tracing.emit("write", root="p", size=3100, seconds=0.5,
                 records=[Record("a", b"x" * 1000), Record("b", b"y" * 2000)])
    tracing.emit("write", root="p", size=600, seconds=0.1, records=[Record("c", b"z" * 500)])
    tracing.emit("read", root="p", size=1500, seconds=0.2)
    out = tmp_path / "profile.json"
    benchmark.main(["profile", "--trace", str(trace), "--output", str(out)])
    prof = json.loads(out.read_text())
    assert prof["publications"] == [[1000, 2000], [500]]
    assert prof["observed_write_bytes"] == 3700 and prof["observed_read_bytes"] == 1500
    assert prof["observed_write_payload_bytes"] == 3500
    assert prof["write_p50_seconds"] == prof["write_p99_seconds"] == 0.1  # nearest rank below
    assert prof["hosts"] == [socket.gethostname()]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no publication"):
        benchmark.main(["profile", "--trace", str(empty), "--output", str(out)])


def test_store_traces_its_writes_and_reads_for_a_profile(tmp_path, monkeypatch):
    """A job run with STRAW_TRACE_DIR leaves straw-queue's events (one ``write`` per
    publish/publish_many/write_records call, one ``read`` per record, ``read_range``
    with the checked chunk bytes), which ``benchmark profile`` turns into a profile."""
    import numpy as np

    from straw import benchmark
    from straw.tensor import publish_tensors
    trace = tmp_path / "trace"
    monkeypatch.setenv("STRAW_TRACE_DIR", str(trace))
    with SharedFilesystemStore(tmp_path / "pool", "traced") as store:
        ref = store.publish([Record("a", b"x" * 1000, metadata={"secret": "s3"}),
                             Record("b", b"y" * 2000)], submission_id="p")
        refs = store.write_records([Record("c", b"z" * 500)], submission_id="w")
        assert [bytes(r.payload) for r in store.read(ref)] == [b"x" * 1000, b"y" * 2000]
        assert store.read_record(refs[0]).payload == b"z" * 500
        (t,) = publish_tensors(store, {"t": np.arange(1 << 17, dtype=np.int32)},
                               submission_id="t")
        store.read_tensor_range(t.record_ref, 8, 16)
        assert t.load(framework="numpy")[5] == 5
        store.read_range(refs[0], 10, 20, chunk_bytes=256,
                         checksums=[hashlib.sha256(b"z" * 256).hexdigest(),
                                    hashlib.sha256(b"z" * 244).hexdigest()])
    (f,) = trace.iterdir()
    text = f.read_text()
    assert "s3" not in text and "xxxx" not in text  # no metadata value, no payload byte
    events = [json.loads(line) for line in text.splitlines()]
    assert [e["op"] for e in events] == ["write", "write", "read", "read", "read", "write",
                                         "read_range", "read_range", "read_range"]
    assert events[0]["bytes"] == ref.segment.size
    assert [r["bytes"] for r in events[0]["records"]] == [1000, 2000]
    assert [e["bytes"] for e in events[2:5]] == [1000, 2000, 500]
    assert events[5]["records"][0]["dtype"] == "int32"
    # 8 bytes of the tensor's first 256 KiB chunk; 10 bytes of the first 256-byte chunk
    assert (events[6]["bytes"], events[6]["checked_bytes"]) == (8, 1 << 18)
    assert (events[7]["bytes"], events[7]["checked_bytes"]) == (1 << 19, 1 << 19)  # load
    assert (events[8]["bytes"], events[8]["checked_bytes"]) == (10, 256)
    assert {e["root"] for e in events} == {str(tmp_path / "pool")}
    out = tmp_path / "profile.json"
    benchmark.main(["profile", "--trace", str(trace), "--output", str(out)])
    prof = json.loads(out.read_text())
    assert prof["publications"][:2] == [[1000, 2000], [500]]


def test_benchmark_local_run_reads_back_everything_written(tmp_path, capsys):
    from straw import benchmark
    root, report = tmp_path / "bench-root", tmp_path / "out" / "report.json"
    benchmark.main(["run", "--local", "--root", str(root), "--report", str(report),
                    "--gib", "0.003", "--record-bytes", "65536", "16384", "--writers", "2",
                    "--readers", "2", "--segment-mib", "1", "--timeout", "120",
                    "--bind", "127.0.0.1"])
    result = json.loads(report.read_text())
    assert result["status"] == "passed"
    per_task = 65536 + 16384
    planned = 2 * int(0.003 * 2**30 / (2 * per_task))
    assert result["publications"] == planned
    assert result["written_bytes"] == result["read_bytes"] == planned * per_task
    assert result["data_files"] >= 2  # two writers, each its own packs
    assert not root.exists()  # a passed run removes its temporary root
    assert json.loads((tmp_path / "out" / "report.cleanup.json").read_text())["removed"]
    assert json.loads(capsys.readouterr().out)["status"] == "passed"
    for extra, words in ((["--hosts", "a", "b"], "--local"), (["--local", "--online-gc", "--gc-interval", "0"],
                                                               "gc-interval")):
        with pytest.raises(ValueError, match=words):
            benchmark.main(["run", "--root", str(tmp_path / "r2"), "--report",
                            str(tmp_path / "r2.json"), "--gib", "0.001", *extra])
        assert not (tmp_path / "r2").exists()
