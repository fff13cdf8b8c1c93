"""A toy RL task and a tiny NumPy policy that learns it: the demo's and the tests' engine.

**The task** (``ToyTask``): a prompt is ``length`` token ids in ``0..vocab-1``; the right
response is the prompt reversed; the reward is the fraction of response positions that
are right (in ``[0, 1]``; a uniform policy scores ``1 / vocab`` on average).

**The policy** (``ToyPolicy``): for response position ``t`` the logits over the vocabulary
are ``sum_j W[t, j, prompt[j]]``, a softmax over a table of ``length * length * vocab *
vocab`` weights (zeros at the start: uniform).  It can express reverse (the weights of
``j = length - 1 - t`` carry it) but has to find which prompt position matters, so its
reward rises visibly from ``1 / vocab`` within a few dozen updates.

* ``generate(group, weight_version=v, abort=event)`` implements the generate-function
  protocol of ``straw.rollout.generate``: it samples each missing response token of each
  sample, one token at a time (``await`` between tokens, ``token_seconds`` of simulated
  decoding each), tags the new tokens with ``VersionSpan``s of ``v``, and completes a
  sample with its reward once its response is ``length`` tokens.  When ``abort`` is set
  it stops at the next token and returns what it has: a sample with some tokens is
  ``ABORTED`` (continued by a later call), so the group is partial.
* Determinism: the token at response position ``t`` of sample ``index`` of group
  ``group_index`` is drawn from a generator seeded with ``(seed, v, group_index, index,
  t)``: the same weights give the same tokens, interrupted or not.  ``generate`` refuses
  a ``weight_version`` other than the policy's own (it would tag tokens with a version
  that did not make them).
* A sample's ``tokens`` are what it was given (its prompt's tokens if the data source put
  them there; none for the toy's prompts) followed by its response: ``generate`` appends
  response tokens only, as the protocol's ``check_generated`` requires.
* ``update(samples)`` is one REINFORCE step on ``(prompt, response, advantage)`` triples
  (the advantages from ``grpo_advantages``: each group's rewards minus the group mean,
  over the group's standard deviation); the version advances by one.
* ``weights``/``load(weights, version)``: the table as a float64 array, what the trainer
  publishes and generation processes load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .samples import Sample, SampleGroup, Status, VersionSpan


@dataclasses.dataclass(frozen=True)
class ToyTask:
    """Reverse a prompt of ``length`` tokens over a vocabulary of ``vocab`` ids."""

    length: int = 4
    vocab: int = 8

    def __post_init__(self) -> None:
        for name in ("length", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"ToyTask.{name} must be an int >= 2, got {value!r}")

    def prompts(self, n: int, seed: int = 0) -> list[tuple[int, ...]]:
        """``n`` prompts (tuples of token ids), the same for the same seed."""
        rng = np.random.default_rng([seed, 7])
        return [tuple(int(t) for t in rng.integers(0, self.vocab, self.length))
                for _ in range(n)]

    def target(self, prompt: Sequence[int]) -> tuple[int, ...]:
        return tuple(reversed(tuple(prompt)))

    def reward(self, prompt: Sequence[int], response: Sequence[int]) -> float:
        """The fraction of the ``length`` response positions that hold the right token."""
        want = self.target(prompt)
        got = tuple(response)
        return sum(1 for a, b in zip(want, got, strict=False) if a == b) / self.length

    def check_prompt(self, prompt: object) -> tuple[int, ...]:
        if not isinstance(prompt, (tuple, list)) or len(prompt) != self.length or not all(
                type(t) is int and 0 <= t < self.vocab for t in prompt):
            raise ValueError(f"a toy prompt is {self.length} token ids in 0..{self.vocab - 1}, "
                             f"got {prompt!r}")
        return tuple(prompt)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def grpo_advantages(rewards: list[list[Any]]) -> list[list[float]]:
    """Each group's rewards minus its mean, over its standard deviation (GRPO); a group
    whose rewards are all equal teaches nothing: zeros.  The shape of a ``BatchBuilder``
    reward hook."""
    out = []
    for row in rewards:
        r = np.asarray([float(x) for x in row], dtype=np.float64)
        std = float(r.std())
        out.append([0.0] * len(row) if std < 1e-9 else ((r - r.mean()) / std).tolist())
    return out


class ToyPolicy:
    """The tabular softmax policy (module docstring).  ``lr``: the REINFORCE step size;
    ``token_seconds``: simulated decoding time per token (0: only yield to the loop)."""

    def __init__(self, task: ToyTask | None = None, *, seed: int = 0, lr: float = 1.0,
                 token_seconds: float = 0.0) -> None:
        self.task = ToyTask() if task is None else task
        if not isinstance(self.task, ToyTask):
            raise TypeError(f"task must be a ToyTask, got {type(task).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        if not (isinstance(token_seconds, (int, float)) and 0 <= token_seconds < 10):
            raise ValueError(f"token_seconds must be in [0, 10), got {token_seconds!r}")
        self.seed = seed
        self.lr = float(lr)
        self.token_seconds = float(token_seconds)
        n, v = self.task.length, self.task.vocab
        self._w = np.zeros((n, n, v, v), dtype=np.float64)
        self.version = 0
        self.tokens_generated = 0

    # --- weights --------------------------------------------------------------------------
    @property
    def weights(self) -> np.ndarray:
        """A copy of the weight table (what the trainer publishes)."""
        return self._w.copy()

    def load(self, weights: Any, version: int) -> None:
        """Serve ``weights`` (from ``weights``) as ``version``."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != self._w.shape:
            raise ValueError(f"toy policy weights have shape {list(self._w.shape)} for this "
                             f"task, got {list(w.shape)}: were they saved for another ToyTask?")
        if not np.isfinite(w).all():
            raise ValueError("toy policy weights hold NaN or infinity")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"a weight version is an int >= 0, got {version!r}")
        self._w = w.copy()
        self.version = version

    def probabilities(self, prompt: Sequence[int], t: int) -> np.ndarray:
        """The policy's distribution over response position ``t``'s token."""
        logits = sum(self._w[t, j, x] for j, x in enumerate(prompt))
        return _softmax(np.asarray(logits))

    def greedy_reward(self, prompts: Iterable[Sequence[int]]) -> float:
        """The mean reward of the most likely responses (an evaluation, no sampling)."""
        scores = [self.task.reward(p, [int(np.argmax(self.probabilities(p, t)))
                                       for t in range(self.task.length)]) for p in prompts]
        return float(np.mean(scores)) if scores else 0.0

    # --- the generate-function protocol ---------------------------------------------------
    def _token(self, prompt: Sequence[int], group_index: int, index: int, t: int) -> int:
        rng = np.random.default_rng([self.seed, self.version, group_index, index, t])
        p = self.probabilities(prompt, t)
        # inverse CDF of one uniform draw: the same draw picks the same token
        pick = int(np.searchsorted(np.cumsum(p), rng.random(), side="right"))
        return min(pick, len(p) - 1)

    async def generate(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup:
        """Generate the missing response tokens of ``group`` (module docstring)."""
        if not isinstance(group, SampleGroup):
            raise TypeError(f"group must be a SampleGroup, got {type(group).__name__}")
        if weight_version != self.version:
            raise ValueError(f"the toy policy serves weight version {self.version}, asked to "
                             f"generate under {weight_version!r}: load those weights first")
        prompt = self.task.check_prompt(group.prompt)
        out = []
        for s in group.samples:
            if abort.is_set() or s.finished:
                out.append(s)
                continue
            out.append(await self._sample(s, prompt, weight_version, abort))
        return dataclasses.replace(group, samples=tuple(out))

    async def _sample(self, s: Sample, prompt: tuple[int, ...], version: int,
                      abort: asyncio.Event) -> Sample:
        tokens = list(s.tokens)  # the response is appended: earlier tokens never change
        done = s.response_length
        start = done
        while done < self.task.length and not abort.is_set():
            tokens.append(self._token(prompt, s.group_index or 0, s.index or 0, done))
            done += 1
            self.tokens_generated += 1
            # a real engine decodes here; the loop runs the other samples meanwhile
            await asyncio.sleep(self.token_seconds)
        if done == start:
            return s
        spans = list(s.versions)
        if spans and spans[-1].version == version and spans[-1].stop == start:
            spans[-1] = VersionSpan(spans[-1].start, done, version)  # one span per version run
        else:
            spans.append(VersionSpan(start, done, version))
        finished = done == self.task.length
        return dataclasses.replace(
            s, tokens=tuple(tokens), response_length=done, versions=tuple(spans),
            status=Status.COMPLETED if finished else Status.ABORTED,
            reward=self.task.reward(prompt, tokens[-done:]) if finished else None)

    # --- training -------------------------------------------------------------------------
    def update(self, samples: Iterable[tuple[Sequence[int], Sequence[int], float]]) -> int:
        """One REINFORCE step on ``(prompt, response, advantage)`` triples (token ids);
        returns the new version."""
        n = self.task.length
        grad = np.zeros_like(self._w)
        count = 0
        for prompt, response, advantage in samples:
            prompt, response = [int(t) for t in prompt], [int(t) for t in response]
            if len(prompt) != n or len(response) != n:
                raise ValueError(f"a toy sample holds a {n}-token prompt and a {n}-token "
                                 f"response, got a prompt of {len(prompt)} tokens and a "
                                 f"response of {len(response)}")
            if not math.isfinite(advantage):
                raise ValueError(f"advantage {advantage!r} is not finite")
            count += 1
            if advantage == 0:
                continue
            for t, y in enumerate(response):
                g = -self.probabilities(prompt, t)  # d log p(y) / d logits
                g[y] += 1.0
                for j, x in enumerate(prompt):
                    grad[t, j, x] += advantage * g
        if count == 0:
            raise ValueError("update needs at least one sample")
        self._w += self.lr * grad / count
        self.version += 1
        return self.version


__all__ = ["ToyTask", "ToyPolicy", "grpo_advantages"]
