"""The control lane over RPC: control tasks (the batch builder's collections) are the
consumer's and the operator's (``straw.rpc.CONTROL_ROLES``).  Another role can neither
acquire nor submit one, nor pass a control task's lease, and ``task_status`` shows it no
lease token; the builder's own remote calls keep working."""

from __future__ import annotations

import pytest

from straw import Record, SharedFilesystemStore, TaskSpec, rpc
from straw.coordinator import Coordinator
from straw.protocol import Lease
from straw.rollout import RolloutController
from straw.rollout.remote import RemoteController
from straw.rollout.remote import start as start_rollout

TOKENS = {"worker": "w-token", "producer": "p-token", "consumer": "c-token",
          "operator": "o-token"}


@pytest.fixture
def served(tmp_path):
    store = SharedFilesystemStore(str(tmp_path / "pool"), "job", writer_id="c")
    coord = Coordinator(store, queue_id="work")
    coord.submit_tasks("seed", [TaskSpec("t0"), TaskSpec("collection:0", control=True,
                                                         estimated_records=0)])
    server = rpc.start(coord, ("127.0.0.1", 0), tokens=TOKENS)
    clients = {role: rpc.QueueClient(server.url, token=t) for role, t in TOKENS.items()}
    yield store, coord, clients
    server.close()
    coord.close()
    store.close()


def _out(store, lease, name):  # type: ignore[no-untyped-def]
    return store.publish([Record("plan", b"p", metadata={
        "task_id": lease.task_id, "attempt_id": lease.attempt_id})], submission_id=name)


def test_a_worker_cannot_reach_the_control_lane(served):
    store, coord, c = served
    worker = c["worker"]
    with pytest.raises(PermissionError, match="worker token may not call 'acquire' on the "
                                              "control lane"):
        worker.call("acquire", worker_id="evil", max_tasks=5, control=True)
    assert coord.task_status("collection:0")["state"] == "pending"
    (a,) = coord.acquire("builder", 1, control=True).assignments  # the builder's lease
    lease = a.lease  # leaked, or derived: a lease token is a checksum, not a secret
    ref = _out(store, lease, "forged")
    for method, args in (
            ("complete_task", {"lease": lease, "submission_id": "forged", "result_ref": ref}),
            ("complete_and_acquire", {"lease": lease, "submission_id": "forged",
                                      "result_ref": ref}),
            ("fail_task", {"lease": lease, "request_id": "f", "retryable": False}),
            ("heartbeat", {"leases": [lease]}),
            ("release_tasks", {"leases": [lease]}),
            ("yield_tasks", {"updates": [{"lease": lease, "input_ref": None}],
                             "request_id": "y"})):
        with pytest.raises(PermissionError, match="control lane"):
            worker.call(method, **args)
    assert coord.task_status("collection:0")["state"] == "leased"
    assert coord.lookup_submission("forged") is None
    # its own lane is untouched
    (got,) = worker.call("acquire", worker_id="w", max_tasks=5)["assignments"]
    assert got["task"]["task_id"] == "t0"
    worker.call("heartbeat", leases=[got["lease"]])


def test_a_producer_cannot_submit_a_control_task(served):
    _, coord, c = served
    with pytest.raises(PermissionError, match="control lane"):
        c["producer"].call("submit_tasks", request_id="x", tasks=[
            {"task_id": "collection:9", "control": True, "estimated_records": 0}])
    assert coord.task_status("collection:9") is None
    c["producer"].call("submit_tasks", request_id="y", tasks=[{"task_id": "t9"}])


def test_task_status_shows_a_lease_token_to_the_lanes_owners_only(served):
    _, coord, c = served
    coord.acquire("w", 1)
    coord.acquire("builder", 1, control=True)
    for task_id in ("t0", "collection:0"):
        assert coord.task_status(task_id)["lease"]["token"]
        for role in ("worker", "producer"):
            lease = c[role].call("task_status", task_id=task_id)["lease"]
            assert lease["task_id"] == task_id and "token" not in lease
        assert c["operator"].call("task_status", task_id=task_id)["lease"]["token"]
    assert "token" not in c["consumer"].call("task_status", task_id="t0")["lease"]
    assert c["consumer"].call("task_status", task_id="collection:0")["lease"]["token"]


def test_the_builders_remote_calls_keep_working(served):
    store, coord, c = served
    remote = rpc.RemoteCoordinator(c["consumer"].address, token="c-token")
    remote.submit_tasks("collection:1", [TaskSpec("collection:1", control=True,
                                                  estimated_records=0)])
    got = remote.acquire("builder", 1, task_ids=["collection:1"], control=True)
    assert [a.lease.task_id for a in got.assignments] == ["collection:1"]
    # a lost reply: the builder finds its lease again through task_status
    lease = Lease(**remote.task_status("collection:1")["lease"])
    assert lease == got.assignments[0].lease
    receipt = remote.complete_task(lease, submission_id="collection:1",
                                   result_ref=_out(store, lease, "plan-1"))
    assert coord.lookup_submission("collection:1") == receipt


def test_generation_clients_never_reach_the_control_lane(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "job")
    controller = RolloutController(store, [(1, 2, 3)] * 4, config=None)
    coord = controller.coordinator
    coord.submit_tasks("collection:0", [TaskSpec("collection:0", control=True,
                                                 estimated_records=0)])
    (a,) = coord.acquire("builder", 1, control=True).assignments
    server = start_rollout(controller, ("127.0.0.1", 0), token="gen", trainer_token="train",
                           operator_token="op")
    try:
        gen = RemoteController(server.url, token="gen")
        assert "token" not in gen.task_status("collection:0")["lease"]
        with pytest.raises(PermissionError, match="generation token may not call "
                                                  "'complete_many' on the control lane"):
            gen.complete_many([{"lease": a.lease, "result_ref": _out(store, a.lease, "x"),
                                "staleness": None}])
        for call in (lambda: gen.heartbeat([a.lease]),
                     lambda: gen.release([a.lease], request_id="r"),
                     lambda: gen.reject(a.lease, category="x", reason="y")):
            with pytest.raises(PermissionError, match="control lane"):
                call()
        assert coord.task_status("collection:0")["state"] == "leased"
        trainer = rpc.RemoteCoordinator(server.url, token="train")
        assert trainer.task_status("collection:0")["lease"]["token"] == a.lease.token
        operator = rpc.QueueClient(server.url, token="op")
        assert operator.call("task_status", task_id="collection:0")["lease"]["token"]
    finally:
        server.close()
        controller.close()
        store.close()


def test_a_coordinator_without_live_tasks_is_asked_by_task_status():
    class Stub:  # what another coordinator serves: task_status, and the calls
        def __init__(self) -> None:
            self.completed: list[str] = []

        def task_status(self, task_id: str) -> dict[str, object]:
            return {"spec": {"task_id": task_id, "control": task_id.startswith("c")}}

        def complete_task(self, lease: Lease, **kw: object) -> None:
            self.completed.append(lease.task_id)

    stub = Stub()
    server = rpc.ControlServer(stub, ("127.0.0.1", 0), tokens={"worker": "w"})
    try:
        lease = {"run_id": "r", "queue_id": "q", "attempt_id": "a", "generation": 1,
                 "coordinator_epoch": "1", "token": "t", "worker_id": "w"}
        with pytest.raises(PermissionError, match="control lane"):
            server.dispatch({"method": "complete_task", "args": {
                "lease": {**lease, "task_id": "c0"}, "submission_id": "s"}}, "worker")
        server.dispatch({"method": "complete_task", "args": {
            "lease": {**lease, "task_id": "t0"}, "submission_id": "s"}}, "worker")
        assert stub.completed == ["t0"]
    finally:
        server.server_close()
