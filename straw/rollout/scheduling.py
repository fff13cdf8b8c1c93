"""Scheduling and staleness: the priority and key a returned group is queued under, the
staleness of samples against the serving weights, and the optional staleness bound.

The queue hands out pending tasks by priority descending, scheduling key ascending, then
FIFO (the core's order, durable across recovery).  The rollout layer fills both:

* **priority** = the group's stage (``samples.Stage``): ready 2 > partial 1 > fresh 0, so
  finished work reaches training first and partial work is continued before new prompts;
* **scheduling key** = the oldest *numeric* weight version that generated any response token
  of the group: the stalest group first.  A version is numeric when ``str(v)`` is ASCII
  digits after at most one leading ``'-'``; non-numeric versions are skipped one by one.  A
  group without any numeric version gets ``INT64_MAX`` (last of its stage); keys are clamped
  to the signed 64-bit range the queue stores.  A prompt the data source submits gets key
  ``SUBMITTED_PROMPT_KEY`` (0): it sorts before a returned group that has no version.

Comparing stored versions this way means nothing is rewritten when the weights change, and
ordering never drops a stale sample.

**Staleness** of a sample = current serving version - the oldest version of its generated
tokens; a sample without response tokens has staleness 0.  It is *unknown* (None) when the
sample has response tokens but no version, any non-numeric version, or a version newer than
the current one (the engine reported something we cannot compare), or when the current
version itself is not numeric.  Note the asymmetry, kept from the users' integration: the
scheduling key skips non-numeric versions one by one, staleness gives up on the sample.

**Bound** (off by default: ``StalenessBound`` is opt-in): ``decide(group, current, bound)``
is a pure decision the generation client applies when a group comes back.  A group whose
largest known sample staleness exceeds ``max_staleness`` is, by the bound's explicit
``policy``, either REQUEUE'd (regenerated from its prompt: the client returns the prompt as
a fresh group, discarding the stale tokens) or REJECT'ed (failed without retry, with the
reason).  Unknown staleness never triggers the bound: only a proven-stale group is acted
on, and without a bound every group is kept.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from straw.checks import INT64_MAX, INT64_MIN, check_count

from .samples import Sample, SampleGroup, Status, classify

NO_VERSION_KEY = INT64_MAX
SUBMITTED_PROMPT_KEY = 0


def numeric_version(version: object) -> int | None:
    """The int value of a numeric version (``str(v)``: ASCII digits after at most one
    leading ``'-'``), else None.  ``True``/``False`` are not versions."""
    if type(version) is int:  # what engines report: its text's value is itself
        return version
    if version is None or isinstance(version, bool):
        return None
    text = str(version)
    digits = text[1:] if text.startswith("-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(text)


def _clamp(value: int) -> int:
    return max(INT64_MIN, min(INT64_MAX, value))


def oldest_version(versions: Iterable[object]) -> int | None:
    """The smallest numeric version among ``versions`` (non-numeric ones skipped)."""
    found = [v for v in (numeric_version(x) for x in versions) if v is not None]
    return min(found) if found else None


def scheduling_key(group: SampleGroup) -> int:
    """The oldest numeric generated-token version of the group, clamped to int64;
    ``NO_VERSION_KEY`` (int64 max) when it has none."""
    oldest = oldest_version(v for s in group.samples for v in s.weight_versions)
    return NO_VERSION_KEY if oldest is None else _clamp(oldest)


def priority(group: SampleGroup) -> int:
    """The queue priority of a returned group: its stage (2 ready, 1 partial, 0 fresh)."""
    return int(classify(group))


def queue_order(group: SampleGroup) -> tuple[int, int]:
    """``(priority, scheduling_key)`` of a returned group: what its task is queued under."""
    return priority(group), scheduling_key(group)


def acquisition_order(entries: Sequence[tuple[int, int]]) -> list[int]:
    """The order in which the queue hands out tasks queued, in this FIFO order, under
    ``(priority, key)``: priority descending, key ascending, FIFO for ties.  (The queue
    implements this; the rollout layer states it here to test what its keys produce.)"""
    return sorted(range(len(entries)), key=lambda i: (-entries[i][0], entries[i][1], i))


# --- staleness --------------------------------------------------------------------------


def version_span(sample: Sample) -> list[int] | None:
    """What a sample's staleness is measured from: ``[]`` without response tokens (its
    staleness is 0), ``[oldest, newest]`` of its generated tokens' numeric versions, or
    None when a version is missing or not numeric (unknown).  A generation client sends
    this when no staleness bound is set, and the controller measures it against the
    version it serves when it accepts the group (``staleness_of_span``): the client
    needs no round trip to learn the serving version."""
    if sample.response_length == 0:
        return []
    versions = [numeric_version(v) for v in sample.weight_versions]
    if not versions or any(v is None for v in versions):
        return None
    known = [v for v in versions if v is not None]
    return [min(known), max(known)]


def staleness_of_span(span: Sequence[int] | None, current: object) -> int | None:
    """Staleness of a ``version_span`` against serving version ``current``: 0 for ``[]``;
    None when unknown (no span, a non-numeric ``current``, or a token newer than it)."""
    if span is None:
        return None
    if not span:
        return 0
    now = numeric_version(current)
    if now is None or span[1] > now:
        return None
    return now - span[0]


def staleness(sample: Sample, current: object) -> int | None:
    """Current serving version - the oldest version of the sample's generated tokens; 0
    without response tokens; None when unknown (see the module docstring)."""
    return staleness_of_span(version_span(sample), current)


class StalenessTally:
    """Running staleness metrics: ``add`` per-sample staleness values (None: unknown) as
    samples are accepted, ``metrics()`` at any time.  O(1) memory: the controller keeps
    one over every accepted group of the job."""

    def __init__(self) -> None:
        self.known = 0
        self.total = 0
        self.worst = 0
        self.unknown = 0

    def add(self, values: Iterable[int | None]) -> None:
        for value in values:
            if value is None:
                self.unknown += 1
            else:
                check_count("staleness", value)
                self.known += 1
                self.total += value
                self.worst = max(self.worst, value)

    def metrics(self) -> dict[str, float]:
        """``staleness/mean``, ``staleness/max`` (over samples of known staleness; 0 when
        there are none) and ``staleness/unknown_count``."""
        return {
            "staleness/mean": self.total / self.known if self.known else 0.0,
            "staleness/max": float(self.worst),
            "staleness/unknown_count": float(self.unknown),
        }


def staleness_metrics(samples: Iterable[Sample], current: object) -> dict[str, float]:
    """``StalenessTally.metrics`` of ``samples`` against serving version ``current``."""
    tally = StalenessTally()
    tally.add(staleness(s, current) for s in samples)
    return tally.metrics()


class StalenessPolicy(str, enum.Enum):
    """What the bound does with a group that exceeds it."""

    REQUEUE = "requeue"  # regenerate from the prompt: the stale tokens are discarded
    REJECT = "reject"  # fail the task without retry, with the reason


class Decision(str, enum.Enum):
    KEEP = "keep"
    REQUEUE = "requeue"
    REJECT = "reject"


@dataclass(frozen=True)
class StalenessBound:
    """At most ``max_staleness`` weight versions between a sample's oldest generated token
    and the serving weights, enforced by ``policy`` (no default: choose it)."""

    max_staleness: int
    policy: StalenessPolicy

    def __post_init__(self) -> None:
        check_count("StalenessBound.max_staleness", self.max_staleness)
        try:
            object.__setattr__(self, "policy", StalenessPolicy(self.policy))
        except ValueError:
            raise ValueError(f"StalenessBound.policy must be one of "
                             f"{[p.value for p in StalenessPolicy]}, got "
                             f"{self.policy!r}") from None


@dataclass(frozen=True)
class Verdict:
    """A ``decide`` result: the decision, the group's largest known staleness, and a
    reason for the log or the rejection (empty when kept)."""

    decision: Decision
    staleness: int | None
    reason: str = ""


def group_staleness(group: SampleGroup, current: object) -> int | None:
    """The largest known staleness among the group's samples (None if none is known)."""
    known = [v for v in (staleness(s, current) for s in group.samples) if v is not None]
    return max(known) if known else None


def decide(group: SampleGroup, current: object, bound: StalenessBound | None = None
           ) -> Verdict:
    """KEEP, REQUEUE or REJECT a returned group (see the module docstring).  Fresh groups
    and groups of unknown staleness are always kept; so is everything when ``bound`` is
    None (the default: ordering alone never drops stale samples)."""
    worst = group_staleness(group, current)
    if bound is None or worst is None or worst <= bound.max_staleness:
        return Verdict(Decision.KEEP, worst)
    reason = (f"staleness {worst} exceeds the bound of {bound.max_staleness} weight versions "
              f"(serving version {current!r})")
    if bound.policy is StalenessPolicy.REQUEUE:
        return Verdict(Decision.REQUEUE, worst, reason)
    return Verdict(Decision.REJECT, worst, reason)


def restart_from_prompt(group: SampleGroup) -> SampleGroup:
    """The group as its prompt alone: every sample reset to no response, PENDING, no
    reward, versions or captures (what a REQUEUE verdict returns to the queue)."""
    samples = tuple(
        replace(s, tokens=s.tokens[:s.prompt_length], response_length=0,
                status=Status.PENDING, reward=None, versions=(), routes=None, topk_ids=None,
                topk_logprobs=None)
        for s in group.samples)
    return replace(group, samples=samples)


__all__ = ["NO_VERSION_KEY", "SUBMITTED_PROMPT_KEY", "numeric_version", "oldest_version",
           "scheduling_key", "priority", "queue_order", "acquisition_order", "staleness",
           "staleness_metrics", "StalenessTally", "StalenessPolicy", "Decision",
           "StalenessBound", "Verdict",
           "group_staleness", "decide", "restart_from_prompt"]
