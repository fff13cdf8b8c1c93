"""The generate function: the one seam between an inference engine and the rollout layer
(issue 17, item 4).  Framework-neutral: a vLLM or SGLang engine, the built-in toy policy
(``straw.rollout.toy``) and the tests' deterministic functions all implement it, and every
producer (in-process, another process, a Ray generation actor) calls it the same way::

    async def generate(group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup

``group`` is what a generation client took: a fresh prompt group (no response tokens) or
a partial one (the durable continuation of an earlier, interrupted attempt).  The function
returns the same group (same prompt, same samples by index) with new response tokens
appended to each sample's ``tokens`` (``response_length`` grown by as many), each new
token range tagged ``VersionSpan(start, stop, weight_version)``, and, for a sample it
finished, ``Status.COMPLETED`` or ``TRUNCATED`` with a reward.  Tokens already in the
group are never rewritten: partial work is continued, not restarted (RL5).

``abort`` is set when the producer pauses admission (a weight update) or shuts down: the
function stops soon (between tokens or engine steps) and returns what it has, unfinished
samples marked ``Status.ABORTED``; the producer yields that group as a partial one, and the
next attempt continues it, under the next weight version.  A function that returns a group
that breaks these rules fails its task's return with a ``ValueError`` naming the sample
(``check_generated``), before anything is published.

``extend_sample`` is the helper an implementation uses to append tokens under a version.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Protocol

from .samples import Sample, SampleGroup, Status, VersionSpan


class GenerateFn(Protocol):
    """The generate function's type (see the module docstring)."""

    async def __call__(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup: ...


def extend_sample(sample: Sample, tokens: Sequence[int], *, weight_version: int,
                  status: Status | None = None,
                  reward: float | dict[str, float] | None = None) -> Sample:
    """``sample`` with ``tokens`` appended to its response, generated under
    ``weight_version`` (merged into the last span when that one has the same version and
    ends where the new tokens start), and ``status`` / ``reward`` when given."""
    new = tuple(tokens)
    spans = list(sample.versions)
    start, stop = sample.response_length, sample.response_length + len(new)
    if new:
        last = spans[-1] if spans else None
        if last is not None and last.version == weight_version and last.stop == start:
            spans[-1] = VersionSpan(last.start, stop, weight_version)
        else:
            spans.append(VersionSpan(start, stop, weight_version))
    changes: dict[str, object] = {"tokens": sample.tokens + new, "response_length": stop,
                                  "versions": tuple(spans)}
    if status is not None:
        changes["status"] = status
    if reward is not None:
        changes["reward"] = reward
    return dataclasses.replace(sample, **changes)  # type: ignore[arg-type]


def check_generated(before: SampleGroup, after: object, weight_version: int) -> SampleGroup:
    """``after`` if it is a valid result of generating ``before`` under ``weight_version``
    (module docstring); else a ``TypeError`` / ``ValueError`` naming the sample and the
    rule it breaks (the engine's bug, caught before its group is stored)."""
    if not isinstance(after, SampleGroup):
        raise TypeError(f"the generate function returned {type(after).__name__}, not a "
                        f"SampleGroup (group {before.group_index}): return the group it was "
                        "given, with new tokens")
    if after.group_index != before.group_index or len(after) != len(before):
        raise ValueError(f"the generate function returned group {after.group_index} with "
                         f"{len(after)} samples for group {before.group_index} with "
                         f"{len(before)}: return the samples it was given")
    old = {s.index: s for s in before}
    for i, s in enumerate(after):
        where = f"group {before.group_index} sample {s.index} (samples[{i}])"
        b = old.get(s.index)
        if b is None:
            raise ValueError(f"{where}: no such sample in the group given; keep each "
                             "sample's index")
        if s.tokens[:len(b.tokens)] != b.tokens or s.response_length < b.response_length:
            raise ValueError(f"{where}: its tokens do not extend the {len(b.tokens)} it was "
                             "given; generation appends response tokens, it never rewrites "
                             "them (partial work is continued, RL5)")
        if s.response_length - b.response_length != len(s.tokens) - len(b.tokens):
            raise ValueError(f"{where}: {len(s.tokens) - len(b.tokens)} tokens appended but "
                             f"response_length grew by {s.response_length - b.response_length}")
        if s.versions[:len(b.versions)] != b.versions and not _merged(b, s):
            raise ValueError(f"{where}: the version spans of its earlier tokens changed; "
                             "tag only the new tokens (extend_sample does)")
        begin, end = b.response_length, s.response_length
        covered = sum(max(0, min(v.stop, end) - max(v.start, begin)) for v in s.versions
                      if v.version == weight_version)
        fresh = end - begin
        if fresh and covered < fresh:
            raise ValueError(f"{where}: {fresh} new tokens but only {covered} tagged with "
                             f"weight version {weight_version}; each token range carries the "
                             "version that generated it (extend_sample tags them)")
    return after


def _merged(b: Sample, s: Sample) -> bool:
    """Whether ``s``'s spans are ``b``'s with the last one extended (same version)."""
    n = len(b.versions)
    if n == 0 or len(s.versions) < n or s.versions[:n - 1] != b.versions[:n - 1]:
        return False
    lb, ls = b.versions[-1], s.versions[n - 1]
    return ls.start == lb.start and ls.version == lb.version and ls.stop >= lb.stop


__all__ = ["GenerateFn", "extend_sample", "check_generated"]
