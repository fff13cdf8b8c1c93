"""The controller actor's ``next_batch(rollout_id, timeout=s)``, as a plain class (no
cluster needed): it waits in the controller while the batch fills, woken by the calls
that accept groups, and returns the batch as soon as it is full; None once the time is
up; a timeout that is not a number of seconds is refused before anything is built."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("ray")

from straw import SharedFilesystemStore  # noqa: E402
from straw.rollout.generation import GenerationClient  # noqa: E402
from straw.rollout.ray import ControllerWorker  # noqa: E402

from .test_backpressure import CONFIG, PROMPTS, Through, finished  # noqa: E402


def test_a_waiting_next_batch_returns_once_the_groups_it_needs_are_accepted(tmp_path):
    pool = str(tmp_path / "pool")
    gen = SharedFilesystemStore(pool, "job", writer_id="gen")
    worker = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=2)
    client = GenerationClient(Through(worker), gen, worker_id="gen-0", config=CONFIG,
                              heartbeat=False)
    returned: list[float] = []

    def generate() -> None:
        for _ in range(2):
            time.sleep(0.3)  # the driver is waiting meanwhile
            groups = client.take(1)
            client.return_groups(finished(groups))
            returned.append(time.monotonic())

    try:
        assert worker.next_batch(0) is None  # nothing accepted, no wait asked
        producer = threading.Thread(target=generate)
        producer.start()
        refs = worker.next_batch(0, timeout=30)
        done = time.monotonic()
        producer.join()
        assert refs is not None and len(returned) == 2
        assert done - returned[-1] < 5  # woken by the acceptance, not by the timeout
        shard = refs[0].load(gen, rank=0)
        assert sorted({s["group_index"] for s in shard.samples}) == [0, 1]
        worker.finish_batch(refs[0].batch_id)
    finally:
        client.close()
        worker.close()
        gen.close()


def test_a_batch_that_does_not_fill_in_time_is_none(tmp_path):
    worker = ControllerWorker(str(tmp_path / "pool"), "job", PROMPTS, config=CONFIG,
                              batch_groups=2)
    try:
        start = time.monotonic()
        assert worker.next_batch(0, timeout=0.3) is None
        assert time.monotonic() - start >= 0.3
    finally:
        worker.close()


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), True, "5", None])
def test_a_timeout_that_is_not_seconds_is_refused(tmp_path, timeout):
    worker = ControllerWorker(str(tmp_path / "pool"), "job", PROMPTS, config=CONFIG,
                              batch_groups=2)
    try:
        with pytest.raises(ValueError, match="timeout must be"):
            worker.next_batch(0, timeout=timeout)
        assert worker.backlog() == {} or sum(worker.backlog().values()) == 0
    finally:
        worker.close()


def test_accepted_groups_are_scanned_ahead_of_the_driver_and_built_from_that_scan(tmp_path):
    """Between the driver's calls the controller reads and decodes the groups accepted
    since its builder's last scan, so the batch's build finds them decoded; the batch is
    the one a builder scanning at next_batch makes."""
    pool = str(tmp_path / "pool")
    gen = SharedFilesystemStore(pool, "job", writer_id="gen")
    worker = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=2)
    client = GenerationClient(Through(worker), gen, worker_id="gen-0", config=CONFIG,
                              heartbeat=False)
    builder = worker.builder
    assert builder is not None
    try:
        for _ in range(2):  # (a refill of one prompt a take)
            client.return_groups(finished(client.take(1)))
        with worker._scanned:  # no driver call: the scan ahead reads them
            assert worker._scanned.wait_for(lambda: builder.metrics()["backlog"] == 2,
                                            timeout=30)
        with worker._batches:
            assert len(builder.decoded.kept) == 2 and worker.scans_ahead >= 1
        refs = worker.next_batch(0)
        assert refs is not None
        shard = refs[0].load(gen, rank=0)
        assert sorted({s["group_index"] for s in shard.samples}) == [0, 1]
        worker.finish_batch(refs[0].batch_id)
    finally:
        client.close()
        worker.close()  # stops the scan-ahead thread before the builder closes
        gen.close()
    assert worker._scanner is not None and not worker._scanner.is_alive()


def test_next_batch_finishes_the_batch_trained_last_first_in_the_same_call(tmp_path):
    """``next_batch(rollout_id, finish=batch_id)``: the batch trained last is finished
    (its inputs acknowledged, durably) before the next one is built, one call for both;
    a finish that fails builds nothing; a finish that is not a batch id is refused."""
    pool = str(tmp_path / "pool")
    gen = SharedFilesystemStore(pool, "job", writer_id="gen")
    worker = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=2)
    client = GenerationClient(Through(worker), gen, worker_id="gen-0", config=CONFIG,
                              heartbeat=False)
    coord = worker.controller.coordinator
    try:
        for _ in range(4):
            client.return_groups(finished(client.take(1)))
        first = worker.next_batch(0)
        assert first is not None
        assert coord.load_consumer_state("training")["processed_cursor"] == 0
        with pytest.raises(TypeError, match="finish must be None or a batch id"):
            worker.next_batch(1, finish=first[0])  # the reference, not its id
        with pytest.raises(ValueError):
            worker.next_batch(1, finish="batch:unknown")
        assert sum(worker.backlog().values()) == 2  # nothing was built meanwhile
        assert not coord.get_batch(first[0].batch_id)["finished"]
        second = worker.next_batch(1, finish=first[0].batch_id)
        assert second is not None and second[0].batch_id != first[0].batch_id
        assert coord.get_batch(first[0].batch_id)["finished"]
        assert coord.load_consumer_state("training")["processed_cursor"] > 0
        # a retry of the same call after a lost reply: the finish is idempotent
        again = worker.next_batch(1, finish=first[0].batch_id)
        assert again is not None and again[0].batch_id == second[0].batch_id
        worker.finish_batch(second[0].batch_id)
    finally:
        client.close()
        worker.close()
        gen.close()
