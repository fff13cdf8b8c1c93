"""Replay of debug archives: which archived groups a train-only job replays, in which
order, and the isolated queue that feeds them to training (issue 16).

A train-only job replays one or more debug archives (``RolloutArchive``) without
generation.  ``plan_replay`` is the selection and its checks, pure functions over opened
archives' indexes (no data is read, nothing is written); ``replay_archives`` (below) puts
the selected groups into an isolated queue in the archives' pool, through the rollout
checkpoint's isolated-queue restore (``straw.rollout.isolated``), not a mechanism of its
own::

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

The replay queue (``replay_archives``).  A train-only job gets an isolated queue in the
archives' pool and run, seeded by ``straw.rollout.isolated.seed_isolated_queue`` (the one
isolated-queue mechanism, the checkpoint restore's), holding no task and, as restored
backlog, the planned groups in replay order; a ``BatchBuilder`` on it trains them with no
generation at all::

    replay = replay_archives(store, [first, second], queue_id="debug-7")  # full replay
    builder = replay.builder(store, EnvironmentMix.single(8), dp_size=2)
    refs = builder.next_batch(0)             # a batch of archived groups
    builder.finish_batch(refs[0].batch_id); builder.close(); replay.close()
    replay.release()                         # when the replay's data may go

An archived group is not a publication of its own (samples are packed in chunks), so the
replay publishes one tiny reference per group (``straw.rollout.replay_group``: its
samples' ``[chunk, ordinal]``, depending on the chunks): no sample or tensor byte is
written again (85 bytes for a group of 8 samples; reading a replayed group decodes its
chunk's record 0, 64 samples, so it costs about twice a queue group's read).  Retention
(RL7): the replay's branch owner ``branch:<namespace>/<queue_id>`` retains those
references, hence the chunks and every tensor they share, so ``archive.release()`` and
collection never break a running replay; ``Replay.release()`` drops it (the replay
queue's own batches keep what they name while that queue exists).  Nothing of the source
is opened or written (RL6): not its queue, not the archives' owners.  ``store``: a
writable store of the archives' pool and run (``InvalidReference`` otherwise); every
group must be ready to train (every sample completed or truncated and scored:
``ValueError`` naming the group otherwise); all of it is checked before anything is
written.  The environment of the replayed groups is ``environment`` (an archive keeps
samples, not their groups' environments).  A queue id used before is ``BranchStarted``
(a replay starts once; its retention is left alone).

Checks.  All archives of one replay belong to one pool and run (``ValueError`` naming
both archives and their pools and runs otherwise: a queue lives in one pool and run); an
archive given twice (the same storage owner) is refused; a closed archive is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from straw import Coordinator
from straw.errors import InvalidReference
from straw.refs import RecordSetRef

from .archive import RolloutArchive
from .archive_chunks import Chunk, chunk_sample, read_chunk
from .batches import Accepted, BatchBuilder
from .checkpoint_errors import BranchStarted
from .environments import EnvironmentMix
from .isolated import branch_owner, seed_isolated_queue
from .replay_group import replay_group_publication
from .samples import SampleGroup, Stage, classify
from .scheduling import scheduling_key

REPLAY_NAMESPACE = "replay"  # the replay queues' namespace, unless given


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


@dataclass
class Replay:
    """A started replay (``replay_archives``): its ``plan``, its queue's ``coordinator``
    (closed by ``close``), the ``builder_state`` a ``BatchBuilder`` on it starts from, the
    ``owner`` retaining what it trains on, and the replayed groups' publications
    (``groups``, in replay order)."""

    plan: ReplayPlan
    coordinator: Coordinator
    builder_state: dict[str, Any]
    owner: str
    groups: tuple[RecordSetRef, ...]
    environment: str
    store: Any

    def builder(self, store: Any, mix: EnvironmentMix, *, dp_size: int,
                **options: Any) -> BatchBuilder:
        """A ``BatchBuilder`` on the replay queue whose backlog is the replayed groups
        (``options``: the rest of its keywords: hooks, conversion, parallel layout)."""
        if not isinstance(mix, EnvironmentMix):
            raise TypeError(f"mix must be an EnvironmentMix, got {type(mix).__name__}")
        if self.environment not in mix.environments:
            raise ValueError(f"the replayed groups are in environment {self.environment!r}, "
                             f"not one of the mix's {list(mix.environments)}: replay them "
                             "with environment= one of those")
        return BatchBuilder(self.coordinator, store, mix, dp_size=dp_size,
                            state=self.builder_state, **options)

    def close(self) -> None:
        """Close the replay queue's coordinator (the data stays retained)."""
        self.coordinator.close()

    def release(self) -> bool:
        """Drop the replay's retention (after its last batch trained): what only it kept
        becomes collectable.  False if released already."""
        return bool(self.store.release(self.owner))

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_store(store: Any, plan: ReplayPlan) -> None:
    root = getattr(store, "root", None)
    if root is None or not hasattr(store, "publish_many"):
        raise TypeError(f"store must be a SharedFilesystemStore, got {type(store).__name__}")
    if (os.path.realpath(root) != os.path.realpath(plan.root) or store.run_id != plan.run_id
            or (plan.pool_id is not None and store.pool_id != plan.pool_id)):
        raise InvalidReference(
            f"a replay's queue lives in its archives' pool and run (run {plan.run_id!r} of "
            f"pool {plan.pool_id} at {plan.root}); the store given is run {store.run_id!r} "
            f"of pool {store.pool_id} at {root}: open a store of the archives' pool and run")


def _read_groups(store: Any, plan: ReplayPlan, environment: str) -> list[SampleGroup]:
    """Every planned group as the builder will read it, checked ready (nothing written)."""
    chunks: dict[RecordSetRef, Chunk] = {}
    groups = []
    for g in plan.groups:
        samples = []
        for m in g.members:
            where = f"archive {g.archive}: chunk {m.chunk_ref!r}"
            if m.chunk_ref not in chunks:
                chunks[m.chunk_ref] = read_chunk(store, m.chunk_ref, where)
            samples.append(chunk_sample(store, chunks[m.chunk_ref], m.ordinal, where))
        try:
            group = SampleGroup(tuple(samples), environment)
        except (TypeError, ValueError) as e:
            raise ValueError(f"archive {g.archive}: group {g.key!r} (samples "
                             f"{list(g.sample_keys)}) is not one group: {e}") from None
        if classify(group) is not Stage.READY:
            bad = next(i for i, s in enumerate(group.samples) if not s.finished)
            raise ValueError(f"archive {g.archive}: group {g.key!r} cannot be replayed: its "
                             f"sample {g.members[bad].sample_key} is "
                             f"{group.samples[bad].status.value} with reward "
                             f"{group.samples[bad].reward!r}; a replay trains only groups "
                             "whose samples are all completed or truncated and scored")
        groups.append(group)
    return groups


def replay_archives(store: Any, archives: Sequence[RolloutArchive], *, queue_id: str,
                    namespace: str = REPLAY_NAMESPACE, ratio: float | None = None,
                    seed: int = 0, environment: str = "", clock: Any = None,
                    lease_seconds: float | None = None) -> Replay:
    """Start a train-only replay of ``archives`` (module docstring): every group
    (``ratio=None``) or ``plan_replay``'s seeded subsample, restored by reference into
    the new isolated queue ``namespace/queue_id`` of ``store`` (the archives' pool and
    run).  Returns the ``Replay``; ``replay.builder(store, mix, dp_size=...)`` trains it."""
    if not isinstance(environment, str):
        raise TypeError(f"environment must be a str, got {type(environment).__name__}")
    plan = plan_replay(archives, ratio=ratio, seed=seed)
    _check_store(store, plan)
    groups = _read_groups(store, plan, environment)
    pubs = [replay_group_publication([(m.chunk_ref, m.ordinal) for m in g.members],
                                     environment=environment, tokens=group.tokens)
            for g, group in zip(plan.groups, groups, strict=True)]
    # the selection's digest in the submission id: another selection under the same queue
    # id writes its own references (and is then refused as BranchStarted), never conflicts
    selection = hashlib.sha256(json.dumps(
        [environment, [[g.storage_owner, g.first] for g in plan.groups]]).encode()
    ).hexdigest()[:16]
    refs = store.publish_many(pubs, submission_id=f"replay:{namespace}/{queue_id}:{selection}")
    accepted = [Accepted(i, f"{g.storage_owner}#{g.first}", ref, environment,
                         scheduling_key(group), tuple(len(s.tokens) for s in group.samples))
                for i, (g, group, ref) in enumerate(zip(plan.groups, groups, refs,
                                                        strict=True))]
    try:
        seeded = seed_isolated_queue(store, namespace=namespace, queue_id=queue_id, tasks=[],
                                     producer_state=None, accepted=accepted, clock=clock,
                                     lease_seconds=lease_seconds)
    except BranchStarted as e:
        raise BranchStarted(f"replay queue {namespace}/{queue_id} exists: a replay starts "
                            "once (its data stays retained by its owner "
                            f"{branch_owner(namespace, queue_id)!r}); choose a new queue_id"
                            ) from e
    finally:
        # retained by the branch owner from here on (or, when seeding failed, by nothing
        # of ours: the collector may have them)
        store.release_publications(refs)
    return Replay(plan, seeded.coordinator, seeded.builder_state, seeded.owner, tuple(refs),
                  environment, store)


__all__ = ["ReplayMember", "ReplayGroup", "ReplayPlan", "Replay", "archive_groups",
           "check_one_pool_and_run", "subsample_count", "plan_replay", "replay_archives",
           "REPLAY_NAMESPACE"]
