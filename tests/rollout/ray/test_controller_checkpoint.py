"""The controller actor started from a checkpoint resolution (what the demo's Ray job
does), as a plain class (no cluster needed: the actor's methods are its class's): a new
run, a joint checkpoint saved where the queue lives, a trainer's state recorded in the
queue, then a salvage resume of that checkpoint; and the misuses, refused clearly."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("ray")

from straw import SharedFilesystemStore  # noqa: E402
from straw.rollout import Status  # noqa: E402
from straw.rollout.generation import GenerationClient  # noqa: E402
from straw.rollout.ray import ControllerWorker  # noqa: E402
from straw.rollout.resolve import NEW, SALVAGE, resolve_checkpoint  # noqa: E402

from ..ckpt_job import BATCH, CONFIG, PROMPTS, model_saver  # noqa: E402


def fill(worker: ControllerWorker, store: SharedFilesystemStore, rollout_id: int):
    """Complete groups through a generation client until batch ``rollout_id`` is full;
    returns its refs and how many groups were generated."""
    client = GenerationClient(worker.controller, store, worker_id=f"gen-{rollout_id}",
                              config=CONFIG)
    generated = 0
    try:
        while (refs := worker.next_batch(rollout_id)) is None:
            groups = client.take(2)
            generated += len(groups)
            client.return_groups([dataclasses.replace(g, samples=tuple(dataclasses.replace(
                s, tokens=s.tokens + (7,), response_length=1, status=Status.COMPLETED,
                reward=float(s.index % 2)) for s in g.samples)) for g in groups])
    finally:
        client.close()
    return refs, generated


def test_a_job_started_from_a_resolution_checkpoints_and_resumes_by_salvage(tmp_path):
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    gen = SharedFilesystemStore(pool, "job", writer_id="gen")
    try:
        worker = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=BATCH,
                                  checkpoint=resolve_checkpoint(save))
        try:
            started = worker.resolution()
            assert (started["mode"], started["step"], started["next_rollout_id"]) == \
                (NEW, None, 0)
            assert started["queue"] == {"namespace": "branches",
                                        "queue_id": started["branch_id"]}
            refs, _ = fill(worker, gen, 0)
            worker.finish_batch(refs[0].batch_id)
            marker = worker.save_checkpoint(0, model_saver())
            assert marker["step"] == 0 and marker["queue"] == started["queue"]
            worker.record_state("weights:1", "weights", {"version": 1})
            assert worker.producer_state("weights") == {"version": 1}
            # accepted after the checkpoint, never trained: the salvage restores it
            after, _ = fill(worker, gen, 1)
        finally:
            worker.close()
        again = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=BATCH,
                                 checkpoint=resolve_checkpoint(save))
        try:
            resumed = again.resolution()
            assert (resumed["mode"], resumed["step"], resumed["next_rollout_id"]) == \
                (SALVAGE, 0, 1)
            assert resumed["restored"] >= BATCH and resumed["queue"] != started["queue"]
            # batch 1 replayed from the restored groups: nothing generated for it
            refs, generated = fill(again, gen, 1)
            assert generated == 0
            assert [r.load(gen, rank=r.rank).samples[0]["tokens"].tolist() for r in refs] == \
                [r.load(gen, rank=r.rank).samples[0]["tokens"].tolist() for r in after]
        finally:
            again.close()
    finally:
        gen.close()


def test_misuses_of_the_checkpoint_options_are_refused_by_name(tmp_path):
    pool, save = str(tmp_path / "pool"), str(tmp_path / "save")
    with pytest.raises(ValueError, match="give batch_groups"):
        ControllerWorker(pool, "job", PROMPTS, config=CONFIG,
                         checkpoint=resolve_checkpoint(save))
    with pytest.raises(ValueError, match="give no controller_options"):
        ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=BATCH,
                         controller_options={"queue_id": "q"},
                         checkpoint=resolve_checkpoint(save))
    plain = ControllerWorker(pool, "job", PROMPTS, config=CONFIG, batch_groups=BATCH)
    try:
        with pytest.raises(RuntimeError, match="not started from a checkpoint resolution"):
            plain.save_checkpoint(0, model_saver())
        with pytest.raises(RuntimeError, match="give checkpoint=resolve_checkpoint"):
            plain.resolution()
    finally:
        plain.close()
