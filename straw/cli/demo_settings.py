"""The demo's settings and what its processes share: the job's size (``Settings``,
passed to each job process on its command line), the run and directory names, the
rollout configuration, the store, the toy policy and prompts, and the fsynced logs every
process keeps."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from ..fs import PosixFS
from ..publication_log import AckLog
from ..rollout import RolloutConfig
from ..rollout.toy import ToyPolicy, ToyTask
from ..store import SharedFilesystemStore

RUN = "demo"
WEIGHTS = "weights"  # the queue producer whose state records the trained weights
LOGS = "demo-logs"
CHECKPOINTS = "checkpoints"


@dataclasses.dataclass(frozen=True)
class Settings:
    """The job's size; ``--quick`` is the test's."""

    steps: int = 24  # training batches
    batch_groups: int = 8  # prompt groups per batch
    samples: int = 4  # samples per prompt (GRPO group)
    workers: int = 3  # generation actors
    slots: int = 2  # groups an actor generates at once
    prompts: int = 64
    kill_worker_at: int = 6  # SIGKILL one generation actor after this many batches
    checkpoint_every: int = 4  # a joint checkpoint after every this many batches
    kill_job_at: int = 14  # SIGKILL the whole job after this many batches
    lease_seconds: float = 3.0
    token_seconds: float = 0.004
    lr: float = 8.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.kill_worker_at < self.kill_job_at < self.steps:
            raise ValueError("the demo needs 0 < kill_worker_at < kill_job_at < steps")
        if not 0 < self.checkpoint_every < self.kill_job_at:
            raise ValueError("the demo needs a checkpoint before the job is killed: "
                             "0 < checkpoint_every < kill_job_at")
        if self.kill_job_at % self.checkpoint_every == 0:
            # killed right after a batch, the job may be inside that batch's checkpoint
            # (it selects the old or the new one, RL9); the demo wants batches to replay
            raise ValueError("kill_job_at must not be a multiple of checkpoint_every")
        if self.workers < 2:
            raise ValueError("the demo kills a generation actor: it needs workers >= 2")

    @classmethod
    def quick(cls) -> Settings:
        return cls(steps=12, batch_groups=6, workers=2, kill_worker_at=3,
                   checkpoint_every=3, kill_job_at=7, lease_seconds=2.0)

    @property
    def last_checkpoint(self) -> int:
        """The step of the newest checkpoint before the job is killed."""
        return (self.kill_job_at // self.checkpoint_every) * self.checkpoint_every - 1

    def to_args(self) -> list[str]:
        return [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)]

    @classmethod
    def from_args(cls, items: Sequence[str]) -> Settings:
        kinds = {f.name: type(getattr(cls(), f.name)) for f in dataclasses.fields(cls)}
        values = dict(item.split("=", 1) for item in items)
        return cls(**{k: kinds[k](v) for k, v in values.items()})


def _config(s: Settings) -> RolloutConfig:
    return RolloutConfig(n_samples_per_prompt=s.samples, lease_seconds=s.lease_seconds,
                         segment_mib=8)


def _store(root: str, writer_id: str, s: Settings) -> SharedFilesystemStore:
    return SharedFilesystemStore(root, RUN, writer_id=writer_id, **_config(s).store_options())


def _policy(s: Settings) -> ToyPolicy:
    return ToyPolicy(ToyTask(), seed=s.seed, lr=s.lr, token_seconds=s.token_seconds)


def _prompts(s: Settings) -> list[tuple[int, ...]]:
    return ToyTask().prompts(s.prompts, seed=s.seed)


def _log(logdir: str, name: str) -> AckLog:
    return AckLog(PosixFS(), os.path.join(logdir, name + ".log"))


def _read(logdir: str, name: str) -> list[Any]:
    path = os.path.join(logdir, name + ".log")
    return AckLog(PosixFS(), path).read() if os.path.exists(path) else []


def controller_name(phase: int) -> str:
    return f"straw-demo-controller-{phase}"
