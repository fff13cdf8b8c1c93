"""``straw.rpc.RemoteCoordinator``: a served coordinator as a library client calls it, with
our types, the same straw error classes, and lost replies retried only where a repeat is
safe (issue 14: the trainer's client of the controller's coordinator)."""

from __future__ import annotations

import pytest

from straw import (
    IdempotencyConflict,
    Record,
    SharedFilesystemStore,
    StaleAttempt,
    TaskSpec,
    UnsafeRecovery,
)
from straw.coordinator import Coordinator
from straw.protocol import AcquireResult, CommitPage, CommitReceipt
from straw.rpc import RemoteCoordinator, start

TOKEN = "test-token"


@pytest.fixture
def served(tmp_path):
    store = SharedFilesystemStore(str(tmp_path / "pool"), "job", writer_id="controller")
    coord = Coordinator(store, queue_id="work")
    server = start(coord, ("127.0.0.1", 0), token=TOKEN)
    yield store, coord, server.url
    server.close()
    coord.close()
    store.close()


def _result(store, lease, name: str, payload: bytes = b"y"):  # type: ignore[no-untyped-def]
    return store.publish([Record("out", payload, metadata={
        "task_id": lease.task_id, "attempt_id": lease.attempt_id})], submission_id=name)


class LosesReplies:
    """Wraps a client's ``call``: the call reaches the coordinator, then its reply is lost
    (``ConnectionError``), for the first ``n`` calls of each method in ``methods``."""

    def __init__(self, remote: RemoteCoordinator, methods: set[str], n: int = 1) -> None:
        self.inner, self.methods, self.n = remote.client.call, methods, n
        self.lost: dict[str, int] = {}
        self.lost_replies: dict[str, object] = {}
        self.calls: list[str] = []
        remote.client.call = self  # type: ignore[method-assign]

    def __call__(self, method: str, **args: object) -> object:
        self.calls.append(method)
        out = self.inner(method, **args)
        if method in self.methods and self.lost.get(method, 0) < self.n:
            self.lost[method] = self.lost.get(method, 0) + 1
            self.lost_replies[method] = out
            raise ConnectionError(f"lost reply of {method}")
        return out


def test_results_are_our_types_and_errors_the_same_straw_classes(served):
    store, coord, url = served
    remote = RemoteCoordinator(url, token=TOKEN, retry_wait=0)
    ref = store.publish([Record("in", b"x")], submission_id="in")
    remote.submit_tasks("admit", [TaskSpec("t0", input_ref=ref), TaskSpec("t1")])
    got = remote.acquire("w", 1, task_ids=["t0"])
    assert isinstance(got, AcquireResult) and got.status == "acquired"
    (a,) = got.assignments
    assert a.task.input_ref == ref and a.lease.task_id == "t0"
    out = _result(store, a.lease, "out")
    receipt = remote.complete_task(a.lease, submission_id="r0", result_ref=out)
    assert isinstance(receipt, CommitReceipt) and receipt.result_ref == out
    page = remote.read_commits(0, 10)
    assert isinstance(page, CommitPage) and page.commits == (receipt,) and page.cursor == 1
    assert remote.lookup_submission("r0") == receipt
    assert remote.lookup_submission("nothing") is None
    assert remote.task_status("t0")["state"] == coord.task_status("t0")["state"]
    assert remote.get_batch("none") is None and remote.load_consumer_state("training") is None
    other = _result(store, a.lease, "other", b"z")
    with pytest.raises(IdempotencyConflict):  # the same class as in process
        remote.complete_task(a.lease, submission_id="r0", result_ref=other)
    token = remote.open_consumer("training", exclusive_owner="the test's trainer")
    with pytest.raises(UnsafeRecovery):
        remote.open_consumer("training", exclusive_owner="another trainer")
    with pytest.raises(StaleAttempt):
        remote.close_consumer("training", "not-the-token")
    remote.close_consumer("training", token)
    assert remote.consumer_id == coord.consumer_id
    with pytest.raises(ValueError, match="consumer_id"):
        RemoteCoordinator(url, token=TOKEN, consumer_id="")


def test_lost_replies_of_calls_safe_to_repeat_are_retried(served):
    store, coord, url = served
    remote = RemoteCoordinator(url, token=TOKEN, retry_wait=0)
    flaky = LosesReplies(remote, {"submit_tasks", "complete_task", "read_commits",
                                  "save_consumer_state", "close_consumer", "open_consumer"})
    remote.submit_tasks("admit", [TaskSpec("t0")])  # retried: answered from the journal
    assert list(coord.tasks) == ["t0"]
    (a,) = coord.acquire("w", 1).assignments
    out = _result(store, a.lease, "out")
    receipt = remote.complete_task(a.lease, submission_id="r0", result_ref=out)
    assert coord.lookup_submission("r0") == receipt
    assert remote.read_commits(0, 10).commits == (receipt,)
    state = store.publish([Record("state", b"{}", "json.v1")], submission_id="state")
    token = remote.open_consumer("training", exclusive_owner="trainer", takeover=True)
    with pytest.raises(StaleAttempt):  # the retry fenced the token of the lost reply
        coord.save_consumer_state("training", token=flaky.lost_replies["open_consumer"],
                                  request_id="x",
                                  state_ref=state, fetch_cursor=0, processed_cursor=0)
    view = remote.save_consumer_state("training", token=token, request_id="s",
                                      state_ref=state, fetch_cursor=1, processed_cursor=0)
    assert view == coord.load_consumer_state("training")
    remote.close_consumer("training", token)  # the retry finds it closed: this call
    with pytest.raises(StaleAttempt):
        coord.close_consumer("training", token)
    assert flaky.calls.count("submit_tasks") == 2 and flaky.calls.count("close_consumer") == 2


def test_lost_replies_of_calls_unsafe_to_repeat_reach_the_caller(served):
    _, coord, url = served
    remote = RemoteCoordinator(url, token=TOKEN, retry_wait=0)
    coord.submit_tasks("admit", [TaskSpec("t0"), TaskSpec("t1")])
    flaky = LosesReplies(remote, {"acquire", "open_consumer"})
    with pytest.raises(ConnectionError):  # a repeat would lease another task
        remote.acquire("w", 1)
    assert flaky.calls == ["acquire"] and coord.task_status("t0")["state"] == "leased"
    with pytest.raises(ConnectionError):  # a repeat would find it held: takeover=True
        remote.open_consumer("training", exclusive_owner="trainer")
    with pytest.raises(UnsafeRecovery):
        remote.open_consumer("training", exclusive_owner="trainer")
    remote.open_consumer("training", exclusive_owner="trainer", takeover=True)


def test_a_coordinator_gone_for_longer_than_the_retries_is_a_connection_error(tmp_path):
    remote = RemoteCoordinator("http://127.0.0.1:9", token=TOKEN, retries=2, retry_wait=0)
    with pytest.raises(ConnectionError, match="no reply"):
        remote.read_commits(0, 1)
    with pytest.raises(ValueError, match="retries"):
        RemoteCoordinator("http://127.0.0.1:9", token=TOKEN, retries=-1)
