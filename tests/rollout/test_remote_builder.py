"""A trainer's BatchBuilder in another process than the controller: over
``straw.rpc.RemoteCoordinator`` (lost replies retried where safe, the same batches as in
process), and a successor taking the consumer over after its predecessor was SIGKILLed
(``takeover=True``: the dead holder's token is fenced)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from straw import SharedFilesystemStore, UnsafeRecovery
from straw.rollout import BatchBuilder, EnvironmentMix, RolloutConfig
from straw.rpc import RemoteCoordinator, start

from .pool import Pool, make_group

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "remote-builder-test"


@pytest.fixture
def served(tmp_path):
    pool = Pool(str(tmp_path / "pool"))
    server = start(pool.coord, ("127.0.0.1", 0), token=TOKEN)
    yield pool, server.url
    server.close()
    pool.close()


class LoseEveryFirstReply:
    """Each method's first reply is lost after the call reached the coordinator."""

    def __init__(self, remote: RemoteCoordinator) -> None:
        self.inner, self.seen = remote.client.call, set()
        remote.client.call = self  # type: ignore[method-assign]

    def __call__(self, method: str, **args: object) -> object:
        out = self.inner(method, **args)
        if method not in self.seen and method not in ("acquire", "open_consumer"):
            self.seen.add(method)
            raise ConnectionError(f"lost reply of {method}")
        return out


def test_a_builder_over_a_remote_coordinator_builds_the_same_batches(served, tmp_path):
    pool, url = served
    pool.accept([make_group(i, version=i % 3) for i in range(6)])
    remote = RemoteCoordinator(url, token=TOKEN, retry_wait=0)
    flaky = LoseEveryFirstReply(remote)
    trainer = SharedFilesystemStore(pool.root, "job", writer_id="trainer")
    with BatchBuilder(remote, trainer, EnvironmentMix.single(3), dp_size=2) as b:
        refs = b.next_batch(0)
        assert [r.rank for r in refs] == [0, 1]
        assert b.next_batch(0) == refs  # ready: the same references again
        b.finish_batch(refs[0].batch_id)
        second = b.next_batch(1)
        b.finish_batch(second[0].batch_id)
        state = b.state()
    assert {"read_commits", "save_consumer_state", "plan_batch", "batch_ready",
            "complete_task", "submit_tasks"} <= flaky.seen  # each lost once, retried
    assert state["finished_count"] == 2
    view = pool.coord.load_consumer_state("training")
    assert view["processed_cursor"] == 8  # 6 groups and 2 collections, acknowledged
    # an in-process builder resumes from what the remote one saved
    with BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(3), dp_size=2) as b:
        assert b.state() == state
    trainer.close()


def test_online_gc_needs_the_coordinator_in_process(served):
    pool, url = served
    with pytest.raises(ValueError, match="online GC runs collections"):
        BatchBuilder(RemoteCoordinator(url, token=TOKEN), pool.store,
                     EnvironmentMix.single(1), dp_size=1,
                     config=RolloutConfig(online_gc=True))
    # nothing was opened: an in-process builder opens the consumer
    BatchBuilder(pool.coord, pool.store, EnvironmentMix.single(1), dp_size=1).close()


TRAINER = textwrap.dedent("""
    import sys, time
    from straw import SharedFilesystemStore
    from straw.rollout import BatchBuilder, EnvironmentMix
    from straw.rpc import RemoteCoordinator
    root, url, token = sys.argv[1:4]
    store = SharedFilesystemStore(root, "job", writer_id="trainer-0")
    b = BatchBuilder(RemoteCoordinator(url, token=token), store, EnvironmentMix.single(2),
                     dp_size=1)
    print(b.next_batch(0)[0].batch_id, flush=True)
    time.sleep(600)  # "training" when it is killed
""")


def test_a_successor_takes_over_the_consumer_of_a_sigkilled_trainer(served):
    pool, url = served
    pool.accept([make_group(i) for i in range(4)])
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, pool.root, url, TOKEN],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        batch_id = proc.stdout.readline().strip()
        assert batch_id.startswith("batch:"), batch_id
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    store = SharedFilesystemStore(pool.root, "job", writer_id="trainer-1")
    remote = RemoteCoordinator(url, token=TOKEN)
    # the dead trainer's consumer is still open in the controller's coordinator
    with pytest.raises(UnsafeRecovery, match="takeover=True"):
        BatchBuilder(remote, store, EnvironmentMix.single(2), dp_size=1)
    with BatchBuilder(remote, store, EnvironmentMix.single(2), dp_size=1,
                      takeover=True) as b:
        refs = b.next_batch(0)  # the batch it had not finished: replayed, not rebuilt
        assert refs[0].batch_id == batch_id
        b.finish_batch(batch_id)
        assert b.next_batch(1) is not None  # groups 2 and 3
    store.close()
