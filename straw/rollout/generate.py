"""The generate-function protocol: how a generation engine plugs into a rollout job.

A generate function is async and framework-neutral (a vLLM or SGLang engine, or the
built-in toy policy of ``straw.rollout.toy``)::

    async def generate(group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup

It returns ``group`` with new response tokens appended to its samples, each new token
range tagged with ``weight_version`` (a ``VersionSpan``); a sample it finished carries its
status (completed or truncated) and its reward.  When ``abort`` is set (a weight update,
a shutdown) it stops soon and returns what it has: the caller returns that group as a
partial group, persisted for continuation, and a later call continues it from there.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from .samples import SampleGroup


class GenerateFn(Protocol):
    """The generate function's signature (module docstring)."""

    async def __call__(self, group: SampleGroup, *, weight_version: int,
                       abort: asyncio.Event) -> SampleGroup: ...


__all__ = ["GenerateFn"]
