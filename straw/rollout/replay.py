"""Replay selection: which archived groups a train-only job replays, in which order (issue 16).

A train-only job replays one or more debug archives (``RolloutArchive``) without
generation.  This module is the selection and its checks, pure functions over opened
archives' indexes (no data is read, nothing is written); feeding the selected groups to
training through an isolated queue in the archives' pool is the queue part's (it builds on
the rollout checkpoint's isolated-queue restore, not a mechanism of its own)::

    with RolloutArchive(a) as first, RolloutArchive(b) as second:
        plan = plan_replay([first, second])                      # full replay
        plan = plan_replay([first, second], ratio=0.25, seed=3)  # a seeded subsample
        plan.root, plan.pool_id, plan.run_id   # the one pool and run they all belong to
        for g in plan.groups:                  # replay order
            g.key, g.archive, g.rollout, [(m.chunk_ref, m.ordinal) for m in g.members]

Groups.  The unit of replay is a group, as it is the queue's: the samples of one queue
task (one task key) form one group; samples without queue provenance are grouped by
their group index; a sample with neither is a group alone.  A group belongs to one
archive (the same task key in two rollouts is two groups).  Groups come in archive order
(the order of their first sample), archives in the order given; a group's members are its
samples in archive order, each named by its chunk publication and ordinal in it, which is
what lets a full replay reuse the archived records without republishing them.

Subsample (``ratio``).  ``m = floor(n * ratio)`` of the ``n`` groups of all the archives
together, the ratio taken as written (its shortest decimal form, so ``0.29`` of 100 groups
is 29, not the 28 binary floating point gives), ``0 < ratio <= 1``.  Which ``m``: a
``random.Random(seed)`` sample of the positions, replayed in replay order (not the
sample's); the same archives, ratio and seed select the same groups on every machine.
DECISION: a ratio that rounds to zero groups (``n * ratio < 1``) is refused with a
``ValueError`` giving the smallest ratio that selects one group: a replay that trains on
nothing, or silently on everything (the whole dataset, what vime's
``--load-debug-rollout-data-subsample`` gives then), is never what was asked.  A replay of
archives holding no sample at all is refused the same way.  ``ratio=None`` is the full
replay.

Checks.  All archives of one replay belong to one pool and run (``ValueError`` naming
both archives and their pools and runs otherwise: a queue lives in one pool and run); an
archive given twice (the same storage owner) is refused; a closed archive is refused.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from straw.refs import RecordSetRef

from .archive import RolloutArchive


@dataclass(frozen=True)
class ReplayMember:
    """One sample of a replayed group: its key and where its record lies."""

    sample_key: str
    chunk_ref: RecordSetRef  # the archive chunk publication holding the sample
    ordinal: int  # the sample's place in that chunk


@dataclass(frozen=True)
class ReplayGroup:
    """One group to replay, with its provenance (which archive, rollout and keys)."""

    key: str  # its task key, ``group:<group index>``, or the sample key of a sample alone
    task_key: str | None
    archive: str  # the archive's index path
    rollout: str  # the archive's rollout key (its id, or ``eval_<id>``)
    storage_owner: str  # the archive's retention owner
    first: int  # the position of its first sample in the archive (its identity there)
    members: tuple[ReplayMember, ...]

    @property
    def sample_keys(self) -> tuple[str, ...]:
        return tuple(m.sample_key for m in self.members)


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay trains on: the pool and run of its archives, its groups in replay
    order, and how they were selected (``ratio`` None: all of them)."""

    root: str
    pool_id: str | None
    run_id: str
    archives: tuple[str, ...]  # index paths, in the order given
    groups: tuple[ReplayGroup, ...]
    total_groups: int  # groups in the archives, before any subsample
    ratio: float | None
    seed: int | None

    @property
    def full(self) -> bool:
        return self.ratio is None


def archive_groups(archive: RolloutArchive) -> list[ReplayGroup]:
    """``archive``'s groups in archive order (see the module docstring)."""
    if not isinstance(archive, RolloutArchive):
        raise TypeError(f"a replay takes opened RolloutArchives, got {type(archive).__name__}")
    keyed: dict[tuple[str, object], list[int]] = {}
    entries = archive.entries()  # (refuses a closed archive)
    for i, e in enumerate(entries):
        if e.task_key is not None:
            k: tuple[str, object] = ("task", e.task_key)
        elif e.group_index is not None:
            k = ("group", e.group_index)
        else:
            k = ("alone", i)
        keyed.setdefault(k, []).append(i)
    groups = []
    for (kind, name), positions in keyed.items():  # (dicts keep first-appearance order)
        first = entries[positions[0]]
        key = (str(name) if kind == "task" else f"group:{name}" if kind == "group"
               else first.sample_key)
        groups.append(ReplayGroup(
            key=key, task_key=first.task_key, archive=archive.path, rollout=archive.key,
            storage_owner=archive.storage_owner, first=positions[0],
            members=tuple(ReplayMember(entries[p].sample_key, entries[p].chunk_ref,
                                       entries[p].ordinal) for p in positions)))
    return groups


def check_one_pool_and_run(archives: Sequence[RolloutArchive]) -> tuple[str, str | None, str]:
    """``(root, pool id, run id)`` shared by all ``archives``; ``ValueError`` naming the
    first two that differ, or an archive given twice."""
    if isinstance(archives, RolloutArchive) or not isinstance(archives, Sequence) \
            or not archives:
        raise TypeError("a replay takes a non-empty list of opened RolloutArchives")
    for i, a in enumerate(archives):
        if not isinstance(a, RolloutArchive):
            raise TypeError(f"archives[{i}] must be an opened RolloutArchive, got "
                            f"{type(a).__name__}")
        a.keys()  # a closed archive: ValueError naming it
    first = archives[0]
    owners = {first.storage_owner: first.path}
    for a in archives[1:]:
        same_pool = (a.pool_id == first.pool_id if first.pool_id is not None
                     and a.pool_id is not None else a.pool_root == first.pool_root)
        if not same_pool or a.run_id != first.run_id:
            raise ValueError(
                f"debug rollout archives of one replay must belong to one pool and run: "
                f"{first.path} is run {first.run_id!r} of pool {first.pool_id} at "
                f"{first.pool_root}, {a.path} is run {a.run_id!r} of pool {a.pool_id} at "
                f"{a.pool_root}; replay them separately")
        if a.storage_owner in owners:
            raise ValueError(f"archive {a.path} is given twice in one replay (as "
                             f"{owners[a.storage_owner]} too): each archive replays once")
        owners[a.storage_owner] = a.path
    return first.pool_root, first.pool_id, first.run_id


def subsample_count(n: int, ratio: float) -> int:
    """``floor(n * ratio)``, the ratio as written; refuses a ratio outside (0, 1] and one
    that selects no group (the module docstring's decision)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise TypeError(f"a replay's subsample ratio must be a number, got "
                        f"{type(ratio).__name__}")
    if not math.isfinite(ratio) or not 0 < ratio <= 1:
        raise ValueError(f"a replay's subsample ratio must be in (0, 1], got {ratio!r} "
                         "(ratio=None replays every group)")
    m = math.floor(Fraction(repr(float(ratio))) * n)
    if m == 0:
        need = f"a ratio >= 1/{n} = {1 / n:.6g}" if n else "archives holding samples"
        raise ValueError(f"subsample ratio {ratio!r} of {n} archived groups selects no group "
                         f"(floor({n} * {ratio!r}) = 0): a replay trains on at least one "
                         f"group; use {need}, or ratio=None for a full replay")
    return m


def plan_replay(archives: Sequence[RolloutArchive], *, ratio: float | None = None,
                seed: int = 0) -> ReplayPlan:
    """The groups a replay of ``archives`` trains on (see the module docstring):
    every group (``ratio=None``) or a seeded subsample of them."""
    root, pool_id, run_id = check_one_pool_and_run(archives)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"a replay's seed must be an int, got {type(seed).__name__}")
    groups = [g for a in archives for g in archive_groups(a)]
    n = len(groups)
    if ratio is None:
        if n == 0:
            raise ValueError(f"archives {', '.join(a.path for a in archives)} hold no "
                             "sample: a replay trains on at least one group")
        chosen = groups
    else:
        m = subsample_count(n, ratio)
        positions = sorted(random.Random(seed).sample(range(n), m))
        chosen = [groups[p] for p in positions]
    return ReplayPlan(root=root, pool_id=pool_id, run_id=run_id,
                      archives=tuple(a.path for a in archives), groups=tuple(chosen),
                      total_groups=n, ratio=None if ratio is None else float(ratio),
                      seed=None if ratio is None else seed)


__all__ = ["ReplayMember", "ReplayGroup", "ReplayPlan", "archive_groups",
           "check_one_pool_and_run", "subsample_count", "plan_replay"]
