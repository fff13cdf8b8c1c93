"""Fork safety (issue 11, finding 1): objects opened by a process refuse use in its forked
child with ``ForkedProcess`` and the child never touches the parent's state
(``straw.process``).

Each test forks with ``os.fork()``; the child reports what happened through a pipe (JSON)
and always leaves with ``os._exit`` (never back into pytest).  The parent reads the
report with a generous deadline only as a deadlock guard: a child that hangs (a lock held
at the fork, a thread pool whose threads did not survive it) fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import select
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from straw import ForkedProcess, Record, RecordSetRef, SharedFilesystemStore, UnsafeRecovery
from straw.coordinator import Coordinator
from straw.protocol import TaskSpec
from straw.tensor import TensorRef, publish_tensors

DEADLOCK_GUARD = 120.0  # seconds: far above what any child here needs


def _store(root: Any, writer_id: str = "parent") -> SharedFilesystemStore:
    return SharedFilesystemStore(str(root), "run", writer_id=writer_id, reserve_bytes=0,
                                 visibility_retries=1)


def _rec(text: str, **meta: Any) -> list[Record]:
    return [Record("r", text.encode(), metadata=meta)]


def _outcome(call: Callable[[], Any]) -> str:
    """The class name of what ``call`` raised, or "returned"."""
    try:
        result = call()
        if hasattr(result, "__enter__") and hasattr(result, "__exit__"):
            with result:  # a context manager: entering it is the use
                pass
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        return type(e).__name__
    return "returned"


def _read_report(fd: int, pid: int) -> Any:
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], DEADLOCK_GUARD)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
            pytest.fail("the forked child hung (deadlock)")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks) or b"null")


def in_child(body: Callable[[], Any]) -> Any:
    """Fork, run ``body`` in the child, return its (JSON) result in the parent; an
    exception in the child fails the test with the child's traceback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(r)
            try:
                out: dict[str, Any] = {"result": body()}
            except BaseException:  # noqa: BLE001 - reported to the parent
                out = {"error": traceback.format_exc()}
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(w, data):]
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    report = _read_report(r, pid)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report is not None and "error" not in report, report and report.get("error")
    return report["result"]


def _lock_is_held(root: Any, writer_id: str) -> bool:
    """Whether writer ``writer_id``'s lock is held (by another open file description)."""
    probe = _store(root, writer_id)
    try:
        probe.lookup_submission("probe")
    except UnsafeRecovery:
        return True
    finally:
        probe.close()
    return False


def _queue(store: SharedFilesystemStore) -> Coordinator:
    return Coordinator(store, queue_id="q", lease_seconds=600)


def _check_everything_reads_back(root: Any, acked: dict[str, dict[str, Any]]) -> None:
    """After a restart: every acknowledged publication of every writer reads back, each
    writer's lookup returns it, and the catalog replays (owners, a collection)."""
    for writer_id, subs in acked.items():
        with _store(root, writer_id) as s:
            for sid, (ref, text) in subs.items():
                assert bytes(next(s.read(ref)).payload) == text.encode(), (writer_id, sid)
                assert s.lookup_submission(sid) == (ref,), (writer_id, sid)
    with _store(root, "checker") as s:
        assert "kept" in s.owners()
        s.collect_garbage()  # replays the whole catalog and acts on it
        for subs in acked.values():
            for ref, text in subs.values():
                assert bytes(next(s.read(ref)).payload) == text.encode()


# --- the finding ----------------------------------------------------------------------

def test_fork_child_store_refuses(tmp_path):
    """Every kind of entry point refuses in the child; the parent's lock stays held, the
    parent keeps publishing; the child's own store works; after both close and after a
    restart every acknowledged publication reads back and the catalog replays."""
    store = _store(tmp_path)
    acked: dict[str, dict[str, Any]] = {"parent": {}, "child": {}}
    for i in range(3):
        acked["parent"][f"p{i}"] = (store.publish(_rec(f"parent {i}"), submission_id=f"p{i}"),
                                    f"parent {i}")
    first = acked["parent"]["p0"][0]
    store.retain("kept", [first])
    (tensor,) = publish_tensors(store, {"t": np.arange(12.0)}, submission_id="tensor")
    session = store.read_session()
    session.read(first)
    q = _queue(store)
    q.submit_tasks("req", [TaskSpec("t0", first), TaskSpec("t1", first)])
    (assignment,) = q.acquire("worker").assignments
    lease = assignment.lease
    result = store.publish(_rec("answer", task_id=lease.task_id, attempt_id=lease.attempt_id),
                           submission_id="result")

    def child() -> dict[str, Any]:
        tried = {
            "publish": lambda: store.publish(_rec("child"), submission_id="c-inherited"),
            "publish_many": lambda: store.publish_many([], submission_id="c-many"),
            "lookup_submission": lambda: store.lookup_submission("p0"),
            "read": lambda: store.read(first),
            "read_record": lambda: store.read_record(store.validate(first)[0]),
            "manifest": lambda: store.checked_manifest(first),
            "validate": lambda: store.validate(first),
            "retain": lambda: store.retain("kept", []),
            "release": lambda: store.release("kept"),
            "release_publications": lambda: store.release_publications([first]),
            "pin": lambda: store.pin([first]),
            "collect_garbage": lambda: store.collect_garbage(),
            "seal": lambda: store.seal(),
            "owners": lambda: store.owners(),
            "read_session": lambda: store.read_session(),
            "with store": lambda: store,
            "session.read": lambda: session.read(first),
            "session.manifest": lambda: session.checked_manifest(first),
            "catalog.locked": lambda: store.catalog.locked(),
            "catalog.retain": lambda: store.catalog.retain("kept", []),
            "catalog.collect": lambda: store.catalog.collect(),
            "acquire": lambda: q.acquire("worker"),
            "complete_task": lambda: q.complete_task(lease, submission_id="done",
                                                     result_ref=result),
            "heartbeat": lambda: q.heartbeat([lease]),
            "read_commits": lambda: q.read_commits(),
            "queue collect_garbage": lambda: q.collect_garbage(),
            "new Coordinator on the inherited store":
                lambda: Coordinator(store, queue_id="q", recover=True, takeover=True),
            "tensor load": lambda: tensor.load(),
            "tensor rows": lambda: tensor[2:4],
        }
        outcomes = {name: _outcome(call) for name, call in tried.items()}
        # a store of the child's own works normally, and reads the parent's data
        with _store(tmp_path, "child") as mine:
            refs = {f"c{i}": mine.publish(_rec(f"child {i}"), submission_id=f"c{i}").to_dict()
                    for i in range(3)}
            parents = bytes(next(mine.read(first)).payload).decode()
            tensor_rows = tensor.using(mine)[2:4].tolist()
        return {"outcomes": outcomes, "refs": refs, "parents": parents,
                "tensor_rows": tensor_rows}

    report = in_child(child)
    wrong = {k: v for k, v in report["outcomes"].items() if v != "ForkedProcess"}
    assert not wrong, wrong
    assert report["parents"] == "parent 0"
    assert report["tensor_rows"] == [2.0, 3.0]
    for sid, d in report["refs"].items():
        acked["child"][sid] = (RecordSetRef.from_dict(d), "child " + sid[1:])

    # the parent's writer lock is still held: a second store of its writer id is refused
    assert _lock_is_held(tmp_path, "parent")
    # the parent goes on: publishing (same pack, next offset), its queue, its reads
    for i in range(3, 6):
        acked["parent"][f"p{i}"] = (store.publish(_rec(f"parent {i}"), submission_id=f"p{i}"),
                                    f"parent {i}")
    assert acked["parent"]["p5"][0].path == first.path
    receipt = q.complete_task(lease, submission_id="done", result_ref=result)
    assert receipt.position == 0
    assert np.array_equal(tensor.load(), np.arange(12.0))
    assert bytes(next(session.read(first)).payload) == b"parent 0"
    session.close()
    q.close()
    store.close()
    _check_everything_reads_back(tmp_path, acked)
    with _store(tmp_path, "checker") as s:
        with Coordinator(s, queue_id="q", recover=True) as again:
            page = again.read_commits()
            assert [c.task_id for c in page.commits] == ["t0"]
            assert again.task_status("t1")["state"] == "pending"


INTERNAL_CLOSERS = {("writer", "release"), ("writer", "close"), ("catalog", "close"),
                    ("journal", "close")}


def test_fork_child_every_public_method_refuses(tmp_path):
    """No path escapes the check: every public method and property of every
    process-bound object raises ForkedProcess in the child, before it even looks at its
    arguments (all of them None here)."""
    store = _store(tmp_path)
    ref = store.publish(_rec("x"), submission_id="x")
    q = _queue(store)
    q.submit_tasks("req", [TaskSpec("t0", ref)])
    assert store._writer is not None
    objects = {"store": store, "session": store.read_session(), "catalog": store.catalog,
               "writer": store._writer, "coordinator": q, "journal": q.journal}

    def child() -> dict[str, str]:
        out = {}
        for label, obj in objects.items():
            for name, member in inspect.getmembers(type(obj)):
                # __exit__ and the internal objects' closers are child-safe no-ops
                # (test_fork_child_close_...); the public objects' close() refuses
                closer = name == "__exit__" or (label, name) in INTERNAL_CLOSERS
                if closer or (name.startswith("_") and name != "__enter__"):
                    continue
                if isinstance(member, property):
                    out[f"{label}.{name}"] = _outcome(lambda n=name, o=obj: getattr(o, n))
                elif inspect.isfunction(member):
                    params = list(inspect.signature(member).parameters.values())[1:]
                    args = [None for p in params if p.default is p.empty
                            and p.kind is p.POSITIONAL_OR_KEYWORD]
                    kwargs = {p.name: None for p in params if p.default is p.empty
                              and p.kind is p.KEYWORD_ONLY}
                    bound = getattr(obj, name)
                    out[f"{label}.{name}"] = _outcome(lambda b=bound, a=args, k=kwargs:
                                                      b(*a, **k))
        return out

    outcomes = in_child(child)
    assert len(outcomes) > 60  # the probe really walked the interfaces
    wrong = {k: v for k, v in outcomes.items() if v != "ForkedProcess"}
    assert not wrong, wrong
    q.close()
    store.close()


def test_fork_child_close_touches_nothing(tmp_path):
    """In the child, close() of the store, the session and the coordinator raises
    ForkedProcess (straw-queue's rule), __exit__ and the journal's close() return; none
    touches the parent's state: the pack is not sealed or trimmed, no lock is released,
    the queue goes on."""
    store = _store(tmp_path)
    ref = store.publish(_rec("before"), submission_id="before")
    q = _queue(store)
    q.submit_tasks("req", [TaskSpec("t0", ref)])
    session = store.read_session()
    session.read(ref)
    pack = os.path.join(str(tmp_path), ref.path)
    with open(pack, "rb") as f:
        before = f.read()

    def child() -> dict[str, str]:
        return {"session": _outcome(session.close), "coordinator": _outcome(q.close),
                "journal": _outcome(q.journal.close), "store": _outcome(store.close),
                "again": _outcome(store.close),
                "session exit": _outcome(lambda: session.__exit__(None, None, None)),
                "coordinator exit": _outcome(lambda: q.__exit__(None, None, None)),
                "store exit": _outcome(lambda: store.__exit__(None, None, None))}

    outcomes = in_child(child)
    assert {k: v for k, v in outcomes.items() if v != "returned"} == {
        "session": "ForkedProcess", "coordinator": "ForkedProcess", "store": "ForkedProcess",
        "again": "ForkedProcess"}
    with open(pack, "rb") as f:
        assert f.read() == before  # not sealed, not truncated, not written
    assert _lock_is_held(tmp_path, "parent")
    with _store(tmp_path, "other") as other, pytest.raises(UnsafeRecovery):
        Coordinator(other, queue_id="q", recover=True)  # the epoch lock is the parent's
    after = store.publish(_rec("after"), submission_id="after")
    assert after.path == ref.path and after.offset > ref.offset
    (a,) = q.acquire("w").assignments
    out = store.publish(_rec("out", task_id="t0", attempt_id=a.lease.attempt_id),
                        submission_id="out")
    q.complete_task(a.lease, submission_id="done", result_ref=out)
    assert bytes(next(session.read(ref)).payload) == b"before"
    session.close()
    q.close()
    store.close()
    with _store(tmp_path) as s:
        assert bytes(next(s.read(after)).payload) == b"after"
        with Coordinator(s, queue_id="q", recover=True) as again:
            assert [c.task_id for c in again.read_commits().commits] == ["t0"]


def test_fork_child_exiting_through_with_store_touches_nothing(tmp_path):
    """A child forked inside ``with store:`` that leaves the block through sys.exit: the
    block's close() in the child is harmless; the parent's block goes on."""
    parent = os.getpid()
    first = None
    try:
        with _store(tmp_path) as store:
            first = store.publish(_rec("first"), submission_id="first")
            pack = os.path.join(str(tmp_path), first.path)
            with open(pack, "rb") as f:
                before = f.read()
            pid = os.fork()
            if pid == 0:
                sys.exit(7)  # leaves the with block in the child: store.__exit__ runs
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 7  # __exit__ did not raise
            with open(pack, "rb") as f:
                assert f.read() == before
            assert _lock_is_held(tmp_path, "parent")
            second = store.publish(_rec("second"), submission_id="second")
            assert second.path == first.path
    except BaseException as e:
        if os.getpid() != parent:  # the child: report through the exit status only
            os._exit(7 if isinstance(e, SystemExit) and e.code == 7 else 1)
        raise
    with _store(tmp_path) as s:
        assert bytes(next(s.read(first)).payload) == b"first"
        assert bytes(next(s.read(second)).payload) == b"second"


def test_fork_child_leaving_a_pin_block_keeps_the_parents_pin(tmp_path):
    """A child forked inside ``with store.pin(refs):`` that leaves the block does not
    release the parent's (durable) pin: collection still cannot reclaim the pack."""
    with _store(tmp_path) as store:
        ref = store.publish(_rec("pinned"), submission_id="pinned")
        store.seal()
        store.release_publications([ref])  # only the pin protects it now
        with store.pin([ref]) as pin:

            def child() -> str:
                return _outcome(lambda: pin.__exit__(None, None, None))

            assert in_child(child) == "returned"
            assert pin.owner in store.owners()
            assert store.collect_garbage()["reclaimed_files"] == 0
            assert bytes(next(store.read(ref)).payload) == b"pinned"
        assert pin.owner not in store.owners()


def test_fork_child_does_not_keep_parent_locks(tmp_path):
    """A child that outlives its SIGKILLed parent holds none of the parent's locks: the
    parent's writer id restarts and its queue recovers while the child still runs."""
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # P: opens a store and a queue, forks C, then waits to be killed
        try:
            os.close(report_r)
            os.close(hold_w)
            store = _store(tmp_path)
            ref = store.publish(_rec("p"), submission_id="p")
            q = _queue(store)
            q.submit_tasks("req", [TaskSpec("t0", ref)])
            child = os.fork()
            if child == 0:  # C: stays alive until the test closes the hold pipe
                os.close(report_w)
                os.read(hold_r, 1)
                os._exit(0)
            os.close(hold_r)
            os.write(report_w, json.dumps({"child": child}).encode())
            os.close(report_w)
            signal.pause()
        finally:
            os._exit(1)
    os.close(report_w)
    os.close(hold_r)
    try:
        child = _read_report(report_r, pid)["child"]
        os.kill(pid, signal.SIGKILL)  # P dies holding its locks (no close, no unlock)
        os.waitpid(pid, 0)
        os.kill(child, 0)  # C is alive
        assert not _lock_is_held(tmp_path, "parent")
        with _store(tmp_path) as s:
            assert s.lookup_submission("p") is not None
            with Coordinator(s, queue_id="q", recover=True) as q:
                assert q.task_status("t0")["state"] == "pending"
    finally:
        os.close(hold_w)  # C exits


def test_fork_with_locks_held_by_another_thread(tmp_path):
    """Locks another thread holds at the fork stay held forever in the child: the refusal
    comes before any of them (close()'s too), and a fresh store (tensor loads with
    their thread pool and store cache included) works."""
    store = _store(tmp_path)
    ref = store.publish(_rec("x"), submission_id="x")
    q = _queue(store)
    q.submit_tasks("req", [TaskSpec("t0", ref)])
    session = store.read_session()
    big = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: hashed by the thread pool
    (tensor,) = publish_tensors(store, {"big": big}, submission_id="big")
    assert np.array_equal(tensor.load(), big)  # the pool's threads exist in the parent
    unbound = pickle.loads(pickle.dumps(tensor))
    assert np.array_equal(unbound.load(), big)  # the parent's cached store for unbound refs
    import straw.tensors.binding as binding_mod
    import straw.tensors.buffers as buffers_mod
    import straw.tensors.threads as threads_mod

    locks = [store._write_lock, store.catalog._mutex, store.catalog._pending_lock,
             session._lock, q._mutex, q.journal._mu, threads_mod._pool_lock,
             binding_mod._auto_lock, buffers_mod._buffers.lock]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        held.set()
        release.wait()
        for lock in reversed(locks):
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()

    def child() -> dict[str, Any]:
        outcomes = {
            "publish": _outcome(lambda: store.publish(_rec("c"), submission_id="c")),
            "seal": _outcome(store.seal),
            "owners": _outcome(store.owners),
            "session.read": _outcome(lambda: session.read(ref)),
            "acquire": _outcome(lambda: q.acquire("w")),
            "metrics": _outcome(q.metrics),
            "journal.seq": _outcome(lambda: q.journal.seq),
            "tensor load": _outcome(tensor.load),
            "session.close": _outcome(session.close),
            "coordinator.close": _outcome(q.close),
            "store.close": _outcome(store.close),
        }
        with _store(tmp_path, "child") as mine:
            mine.publish(_rec("mine"), submission_id="mine")
            loaded = tensor.using(mine).load()
            loaded_unbound = pickle.loads(pickle.dumps(tensor)).load()
            ok = bool(np.array_equal(loaded, big) and np.array_equal(loaded_unbound, big))
        return {"outcomes": outcomes, "loads": ok}

    try:
        report = in_child(child)
    finally:
        release.set()
        holder.join()
    assert set(report["outcomes"].values()) == {"ForkedProcess"}, report["outcomes"]
    assert report["loads"]
    assert bytes(next(store.read(ref)).payload) == b"x"
    session.close()
    q.close()
    store.close()


def test_forked_process_message_says_what_to_do(tmp_path):
    store = _store(tmp_path)
    store.publish(_rec("x"), submission_id="x")
    parent = os.getpid()

    def child() -> str:
        try:
            store.publish(_rec("c"), submission_id="c")
        except ForkedProcess as e:
            return str(e)
        return ""

    message = in_child(child)
    assert f"opened by process {parent}" in message
    assert "writer 'parent'" in message and str(tmp_path) in message
    assert "Open a new SharedFilesystemStore in the child" in message
    assert "writer_id" in message
    store.close()


def test_tensor_ref_pickled_into_a_child_reads_through_its_own_store(tmp_path):
    """A TensorRef sent pickled (the binding is dropped) reads in the child through a
    store of the child's own; the bound original refuses there."""
    with _store(tmp_path) as store:
        (tensor,) = publish_tensors(store, {"t": np.arange(6)}, submission_id="t")
        blob = pickle.dumps(tensor)

        def child() -> dict[str, Any]:
            ref: TensorRef = pickle.loads(blob)
            return {"pickled": ref.load().tolist(), "bound": _outcome(tensor.load)}

        assert in_child(child) == {"pickled": list(range(6)), "bound": "ForkedProcess"}


# --- the remedy: worker processes forked from a process with a store open ----------------

_worker_store: SharedFilesystemStore | None = None


def _worker_init(root: str) -> None:
    """A worker_init_fn: each forked worker opens a store of its own."""
    global _worker_store
    _worker_store = _store(root, f"worker-{os.getpid()}")


def _worker_task(tensor: TensorRef) -> dict[str, Any]:
    """Load a tensor sent pickled, publish a result under the worker's own writer id."""
    assert _worker_store is not None
    # NumPy, not torch: a torch reduction in a forked child after the parent process used
    # torch's OpenMP pool can deadlock (a torch limitation, the reason DataLoader workers run
    # one thread); what this test checks is straw's stores and sessions across fork.
    total = float(tensor.load(framework="numpy").sum())
    ref = _worker_store.publish(_rec(repr(total)), submission_id=f"sum-{tensor.name}")
    return {"total": total, "ref": ref.to_dict()}


def test_fork_pool_workers_with_their_own_stores(tmp_path):
    """A multiprocessing pool forked (like DataLoader workers) from a process with a store
    open, after it loaded large tensors with its thread pool: each worker opens its own
    store, loads pickled TensorRefs and publishes; the parent's store goes on."""
    import multiprocessing

    store = _store(tmp_path)
    arrays = {f"t{i}": np.full(3 << 20, i, dtype=np.float32) for i in range(3)}  # 12 MiB
    tensors = publish_tensors(store, arrays, submission_id="tensors")
    assert all(np.array_equal(t.load(), arrays[t.name]) for t in tensors)  # pool threads up
    with multiprocessing.get_context("fork").Pool(2, _worker_init, (str(tmp_path),)) as pool:
        results = pool.map_async(_worker_task, tensors).get(timeout=DEADLOCK_GUARD)
    assert [r["total"] for r in results] == [float(i * (3 << 20)) for i in range(3)]
    after = store.publish(_rec("parent after"), submission_id="after")
    assert _lock_is_held(tmp_path, "parent")
    store.close()
    with _store(tmp_path, "reader") as s:
        for r in results:
            assert bytes(next(s.read(RecordSetRef.from_dict(r["ref"]))).payload) == \
                repr(r["total"]).encode()
        assert bytes(next(s.read(after)).payload) == b"parent after"
