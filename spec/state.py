"""The state of the straw protocol: frozen, hashable, canonical.

Role: every variable the protocol changes, grouped by concern. All containers are tuples and
frozensets so that equal states compare and hash equal (the explorer's visited set relies on it).
Indices refer to the static `spec.config.Config` (extent i is `cfg.extents[i]`, and so on).

Durable versus volatile: pack contents, tombstones, owner roots, staging, pins, the queue's task
table, commit log, coordinator epoch and consumer/checkpoint records are durable (they survive
crashes). Volatile: extents in state VOLATILE (written, not fsynced), the collector's lock and
plan, a coordinator's serving epoch (process memory), and what clients hold (leases, reads).
Lease grants are journaled (durable): recovery revokes them but remembers their attempt numbers
(and, under the spending policy, counts each revocation against the task's retry budget).

Invariants on these variables are in `spec/invariants.py`; the transitions in `spec/actions.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from spec.config import Config


class PackStatus(str, Enum):
    """Lifecycle of a pack path. "Tombstoned" is SEALED plus a tombstone in Storage.tombstones:
    the tombstone is a separate durable file that outlives the unlink."""

    ABSENT = "absent"
    OPEN = "open"
    SEALED = "sealed"
    UNLINKED = "unlinked"


class ExtentStatus(str, Enum):
    """NONE: not published. VOLATILE: written, not fsynced. DURABLE: fsynced. LOST: a crash
    dropped its unsynced bytes."""

    NONE = "none"
    VOLATILE = "volatile"
    DURABLE = "durable"
    LOST = "lost"


class TaskStatus(str, Enum):
    UNSUBMITTED = "unsubmitted"
    PENDING = "pending"
    LEASED = "leased"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})


@dataclass(frozen=True)
class Storage:
    """Packs, extents and the protection of extents.

    roots[o] is owner o's durable root set (replaced by retain). staged holds fresh
    publications not yet adopted or released. pins holds (holder, extent) pairs held by readers
    ("r0") and by workers reading task inputs ("w0"). returned is the set of references handed
    to some client (they may travel anywhere, so a retain of them can arrive at any time)."""

    packs: tuple[PackStatus, ...]
    tombstones: frozenset[int]
    extents: tuple[ExtentStatus, ...]
    returned: frozenset[int]
    staged: frozenset[int]
    roots: tuple[frozenset[int], ...]
    pins: frozenset[tuple[str, int]]


@dataclass(frozen=True)
class Collector:
    """The (single) collector process: holds the cross-client lock; plan is the set of packs
    it found unreachable at its scan (volatile, lost on a collector crash)."""

    locked: bool = False
    plan: frozenset[int] | None = None


@dataclass(frozen=True, order=True)
class Lease:
    """What a worker holds: the task, the attempt number and the granting coordinator's epoch.
    (task, attempt, epoch, worker) is also the completion's submission (idempotency) id."""

    worker: int
    task: int
    attempt: int
    epoch: int


@dataclass(frozen=True)
class Task:
    """The durable task record. attempt counts leases granted (grants are journaled, so
    recovery never reuses an attempt number); failures is the retry budget spent (fail and
    lease expiry spend it, and so does a revocation by retire_worker; yield, release and
    recovery do not); lease_epoch is the epoch of the current lease and holder the worker it
    was granted to (journaled with the grant: retire_worker revokes that worker's leases);
    expired is the abstract clock: the current lease's deadline has passed."""

    status: TaskStatus = TaskStatus.UNSUBMITTED
    attempt: int = 0
    failures: int = 0
    lease_epoch: int = 0
    holder: int = -1
    expired: bool = False
    input: int = -1
    # the FIFO position a yield gave the task (the tail of the queue's FIFO); -1: its
    # declared (submission) position, which release, fail, expiry and recovery keep (Q4)
    fifo: int = -1
    yielded: bool = False


@dataclass(frozen=True)
class Request:
    """The producer's submit request for one task: sent, and acknowledged (reply received)."""

    sent: bool = False
    acked: bool = False


@dataclass(frozen=True)
class Commit:
    """One accepted result in the commit log (durable, ordered)."""

    lease: Lease
    result: int


@dataclass(frozen=True)
class Coordinator:
    """The coordinator of one queue. serving: epoch of the running coordinator process (None
    when crashed). durable: the epoch recorded durably with the queue lock. paused: epoch of an
    old coordinator process that is stopped (SIGSTOP / partition) and may resume."""

    serving: int | None = 1
    durable: int = 1
    paused: int | None = None


@dataclass(frozen=True)
class Consumer:
    """The consumer of one queue's commit log, and its checkpoint.

    cursor: next commit index to read. buffer: results the consumer relies on (its state).
    acked: commit indices past the cursor the consumer acknowledged out of order (the sparse
    processed positions of its progress record).
    ck_cursor, ck_acked: cursor and acked saved by the registered checkpoint (None: none).
    registrations: how many checkpoints were registered (bounded by Config.checkpoints)."""

    cursor: int = 0
    buffer: frozenset[int] = frozenset()
    acked: frozenset[int] = frozenset()
    ck_cursor: int | None = None
    ck_acked: frozenset[int] = frozenset()
    registrations: int = 0


@dataclass(frozen=True)
class CatalogFiles:
    """The catalog's files, in configurations that model its compaction (CS1).

    The catalog's content is what the other variables say is durable (owner roots,
    staging, pins, tombstones); this records where that content lives. ``base``: the
    generation whose snapshot the catalog's first frame names (0: never compacted, the
    whole history is in the catalog). ``truncated``: a compaction emptied the catalog and
    its new base frame is not written yet. ``snaps``: snapshot files (generation,
    durable). ``head``: the durable copy of the next base frame (generation, lossy: it
    lacks operations appended while its snapshot was written). ``compacting``: the
    generation a live compactor is producing; ``suffix``: content changed since it took
    its snapshot; ``locked``: the compactor holds the pool lock (its final steps)."""

    base: int = 0
    lossy: bool = False
    truncated: bool = False
    snaps: frozenset[tuple[int, bool]] = frozenset()
    head: tuple[int, bool] | None = None
    compacting: int | None = None
    suffix: bool = False
    locked: bool = False


@dataclass(frozen=True)
class HistoryFiles:
    """A queue's history segments, in configurations that model them (H1).

    The queue's content is what the other variables say the journal holds; a journal
    snapshot moves its completed history (terminal tasks, commits, submission and request
    ids) into immutable history segments and names them. ``named``: the generation of
    segments the durable journal snapshot names (0: none, all history is in the snapshot
    itself). ``segs``: segment files (generation, durable). ``writing``: the generation a
    live coordinator's snapshot is producing; ``snapshotted``: its journal snapshot is
    durable (only the deletion of what it no longer names is left)."""

    named: int = 0
    segs: frozenset[tuple[int, bool]] = frozenset()
    writing: int | None = None
    snapshotted: bool = False


@dataclass(frozen=True)
class State:
    storage: Storage
    collector: Collector
    tasks: tuple[Task, ...]
    requests: tuple[Request, ...]
    commits: tuple[Commit, ...]
    coords: tuple[Coordinator, ...]
    consumers: tuple[Consumer, ...]
    leases: frozenset[Lease]
    reads: frozenset[tuple[int, int, int]]  # (worker, task, extent) still being read
    crashes: int = 0
    pauses: int = 0
    # leases whose fail request is journaled under its request id (durable: the journal
    # answers a retry after a lost reply, Q7)
    answered: frozenset[Lease] = frozenset()
    catalog: CatalogFiles = CatalogFiles()
    history: HistoryFiles = HistoryFiles()


def initial_state(cfg: Config) -> State:
    """Nothing published except cfg.preloaded (durable, returned, staged, producer-held)."""
    ext = [ExtentStatus.NONE] * len(cfg.extents)
    packs = [PackStatus.ABSENT] * len(cfg.packs)
    for e in cfg.preloaded:
        ext[e] = ExtentStatus.DURABLE
        packs[cfg.extents[e].pack] = PackStatus.OPEN
    storage = Storage(
        packs=tuple(packs),
        tombstones=frozenset(),
        extents=tuple(ext),
        returned=frozenset(cfg.preloaded),
        staged=frozenset(cfg.preloaded),
        roots=tuple(frozenset() for _ in cfg.owners),
        pins=frozenset(),
    )
    return State(
        storage=storage,
        collector=Collector(),
        tasks=tuple(Task(input=t.input) for t in cfg.tasks),
        requests=tuple(Request() for _ in cfg.tasks),
        commits=(),
        coords=tuple(Coordinator() for _ in cfg.queues),
        consumers=tuple(Consumer() for _ in cfg.queues),
        leases=frozenset(),
        reads=frozenset(),
    )
