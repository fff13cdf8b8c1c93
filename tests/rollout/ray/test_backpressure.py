"""The controller actor's bound on how far generation runs ahead of training
(``max_ahead_groups``), as a plain class (no cluster needed): while that many accepted
groups wait for a batch, takes lease nothing (``backpressured``); a batch taking groups
reopens them; a recovered queue's backlog counts from the start; misuses are refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("ray")

from straw import SharedFilesystemStore  # noqa: E402
from straw.rollout import RolloutConfig, Status  # noqa: E402
from straw.rollout.generation import GenerationClient  # noqa: E402
from straw.rollout.ray import ControllerWorker  # noqa: E402

CONFIG = RolloutConfig(n_samples_per_prompt=2, lease_seconds=60, min_refill=1, max_refill=1)
PROMPTS = [(i, i + 1) for i in range(32)]


class Through:
    """The controller actor as a generation client calls it (``RayController`` without
    Ray): the actor's own methods, so its bound applies."""

    def __init__(self, worker: ControllerWorker) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worker, name)

    @property
    def serving_version(self) -> int | str:
        return self.worker.current_version()


def finished(groups):
    return [dataclasses.replace(g, samples=tuple(dataclasses.replace(
        s, tokens=s.tokens + (7,), response_length=1, status=Status.COMPLETED,
        reward=float(s.index % 2)) for s in g.samples)) for g in groups]


def accept_until_refused(client: GenerationClient, limit: int = 20) -> int:
    """Take and complete one group at a time until a take leases nothing; how many."""
    accepted = 0
    while accepted < limit:
        groups = client.take(1)
        if not groups:
            return accepted
        assert [r.action for r in client.return_groups(finished(groups))] == ["completed"]
        accepted += 1
    return accepted


def test_takes_wait_while_the_bound_of_accepted_groups_waits_for_a_batch(tmp_path):
    pool = str(tmp_path / "pool")
    gen = SharedFilesystemStore(pool, "job", writer_id="gen")
    worker = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=2,
                              max_ahead_groups=3)
    client = GenerationClient(Through(worker), gen, worker_id="gen-0", config=CONFIG,
                              heartbeat=False)
    try:
        assert accept_until_refused(client) == 3
        assert client.last_status == "backpressured"
        assert sum(worker.backlog().values()) == 3
        refs = worker.next_batch(0)  # two of the three leave for a batch: room for two
        assert refs is not None
        assert accept_until_refused(client) == 2
        assert client.last_status == "backpressured"
        worker.finish_batch(refs[0].batch_id)
    finally:
        client.close()
        worker.close()
    # the queue recovered: its backlog of three is waiting already, nothing is leased
    again = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=2,
                             max_ahead_groups=3, controller_options={"recover": True})
    client = GenerationClient(Through(again), gen, worker_id="gen-1", config=CONFIG,
                              heartbeat=False)
    try:
        assert sum(again.backlog().values()) == 3
        assert client.take(1) == [] and client.last_status == "backpressured"
    finally:
        client.close()
        again.close()
        gen.close()


def test_without_a_bound_generation_runs_ahead(tmp_path):
    pool = str(tmp_path / "pool")
    gen = SharedFilesystemStore(pool, "job", writer_id="gen")
    worker = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=2)
    client = GenerationClient(Through(worker), gen, worker_id="gen-0", config=CONFIG,
                              heartbeat=False)
    try:
        assert accept_until_refused(client, limit=6) == 6
        assert sum(worker.backlog().values()) == 6
    finally:
        client.close()
        worker.close()
        gen.close()


@pytest.mark.parametrize("ahead, batch, match", [
    (1, 2, "at least|>= batch_groups"), (True, 2, ">= batch_groups"),
    (4, None, "give batch_groups")])
def test_a_bound_that_could_never_fill_a_batch_is_refused(tmp_path, ahead, batch, match):
    with pytest.raises(ValueError, match=match):
        ControllerWorker(str(tmp_path / "pool"), "job", PROMPTS, config=CONFIG,
                         batch_groups=batch, max_ahead_groups=ahead)
