"""Least privilege on the control servers (issue 39, RPC2): each role's token may call its
role's methods only; straw-queue's single ``token`` stays the operator's (every method)."""

from __future__ import annotations

import pytest

from straw import Coordinator, SharedFilesystemStore, TaskSpec, rpc
from straw.rollout import RolloutController
from straw.rollout.remote import RemoteController
from straw.rollout.remote import start as start_rollout


@pytest.fixture
def coordinator(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "run")
    coord = Coordinator(store)
    coord.submit_tasks("seed", [TaskSpec("t0"), TaskSpec("t1")], producer_id="dataset",
                       producer_state={"offset": 2})
    yield coord
    coord.close()
    store.close()


TOKENS = {"worker": "w-token", "producer": "p-token", "consumer": "c-token",
          "operator": "o-token"}


def test_each_role_calls_its_methods_only_and_nothing_else_happens(coordinator):
    server = rpc.start(coordinator, ("127.0.0.1", 0), tokens=TOKENS)
    try:
        worker = rpc.QueueClient(server.url, token="w-token")
        got = worker.call("acquire", worker_id="w", max_tasks=1)
        assert got["status"] == "acquired"
        for method, args in (("submit_tasks", {"request_id": "forged", "tasks": [],
                                               "producer_id": "dataset",
                                               "producer_state": {"offset": 0}}),
                             ("drain", {}), ("cancel_task", {"task_id": "t1",
                                                             "request_id": "c"}),
                             ("retire_worker", {"worker_id": "w"})):
            with pytest.raises(PermissionError, match=f"worker token may not call '{method}'"):
                worker.call(method, **args)
        assert coordinator.producer_state("dataset") == {"offset": 2}  # not forged
        assert coordinator.task_status("t1")["state"] == "pending"  # not cancelled
        producer = rpc.QueueClient(server.url, token="p-token")
        with pytest.raises(PermissionError):
            producer.call("acquire", worker_id="p", max_tasks=1)
        operator = rpc.QueueClient(server.url, token="o-token")
        assert operator.call("task_status", task_id="t1")["state"] == "pending"
    finally:
        server.close()


def test_straw_queues_single_token_is_the_operators(coordinator):
    server = rpc.start(coordinator, ("127.0.0.1", 0), token="shared")
    try:
        client = rpc.QueueClient(server.url, token="shared")
        assert client.call("acquire", worker_id="w", max_tasks=1)["status"] == "acquired"
        client.call("drain")  # every method, as with straw-queue's server
    finally:
        server.close()


@pytest.mark.parametrize("bad, why", [
    ({"token": "x", "tokens": {"operator": "y"}}, "operator's token once"),
    ({"tokens": {"worker": "same", "consumer": "same"}}, "token of its own"),
    ({"tokens": {"janitor": "j"}}, "unknown role 'janitor'"),
    ({"tokens": {"worker": ""}}, "non-empty str"),
    ({}, "job-scoped token"),
])
def test_bad_token_settings_are_refused(coordinator, bad, why):
    with pytest.raises(ValueError, match=why):
        rpc.ControlServer(coordinator, ("127.0.0.1", 0), **bad)


def test_a_generation_token_calls_the_controller_only(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "job")
    controller = RolloutController(store, [(1, 2, 3)] * 4, config=None)
    server = start_rollout(controller, ("127.0.0.1", 0), token="gen", trainer_token="train")
    try:
        gen = RemoteController(server.url, token="gen")
        assert gen.serving_version is not None  # a controller call
        client = rpc.QueueClient(server.url, token="gen")
        with pytest.raises(PermissionError, match="generation token may not call"):
            client.call("submit_tasks", request_id="x", tasks=[], producer_id="dataset",
                        producer_state={"cursor": 0})
        with pytest.raises(PermissionError):
            client.call("drain")
        trainer = rpc.QueueClient(server.url, token="train")
        assert trainer.call("read_commits", cursor=0, limit=1)["commits"] == []
        with pytest.raises(PermissionError, match="consumer token may not call 'take'"):
            trainer.call("take", worker_id="t", count=1)
    finally:
        server.close()
        controller.close()
        store.close()
