"""A small rollout job for the checkpoint tests: a controller and builder started by
``open_job``, a generator that completes prompt groups through a ``GenerationClient``
(counting its calls), a trainer loop (next_batch, "train" = read the shards, finish),
and a model save that writes two files."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from straw import SharedFilesystemStore
from straw.rollout import EnvironmentMix, RolloutConfig, Status
from straw.rollout.generation import GenerationClient
from straw.rollout.resolve import resolve_checkpoint
from straw.rollout.restore import RolloutJob, open_job
from straw.rollout.samples import VersionSpan

PROMPTS = [(i, i + 1, i + 2) for i in range(200)]
BATCH = 2  # groups per batch
CONFIG = RolloutConfig(n_samples_per_prompt=2, lease_seconds=60, min_refill=4, max_refill=4)


def model_saver(optimizer: bool = True, rng: bool = True, fail: bool = False):
    def save(model_dir: str) -> dict[str, Any]:
        with open(os.path.join(model_dir, "weights.bin"), "wb") as f:
            f.write(np.arange(1000, dtype=np.float32).tobytes())
        with open(os.path.join(model_dir, "meta.json"), "w") as f:
            json.dump({"ok": True}, f)
        if fail:
            raise OSError("model save failed (injected)")
        return {"files": ["weights.bin", "meta.json"], "optimizer": optimizer, "rng": rng}
    return save


class Job:
    """One incarnation of the job (its stores, its started RolloutJob)."""

    def __init__(self, pool: str, save: str, *, load: str | None = None,
                 step: int | None = None, mode_expected: str | None = None,
                 convert_hook: Any = None) -> None:
        self.store = SharedFilesystemStore(pool, "job")
        self.gen_store = SharedFilesystemStore(pool, "job")
        self.resolution = resolve_checkpoint(save, load, step)
        if mode_expected is not None:
            assert self.resolution.mode == mode_expected, self.resolution
        self.job: RolloutJob = open_job(self.resolution, self.store, PROMPTS,
                                        EnvironmentMix.single(BATCH), dp_size=1,
                                        config=CONFIG, convert_hook=convert_hook)
        self.client = GenerationClient(self.job.controller, self.gen_store,
                                       worker_id="gen-0", config=CONFIG)
        self.generator_calls = 0
        self.rollout_id = self.job.next_rollout_id
        self.trained: dict[int, list[Any]] = {}  # rollout id -> the batch's samples

    def generate(self, n: int = 2, version: int | None = None) -> None:
        """One generator call: lease up to ``n`` groups, complete them all (their tokens
        generated under weight ``version``, if given)."""
        self.generator_calls += 1
        groups = self.client.take(n)
        spans = () if version is None else (VersionSpan(0, 2, version),)
        done = [dataclasses.replace(g, samples=tuple(
            dataclasses.replace(s, tokens=s.tokens + (7, 8 + s.index), response_length=2,
                                status=Status.COMPLETED, reward=float(s.index % 3),
                                versions=spans)
            for s in g.samples)) for g in groups]
        self.client.return_groups(done)

    def plan(self) -> Any:
        """The next batch's refs, generating only while the backlog cannot fill it."""
        while True:
            refs = self.job.builder.next_batch(self.rollout_id)
            if refs is not None:
                return refs
            self.generate()

    def train(self, *, finish: bool = True) -> list[Any]:
        refs = self.plan()
        samples = [s for r in refs for s in r.load(self.store, rank=r.rank).samples]
        self.trained[self.rollout_id] = samples
        if finish:
            self.job.builder.finish_batch(refs[0].batch_id)
        self.rollout_id += 1
        return samples

    def save(self, step: int, **kw: Any) -> dict[str, Any]:
        return self.job.save(step, model_saver(**kw))

    def close(self) -> None:
        if not self.gen_store.closed:
            self.client.close()
            self.gen_store.close()
        self.job.close()
        self.store.close()


def train_data(samples: list[Any]) -> list[Any]:
    """A batch's training content (what identical replay compares): tokens, rewards,
    lengths, indices, per sample in order."""
    return [(np.asarray(s["tokens"]).tolist(), s["reward"], s["response_length"],
             s["group_index"], s["index"]) for s in samples]
