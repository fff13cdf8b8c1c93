"""SimFS: an in-memory, crashable, multi-client implementation of ``straw.fs.Filesystem``.

Role: let every engine test run on a filesystem that loses unsynced writes, tears
sectors, fails syscalls and shows other clients stale views -- deterministically from a
seed (``SimFS(seed)``), so every failure replays.  ``describe()`` prints the seed and
the fault schedule.

Model (kept deliberately small; each point is what the engine may rely on, no more;
the durable-vs-cache bookkeeping and the crash variants live in ``simstate``):

* Files and directories are inodes.  A directory maps names to inodes, so ``rename`` and
  ``unlink`` keep open handles valid (POSIX); an unlinked inode lives while a handle is
  open and is gone after a crash.  No symlinks, no hard links.  fds are never reused.
* Durability.  Each file has ``data`` (the page cache: what reads see) and ``durable``
  (what survives power loss) plus ``pending``, the unsynced data ops (write, truncate,
  reserve) in issue order.  ``fsync``/``fdatasync`` apply ``pending`` to ``durable``
  (data and size; SimFS keeps no other metadata, so the two are equal).  Each directory
  has ``entries`` and ``durable_entries``; unsynced namespace ops (create, mkdir,
  rename, unlink) are a global list.  ``fsync_dir(D)`` makes every pending op that names
  D durable, together with the earlier ops those depend on (same inode, same
  ``(dir, name)`` slot, or creation of a directory they live in) -- and nothing else, so
  a missing ``fsync_dir`` elsewhere is not hidden.
* ``crash(variant)`` is a power loss of the whole filesystem.  Synced state always
  survives.  Of the unsynced state:

  - ``"clear-cache"``: all of it is lost;
  - ``"torn-seq"``: a prefix, in global issue order, of all unsynced data and namespace
    ops survives; the first op after the cut may survive as a prefix of its 512-byte
    sectors;
  - ``"torn-op"``: every sector-sized piece of every unsynced write, every unsynced
    truncate/reserve and every unsynced namespace op independently survives or not; in
    each file with unsynced writes, one sector piece may hold random garbage (only ever
    inside a range written since the last sync).

  A surviving write past the durable end leaves zeros in between; a namespace op whose
  source is gone in the surviving state (a rename of a file whose creation was lost) is
  skipped.  After ``crash()`` every handle is invalid (EBADF), all locks are released,
  all clients are alive again and see the surviving state.
* Crash points and errno rules: see ``fault_injection.rules``.  Injected failures act
  like this: ``writev`` writes a random prefix (possibly empty) then fails; a failed
  ``fsync``/``fdatasync``/``close`` chooses (rng) to *keep* the dirty data pending, to
  *forget* it (still readable, but never made durable by a later sync: fsyncgate), or to
  *revert* the cache to the durable content; a failed ``close`` still closes; every other
  failed op has no effect.
* Clients (``sim.client(name)``; ``SimFS`` itself is client ``"main"``) share the
  namespace and the inodes; a client always sees its own writes.  Other clients:
  close-to-open on sizes -- ``flushed_size`` (set by the writer's ``close``/``fsync``/
  ``fdatasync``) bounds what another client's ``open`` sees, and a handle keeps the size
  it saw at open for its whole life (reopen to see more); bytes inside that size read as
  current (overwrites may show early: "may", not "must").  With ``staleness > 0``,
  ``stat`` and ``listdir`` answers are cached per client and reused until
  ``staleness`` seconds of the injected ``straw.clock.Clock`` passed (NFS/JuiceFS
  attribute and entry caches); a client's own namespace or data change drops its own
  caches.  ``open`` always looks up the current namespace.
* Locks are exclusive per open handle (flock semantics) across all clients; closing the
  handle, ``kill_client`` or ``crash`` releases them.  ``broken_locks=True`` grants every
  lock (negative controls).  A blocking ``lock`` that nobody releases within
  ``lock_timeout`` real seconds raises ``SimDeadlock`` instead of hanging the test.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable

from fault_injection.rules import (
    CrashPoint,
    ErrnoRule,
    FaultEvent,
    FaultPlan,
    TraceEntry,
)
from fault_injection.simclient import SimClient as SimClient
from fault_injection.simclient import SimDeadlock as SimDeadlock
from fault_injection.simclient import _Handle
from fault_injection.simstate import (
    DirNode,
    FileNode,
    SimState,
)
from straw.clock import Clock, ManualClock


class SimFS(SimClient):
    """The simulated filesystem (the "world"); itself the client named ``"main"``.

    ``SimFS(seed, clock=ManualClock(0.0), staleness=0.0, broken_locks=False)``; ``clock``
    is any ``straw.clock.Clock`` (share the engine's, so its retry sleeps age the caches).
    See the module docstring for the model and ``fault_injection.rules`` for crash points
    and errno rules.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        clock: Clock | None = None,
        staleness: float = 0.0,
        broken_locks: bool = False,
        supports_reserve: bool = True,
        record_trace: bool = True,
        lock_timeout: float = 5.0,
    ) -> None:
        self.plan = FaultPlan(seed, record_trace=record_trace)
        self.clock: Clock = clock if clock is not None else ManualClock(0.0)
        self.staleness = staleness
        self.broken_locks = broken_locks
        self.supports_reserve = supports_reserve
        self.lock_timeout = lock_timeout
        self._mu = threading.RLock()
        self._cond = threading.Condition(self._mu)
        self.state = SimState()
        self._handles: dict[int, _Handle] = {}
        self._next_fd = 3
        self._clients: dict[str, SimClient] = {}
        self.crashes = 0
        super().__init__(self, "main")
        self._clients["main"] = self

    # --- public API -------------------------------------------------------------------
    @property
    def seed(self) -> int:
        return self.plan.seed

    def client(self, name: str) -> SimClient:
        """The view of client ``name`` (created on first use; ``"main"`` is this SimFS)."""
        with self._mu:
            c = self._clients.get(name)
            if c is None:
                c = self._clients[name] = SimClient(self, name)
            return c

    def crash_at(
        self,
        nth: int,
        *,
        ops: Iterable[str] | str | None = None,
        path: str | None = None,
        when: str = "before",
        client: str | None = None,
    ) -> CrashPoint:
        """Raise ``SimulatedCrash`` before/after the ``nth`` (1-based) call matching
        ``ops``/``path`` regex/``client``."""
        return self.plan.crash_at(nth, ops=ops, path=path, when=when, client=client)

    def fail(
        self,
        ops: Iterable[str] | str,
        err: int,
        *,
        path: str | None = None,
        nth: int | None = None,
        probability: float | None = None,
        count: int | None = 1,
        client: str | None = None,
    ) -> ErrnoRule:
        """Inject ``err`` into matching calls (see ``ErrnoRule``)."""
        return self.plan.fail(
            ops, err, path=path, nth=nth, probability=probability, count=count, client=client
        )

    @property
    def op_count(self) -> int:
        """Calls made so far, over all clients (the next call has this index)."""
        return self.plan.op_count

    @property
    def trace(self) -> list[TraceEntry]:
        return self.plan.trace

    @property
    def schedule(self) -> list[FaultEvent]:
        return self.plan.events

    def describe(self) -> str:
        """Seed, rules and injected faults (crash points, errnos, power losses)."""
        return "SimFS " + self.plan.describe()

    def crash(self, variant: str = "clear-cache", rng: random.Random | None = None) -> str:
        """Power loss: keep what is durable plus what ``variant`` lets survive (see the
        module docstring); invalidate all handles, release all locks, revive all clients.
        ``rng`` (a ``random.Random``) defaults to the seeded plan rng.  Returns a summary,
        also recorded in the schedule."""
        r = rng if rng is not None else self.plan.rng
        with self._mu:
            summary = self.state.crash(variant, r)
            self._handles.clear()
            for c in self._clients.values():
                c._changed()
            self.plan.revive()
            self._cond.notify_all()
            self.crashes += 1
            self.plan.record("crash", summary)
            return summary

    def kill_client(self, name: str) -> None:
        """The process behind client ``name`` died (SIGKILL), the machine did not: its
        handles close (flushing what it wrote, as the kernel does), its locks are released,
        its caches dropped; it may make calls again (a restarted process)."""
        with self._mu:
            for fd, h in list(self._handles.items()):
                if h.client != name:
                    continue
                del self._handles[fd]
                if h.inode.lock_owner is h:
                    h.inode.lock_owner = None
                if h.writable:
                    h.inode.flushed_size = len(h.inode.data)
            self._cond.notify_all()
            c = self._clients.get(name)
            if c is not None:
                c._changed()
            self.plan.revive(name)
            self.plan.record("kill", f"client {name!r} killed")

    def files(self) -> dict[str, bytes]:
        """Every file path and its current content (a test/campaign helper, not an op)."""
        with self._mu:
            return {p: bytes(n.data) for p, n in self.state.walk() if isinstance(n, FileNode)}

    def dirs(self) -> list[str]:
        """Every directory path (a test/campaign helper, not an op)."""
        with self._mu:
            return [p for p, n in self.state.walk() if isinstance(n, DirNode)]

    # --- internals ----------------------------------------------------------------------
    def _now_ns(self) -> int:
        return int(self.clock.now() * 1e9)

    def _sync_failed(self, f: FileNode, client: str, op: str, path: str) -> None:
        """A sync (or close) failed: the dirty data is kept, forgotten or reverted (rng),
        never made durable."""
        choice = self.plan.rng.choice(("keep", "forget", "revert"))
        self.state.drop_dirty(f, choice)
        self.plan.record(
            "dirty data after failed sync", choice, client=client, op=op, paths=(path,)
        )
