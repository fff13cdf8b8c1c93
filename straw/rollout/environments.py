"""Weighted environments: every training batch keeps the configured proportions, and a
backlog of one environment drains at its share while its fresh admission stays off.

The case (Megatron-LM's rollout bank): a job mixes environments by weight, say 50/50 A and
B.  After a restart 100 accepted-but-untrained A groups and 2 B groups come back.  Balancing
on the consumer side (over-quota groups wait in an overflow buffer while generation goes on)
keeps producing A although far too many A groups exist already, so the backlog never
drains.  Here the balancing is on the producer side: each batch has a fixed quota per
environment; an environment's slots are filled from its backlog first, and only an
environment whose backlog is empty (or short of its next quota) admits fresh prompts.  So
A's backlog drains at A's share of every batch, A generates nothing new meanwhile, and B
keeps generating fresh work.

``EnvironmentMix(weights, batch_size)``: ``weights`` maps environment id to a positive
weight (ints or floats, taken exactly).  A single environment may be ``""`` (no id needed);
with several, every id must be a non-empty str.  All of it is pure and deterministic:

* ``quota(state)``: how many groups of each environment the next batch holds.  Each is the
  floor or the ceiling of its exact share ``batch_size * w / sum(w)``, they sum to
  ``batch_size``, and the ceilings rotate so that over any number of batches each
  environment's total stays close to its exact share: within two groups (tested; about one
  in practice).  The extra groups of a batch go to the environments furthest behind their
  exact share, ties to the larger fraction, then to the earlier environment in
  ``weights``.
* ``compose(state, backlog)``: the quota split into groups taken from each backlog and
  fresh admissions, and the state after the batch.
* ``admits_fresh(env, backlog, state)``: whether ``env`` may admit fresh prompts now: its
  backlog is empty, or short of the next batch's quota for it (so a batch always fills).
* ``environment_of(group)``: a group's environment, checked against the configured ones.

``MixState`` (batches composed so far and the extra groups each environment got) is a
plain JSON-able value, to be checkpointed with the controller's state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from straw.checks import check_count, short_repr

from .samples import SampleGroup


@dataclass(frozen=True)
class MixState:
    """Batches composed so far, and how many of them gave each environment its ceiling."""

    batches: int = 0
    extra: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_count("MixState.batches", self.batches)
        if not isinstance(self.extra, Mapping):
            raise TypeError(f"MixState.extra must be a mapping, got {type(self.extra).__name__}")
        for env, n in self.extra.items():
            check_count(f"MixState.extra[{env!r}]", n)
        object.__setattr__(self, "extra", dict(self.extra))

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> MixState:
        if not isinstance(value, Mapping) or set(value) != {"batches", "extra"}:
            raise ValueError(f"a MixState is {{'batches': n, 'extra': {{env: n}}}}, got "
                             f"{short_repr(value)}")
        return cls(value["batches"], value["extra"])


@dataclass(frozen=True)
class Composition:
    """One batch: per environment, groups taken from its backlog and fresh admissions."""

    from_backlog: Mapping[str, int]
    fresh: Mapping[str, int]

    def total(self, env: str) -> int:
        return self.from_backlog.get(env, 0) + self.fresh.get(env, 0)


def _weight(env: str, w: object) -> Fraction:
    if isinstance(w, bool) or not isinstance(w, (int, float)):
        raise TypeError(f"weights[{env!r}] must be a number, got {type(w).__name__}")
    try:
        finite = math.isfinite(w)
    except OverflowError:  # an int past a float's range: no weight a mix can use
        finite = False
    if not finite or w <= 0:
        raise ValueError(f"weights[{env!r}] is {short_repr(w)}; weights are finite numbers "
                         "(within a float's range) and > 0 (drop an environment instead of "
                         "giving it weight 0)")
    return Fraction(w)


class EnvironmentMix:
    """Per-batch quotas and producer-side backlog draining (module docstring)."""

    def __init__(self, weights: Mapping[str, float], batch_size: int) -> None:
        if not isinstance(weights, Mapping) or not weights:
            raise ValueError("weights must be a non-empty mapping of environment id to "
                             "weight")
        check_count("batch_size", batch_size, minimum=1)
        for env in weights:
            if not isinstance(env, str):
                raise TypeError(f"environment ids are str, got {short_repr(env)}")
            if len(weights) > 1 and not env:
                raise ValueError("with several environments every one needs a non-empty id "
                                 "(only a single environment may be '')")
        w = {env: _weight(env, x) for env, x in weights.items()}
        total = sum(w.values())
        self.environments = tuple(w)
        self.batch_size = batch_size
        share = {env: batch_size * x / total for env, x in w.items()}
        self._floor = {env: math.floor(q) for env, q in share.items()}
        self._fraction = {env: q - self._floor[env] for env, q in share.items()}
        self._extras = batch_size - sum(self._floor.values())  # ceilings per batch
        self.share = share  # exact groups per batch, as Fractions

    @classmethod
    def single(cls, batch_size: int, environment: str = "") -> EnvironmentMix:
        return cls({environment: 1}, batch_size)

    def _check_state(self, state: MixState) -> MixState:
        if not isinstance(state, MixState):
            raise TypeError(f"state must be a MixState, got {type(state).__name__}")
        unknown = set(state.extra) - set(self.environments)
        if unknown:
            raise ValueError(f"the mix state names environments {sorted(unknown)} that are "
                             f"not configured ({list(self.environments)}): the environment "
                             "set changed since it was saved")
        return state

    def quota(self, state: MixState) -> dict[str, int]:
        """Groups of each environment in the next batch (module docstring)."""
        state = self._check_state(state)
        b = state.batches + 1

        def behind(env: str) -> tuple[Fraction, Fraction, int]:
            deficit = b * self._fraction[env] - state.extra.get(env, 0)
            return -deficit, -self._fraction[env], self.environments.index(env)

        # only a fractional share can round up: an exact one is always its floor
        candidates = [env for env in self.environments if self._fraction[env]]
        lucky = sorted(candidates, key=behind)[:self._extras]
        return {env: self._floor[env] + (env in lucky) for env in self.environments}

    def compose(self, state: MixState, backlog: Mapping[str, int]
                ) -> tuple[Composition, MixState]:
        """The next batch: each environment's quota filled from its backlog first, the rest
        by fresh admissions; and the state after it."""
        quota = self.quota(state)
        for env, n in backlog.items():
            if env not in quota:
                raise ValueError(f"backlog names environment {env!r}, which is not configured "
                                 f"({list(self.environments)})")
            check_count(f"backlog[{env!r}]", n)
        taken = {env: min(quota[env], backlog.get(env, 0)) for env in self.environments}
        fresh = {env: quota[env] - taken[env] for env in self.environments}
        extra = dict(state.extra)
        for env in self.environments:
            if quota[env] > self._floor[env]:
                extra[env] = extra.get(env, 0) + 1
        return Composition(taken, fresh), MixState(state.batches + 1, extra)

    def admits_fresh(self, env: str, backlog: Mapping[str, int],
                     state: MixState | None = None) -> bool:
        """Whether ``env`` may admit fresh prompts: while its backlog is empty or short of
        what the next batch (after ``state``) needs of it.  A backlog that fills its
        quota drains first; one short of it needs fresh groups to complete a batch, and
        waiting for it to empty would wait for ever (a quota of 2 over a backlog of 1
        would stall every later batch)."""
        self._known(env)
        need = self.quota(state if state is not None else MixState())[env]
        # RL12 (spec/rollout.py): a backlog short of its quota admits fresh work
        return backlog.get(env, 0) < max(1, need)

    def environment_of(self, group: SampleGroup) -> str:
        """``group``'s environment, which must be a configured one."""
        return self._known(group.environment)

    def _known(self, env: str) -> str:
        if env not in self.environments:
            hint = (" (a group of a multi-environment job needs its environment id)"
                    if env == "" else "")
            raise ValueError(f"environment {env!r} is not configured "
                             f"({list(self.environments)}){hint}")
        return env


__all__ = ["MixState", "Composition", "EnvironmentMix"]
