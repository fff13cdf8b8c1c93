"""Retention conformance (verification layer 5): the engine, on SimFS, against ``spec/``.

One Hypothesis ``RuleBasedStateMachine`` drives two stores -- clients ``c0`` and ``c1`` of
one SimFS, each a ``SharedFilesystemStore`` with its own ``writer_id`` -- through publish
(single, with dependencies, ``publish_many`` with index dependencies), seal, clean writer
restart, retain, release, release_publications, pin / unpin (pins held open across steps)
and collect_garbage, and applies the same actions of ``spec.actions`` to the spec state in
lockstep.  Any mutating step may be cut by a crash: a SimFS crash point on a random
mutating op of the acting client, then either a SIGKILL of that client
(``sim.kill_client``) or a power loss of the whole filesystem (``sim.crash(variant)``,
every variant).  The dead stores are reopened (a new writer incarnation, which seals its
predecessor's open packs in the catalog).

How the universe is declared (the spec's ``Config`` is static): per run Hypothesis draws a
universe of 2 writers x 3 packs x 1-3 extents with dependency edges onto earlier extents
(``harness.universes``).  A publish step picks extents of the writer's OPEN spec pack (or
of a fresh one when the writer has none open) whose spec preconditions hold; the engine
writer rotates only when the machine seals, so one engine pack is one spec pack.  A spec
pack is bound to an engine path the first time the engine puts one of its extents there.
Spec owner ``app`` is engine owner ``"app"``; spec pin ``(reader, e)`` is one engine
``store.pin([ref])`` context entered in one step and exited in a later one (or, when its
process died meanwhile, released by name from another store, as an operator would).

An interrupted operation may have happened or not; the machine decides which by
inspecting the engine after recovery and then applies the matching spec action(s), which
must be enabled (nothing else is allowed):

* publish: ``lookup_submission`` finds the submission -> write + sync of every extent
  (then the crash); otherwise, if the catalog shows a pack the engine opened for it and
  its file exists -> write of the first extent (LOST by the crash); otherwise nothing.
  (A pack path the catalog recorded as opened whose file never became durable is counted
  as a "phantom": the engine leaves it "open" in the catalog; it holds nothing.)
* retain / release / pin / unpin / release_publications: the catalog's owner roots,
  owners and staging show whether the transaction committed.
* seal: the pack ends up sealed either way (seal, or the crash, in the spec).
* collect_garbage: gc_lock, gc_scan, gc_tombstone for every pack the catalog shows newly
  tombstoned (must be in the spec's plan), gc_unlink for every tombstoned pack whose unlink
  the catalog records (it is recorded after the directory fsync: an unlink not yet
  recorded may be undone by a power loss, and the next collection redoes it),
  collector_crash.
* then ``writer_crash`` for every writer whose process died.

After every step the engine's observable state must map onto the spec's: pack states
(open / sealed / tombstoned / unlinked in the catalog; the file exists unless the pack is
tombstoned, and is gone once the unlink is recorded), owners and their roots (``app`` and
every pin), staging of every durable extent of a sealed pack, which packs are live, the
tombstones a collection reports, and reads through a third client: every durable
reference in a pack without tombstone reads back intact, every reference in an unlinked
pack raises ``InvalidReference`` (in between, either).  Retain and pin must raise
``InvalidReference`` exactly when the spec refuses them.  The spec's retention invariants
D1, D2, D3, D4 and R1 (the ids of ``spec/invariants.py``) are checked on the spec state
after every step.

Where the engine may differ from the spec, by design: every extent of an OPEN pack counts
as staged until the pack is sealed (``straw.catalog``), so a collection may defer packs
that only such an extent's dependencies keep; the spec allows a collection to tombstone a
subset of its plan, and the machine checks that every deferred pack is reached from an open
pack.  Known engine bugs are listed in ``KNOWN_ENGINE_BUGS`` (tolerated, counted, and each
pinned by a strict xfail test).

Profiles: ``ci`` (default) and ``deep`` (``STRAW_HYPOTHESIS_PROFILE=deep``).  The number of
steps run is printed at the end (``pytest -s tests/conformance``) and written to
``conformance-steps.txt`` in pytest's base temp directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fault_injection.rules import MUTATING_OPS, SimulatedCrash
from fault_injection.simfs import SimFS
from spec import actions as A
from spec.config import Config
from spec.invariants import STATE_INVARIANTS
from spec.mutants import CORRECT
from spec.state import ExtentStatus, PackStatus, initial_state
from straw import InvalidReference, Publication, Record, RecordSetRef
from straw.store import Pin
from tests.conformance.harness import (
    OBSERVER,
    READERS,
    ROOT,
    RUN,
    STATS,
    WRITERS,
    observe_catalog,
    open_store,
    pack_file_exists,
    universes,
    writer_prefix,
)

CHECKED_INVARIANTS = ("D1", "D2", "D3", "D4", "R1")
CRASH_MODES = ("kill", "power/clear-cache", "power/torn-seq", "power/torn-op")
SIZES = (0, 1, 100, 700, 3000)

# Engine bugs this machine found and reported.  While one is listed, the machine tolerates
# exactly its signature (counted in the summary); remove the entry when the engine is fixed
# (the strict xfail test at the bottom then starts failing as a reminder).
# Empty: "retain-ignores-dependency-tombstone" (retain/pin accepted a root whose dependency
# closure reached a tombstoned pack) is fixed by CatalogState.tombstoned_dependency.
KNOWN_ENGINE_BUGS: dict[str, str] = {}

PROFILES = {
    "ci": settings(max_examples=300, stateful_step_count=80, deadline=None,
                   suppress_health_check=list(HealthCheck)),
    "deep": settings(max_examples=1000, stateful_step_count=80, deadline=None,
                     suppress_health_check=list(HealthCheck)),
}

Extent = tuple[str, int]


class RetentionConformance(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cfg: Config | None = None
        STATS.examples += 1

    # --- set-up -----------------------------------------------------------------------
    @initialize(cfg=universes(), seed=st.integers(0, 2**32 - 1))
    def setup(self, cfg: Config, seed: int) -> None:
        self.cfg = cfg
        self.spec = initial_state(cfg)
        self.sim = SimFS(seed)
        self.stores = {w: open_store(self.sim, w) for w in WRITERS}
        self.reader = open_store(self.sim, OBSERVER)  # reads only: never takes a writer lock
        self.gen = {w: 0 for w in WRITERS}  # store incarnation per client
        self.refs: dict[int, RecordSetRef] = {}
        self.records: dict[int, list[Record]] = {}
        self.pack_path: dict[int, str] = {}
        self.phantoms: set[str] = set()
        self.pins: dict[tuple[str, int], tuple[Pin, str, int]] = {}
        self.attempts = 0
        self.trace: list[str] = [f"seed={seed} universe: " + ", ".join(
            f"{d.name}->{[cfg.ename(x) for x in d.deps]}" if d.deps else d.name
            for d in cfg.extents)]

    # --- helpers ------------------------------------------------------------------------
    def _fail(self, msg: str) -> None:
        raise AssertionError(msg + "\nlockstep trace (last 40):\n" + "\n".join(self.trace[-40:])
                             + "\n" + self.sim.describe()[-3000:])

    def _spec(self, fn: Callable[..., A.Outcome | None], *args: Any, why: str = "") -> None:
        assert self.cfg is not None
        out = fn(self.cfg, CORRECT, self.spec, *args)
        shown = ", ".join(self._name(fn, a) for a in args)
        if out is None:
            self._fail(f"the spec does not allow {fn.__name__}({shown}) here, but the engine "
                       f"did it{': ' + why if why else ''}")
        assert out is not None
        self.spec = out.state
        self.trace.append(f"    spec {fn.__name__}({shown}) -> {out.reply}")

    def _name(self, fn: Callable[..., Any], a: Any) -> str:
        assert self.cfg is not None
        if isinstance(a, int) and fn in (A.seal, A.gc_tombstone, A.gc_unlink):
            return self.cfg.packs[a]
        if isinstance(a, int) and fn in (A.write, A.sync, A.retain, A.pin, A.unpin,
                                         A.release_publications):
            return self.cfg.ename(a) if fn is not A.retain else str(a)
        return str(a)

    def _run(self, client: str, data: st.DataObject, fn: Callable[[], Any]
             ) -> tuple[Any, str | None]:
        """Run ``fn`` (one engine call of ``client``), maybe cut by a crash point on one of
        the client's mutating ops.  Returns (result, None) or (None, crash mode)."""
        plan = None
        if data.draw(st.integers(0, 2), label="crash?") == 2:
            plan = (data.draw(st.integers(1, 24), label="crash at mutating op #"),
                    data.draw(st.sampled_from(("before", "after")), label="when"),
                    data.draw(st.sampled_from(CRASH_MODES), label="mode"))
        point = None
        if plan is not None:
            point = self.sim.crash_at(plan[0], ops=MUTATING_OPS, when=plan[1], client=client)
        try:
            return fn(), None
        except SimulatedCrash:
            assert plan is not None
            self.trace.append(f"    CRASH {plan[2]} at {plan[1]} mutating op #{plan[0]} of "
                              f"{client}")
            return None, plan[2]
        finally:
            if point is not None:
                point.fired = True  # disarmed if the call finished first

    def _recover(self, client: str, mode: str) -> list[str]:
        """Apply the crash mode and reopen the dead stores; returns the dead writers."""
        STATS.crash(mode)
        if mode == "kill":
            self.sim.kill_client(client)
            dead = [client]
        else:
            self.sim.crash(mode.split("/", 1)[1])
            dead = list(WRITERS)
        for w in dead:
            self.stores[w] = open_store(self.sim, w)
            self.gen[w] += 1
            # restart the writer now: the new incarnation seals its dead predecessor's packs
            self.stores[w].lookup_submission("restart-probe")
        return dead

    def _writer_crashes(self, dead: list[str]) -> None:
        assert self.cfg is not None
        for w in dead:
            if A.writer_crash(self.cfg, CORRECT, self.spec, w) is not None:
                self._spec(A.writer_crash, w)

    def _known_bug_or_fail(self, e: int, restore: Callable[[], Any], msg: str) -> None:
        """KNOWN_ENGINE_BUGS["retain-ignores-dependency-tombstone"]: the engine's retain/pin
        checks the tombstones of the roots only, not of their dependency closure.  While
        that bug is open the machine counts the hit, undoes the engine's extra root (so the
        run stays in lockstep) and goes on; any other refusal mismatch fails."""
        assert self.cfg is not None
        s = self.spec.storage
        own_pack_dead = self.cfg.extents[e].pack in s.tombstones
        if own_pack_dead or "retain-ignores-dependency-tombstone" not in KNOWN_ENGINE_BUGS:
            self._fail(msg)
        STATS.bump("known engine bug hit: retain-ignores-dependency-tombstone")
        self.trace.append(f"    KNOWN ENGINE BUG: {msg}; undone")
        restore()

    def _extents(self, es: frozenset[int] | set[int]) -> frozenset[Extent]:
        return frozenset((self.refs[e].path, self.refs[e].offset) for e in es)

    def _bind(self, p: int, path: str) -> None:
        assert self.cfg is not None
        have = self.pack_path.get(p)
        if have is not None and have != path:
            self._fail(f"spec pack {self.cfg.packs[p]} is engine pack {have}, but the engine "
                       f"put its extent into {path}")
        for q, other in self.pack_path.items():
            if other == path and q != p:
                self._fail(f"engine pack {path} holds extents of spec packs "
                           f"{self.cfg.packs[q]} and {self.cfg.packs[p]}")
        self.pack_path[p] = path

    def _spec_pack(self, path: str) -> int:
        for p, other in self.pack_path.items():
            if other == path:
                return p
        self._fail(f"engine pack {path} is not bound to any spec pack")
        raise AssertionError  # unreachable

    def _client(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(WRITERS), label="client")

    # --- publish ------------------------------------------------------------------------
    def _feasible(self, batch: tuple[int, ...]) -> bool:
        assert self.cfg is not None
        s = self.spec
        for e in batch:
            out = A.write(self.cfg, CORRECT, s, e)
            if out is None:
                return False
            out = A.sync(self.cfg, CORRECT, out.state, e)
            if out is None:
                return False
            s = out.state
        return True

    def _publish_candidates(self) -> list[tuple[str, int, tuple[int, ...]]]:
        assert self.cfg is not None
        cfg, s = self.cfg, self.spec.storage
        out = []
        for w in WRITERS:
            mine = [p for p, pw in enumerate(cfg.pack_writer) if pw == w]
            targets = [p for p in mine if s.packs[p] == PackStatus.OPEN] or [
                p for p in mine if s.packs[p] == PackStatus.ABSENT and not A.pack_dead(s, p)]
            for p in targets:
                fresh = [e for e, d in enumerate(cfg.extents)
                         if d.pack == p and s.extents[e] == ExtentStatus.NONE]
                batches = [(e,) for e in fresh] + [(a, b) for a in fresh for b in fresh
                                                   if a != b]
                out += [(w, p, b) for b in batches if self._feasible(b)]
        return out

    def _bind_publication(self, p: int, batch: tuple[int, ...], refs: list[RecordSetRef]
                          ) -> None:
        if len(refs) != len(batch):
            self._fail(f"{len(refs)} references for a batch of {len(batch)}")
        if len({r.path for r in refs}) != 1:
            self._fail(f"one publish_many went to several packs: {refs}")
        self._bind(p, refs[0].path)
        for e, ref in zip(batch, refs, strict=True):
            self.refs[e] = ref
        for e in batch:
            self._spec(A.write, e)
            self._spec(A.sync, e)

    @precondition(lambda self: self.cfg is not None and bool(self._publish_candidates()))
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        assert self.cfg is not None
        cfg = self.cfg
        cands = self._publish_candidates()
        if not cands:
            return
        STATS.step("publish")
        w, p, batch = data.draw(st.sampled_from(cands), label="writer, pack, extents")
        for e in batch:
            size = data.draw(st.sampled_from(SIZES), label="size")
            payload = (cfg.ename(e).encode() * (size // 4 + 1))[:size]
            self.records[e] = [Record(cfg.ename(e), payload, "bytes.v1", {"e": cfg.ename(e)})]
        pubs = [Publication(self.records[e], tuple(
            batch.index(d) if d in batch else self.refs[d] for d in cfg.extents[e].deps))
            for e in batch]
        self.attempts += 1
        for pb in pubs:
            if any(isinstance(d, int) for d in pb.dependencies):
                STATS.bump("publish_many with an index dependency")
            if any(isinstance(d, RecordSetRef) and d.path != self.pack_path.get(p)
                   for d in pb.dependencies):
                STATS.bump("publication with a dependency in another pack")
        sid = f"s{self.attempts}:" + "+".join(cfg.ename(e) for e in batch)
        store = self.stores[w]
        single = len(batch) == 1 and data.draw(st.booleans(), label="publish (not _many)")
        self.trace.append(f"{w}: {'publish' if single else 'publish_many'} {sid} deps "
                          f"{[list(pb.dependencies) for pb in pubs]}")

        def call() -> list[RecordSetRef]:
            if single:
                return [store.publish(pubs[0].records, submission_id=sid,
                                      dependencies=pubs[0].dependencies)]
            return store.publish_many(pubs, submission_id=sid)

        refs, crash = self._run(w, data, call)
        if crash is None:
            self._bind_publication(p, batch, refs)
            return
        dead = self._recover(w, crash)
        found = self.stores[w].lookup_submission(sid)
        if found is not None:
            self.trace.append(f"    recovery: lookup finds {sid}")
            self._bind_publication(p, batch, found)
        elif self.spec.storage.packs[p] == PackStatus.ABSENT:
            cat = observe_catalog(self.sim)
            bound = set(self.pack_path.values()) | self.phantoms
            new = [path for path in cat.packs
                   if path.startswith(writer_prefix(w)) and path not in bound]
            if len(new) > 1:
                self._fail(f"one interrupted publish left several new packs: {new}")
            if new and pack_file_exists(self.sim, new[0]):
                self.trace.append(f"    recovery: pack {new[0]} opened, {sid} lost")
                self._bind(p, new[0])
                self._spec(A.write, batch[0], why="a pack was opened for it")
            elif new:
                self.trace.append(f"    recovery: phantom pack {new[0]} (never created)")
                self.phantoms.add(new[0])
                STATS.phantom_packs += 1
        self._writer_crashes(dead)

    # --- seal and clean restart -----------------------------------------------------------
    def _open_pack_of(self, w: str) -> int | None:
        assert self.cfg is not None
        for p, pw in enumerate(self.cfg.pack_writer):
            if pw == w and self.spec.storage.packs[p] == PackStatus.OPEN:
                return p
        return None

    @precondition(lambda self: self.cfg is not None and any(
        self._open_pack_of(w) is not None for w in WRITERS))
    @rule(data=st.data())
    def seal(self, data: st.DataObject) -> None:
        cands = [w for w in WRITERS if self._open_pack_of(w) is not None]
        if not cands:
            return
        STATS.step("seal")
        w = data.draw(st.sampled_from(cands), label="writer")
        p = self._open_pack_of(w)
        self.trace.append(f"{w}: seal")
        _, crash = self._run(w, data, self.stores[w].seal)
        self._spec(A.seal, p)  # sealed by the call or, after a crash, by recovery
        if crash is not None:
            self._writer_crashes(self._recover(w, crash))

    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.returned))
    @rule(data=st.data())
    def restart_writer(self, data: st.DataObject) -> None:
        """A clean close (seals the open pack) and a reopen of the same writer id."""
        STATS.step("restart_writer")
        w = self._client(data)
        p = self._open_pack_of(w)
        self.trace.append(f"{w}: close and reopen")
        _, crash = self._run(w, data, self.stores[w].close)
        if p is not None:
            self._spec(A.seal, p)
        if crash is not None:
            self._writer_crashes(self._recover(w, crash))
            return
        self.stores[w] = open_store(self.sim, w)
        self.gen[w] += 1

    # --- owners -----------------------------------------------------------------------------
    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.returned))
    @rule(data=st.data())
    def retain(self, data: st.DataObject) -> None:
        assert self.cfg is not None
        s = self.spec.storage
        cands = sorted(e for e in s.returned if e not in s.roots[0])
        if not cands:
            return
        STATS.step("retain")
        e = data.draw(st.sampled_from(cands), label="extent")
        c = self._client(data)
        old, new = s.roots[0], s.roots[0] | {e}
        usable = A.usable(self.cfg, s, e)
        refs = [self.refs[x] for x in sorted(new)]
        self.trace.append(f"{c}: retain app += {self.cfg.ename(e)} (spec: "
                          f"{'ok' if usable else 'InvalidReference'})")
        try:
            _, crash = self._run(c, data, lambda: self.stores[c].retain("app", refs))
        except InvalidReference as exc:
            STATS.invalid_reference_replies += 1
            if usable:
                self._fail(f"engine refused retain of usable {self.cfg.ename(e)}: {exc}")
            return
        restore = (lambda: self.stores[c].retain("app", [self.refs[x] for x in sorted(old)])) \
            if old else (lambda: self.stores[c].release("app"))
        if crash is None:
            if not usable:
                self._known_bug_or_fail(
                    e, restore, f"engine accepted retain('app', +{self.cfg.ename(e)}) but the "
                    "spec refuses it with InvalidReference (it, or an extent of its dependency "
                    "closure, lies in a tombstoned pack)")
                return
            self._spec(A.retain, 0, e)
            return
        dead = self._recover(c, crash)
        roots = observe_catalog(self.sim).run_owners(RUN).get("app")
        if roots == self._extents(new) and not usable:
            self._known_bug_or_fail(e, restore, f"after an interrupted retain the catalog "
                                    f"retains {self.cfg.ename(e)}, which the spec refuses")
        elif roots == self._extents(new):
            self._spec(A.retain, 0, e, why="the catalog shows the new roots")
        elif roots != (self._extents(old) if old else None):
            self._fail(f"after an interrupted retain the app roots are {roots}")
        self._writer_crashes(dead)

    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.returned))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        STATS.step("release")
        c = self._client(data)
        had = bool(self.spec.storage.roots[0])
        self.trace.append(f"{c}: release app (spec roots {'non-empty' if had else 'empty'})")
        got, crash = self._run(c, data, lambda: self.stores[c].release("app"))
        if crash is None:
            if got is not had:
                self._fail(f"release('app') returned {got}, the owner "
                           f"{'exists' if had else 'does not exist'}")
            if had:
                self._spec(A.release, 0)
            return
        dead = self._recover(c, crash)
        if had and "app" not in observe_catalog(self.sim).run_owners(RUN):
            self._spec(A.release, 0)
        self._writer_crashes(dead)

    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.returned))
    @rule(data=st.data())
    def release_publications(self, data: st.DataObject) -> None:
        assert self.cfg is not None
        s = self.spec.storage
        cands = sorted(s.returned)
        staged_cands = sorted(s.returned & s.staged)
        if staged_cands and data.draw(st.integers(0, 3), label="a staged one?") != 0:
            cands = staged_cands  # mostly drop real staging (what lets collection work)
        if not cands:
            return
        STATS.step("release_publications")
        e = data.draw(st.sampled_from(cands), label="extent")
        c = self._client(data)
        staged = e in s.staged
        ref = self.refs[e]
        self.trace.append(f"{c}: release_publications {self.cfg.ename(e)} (spec: "
                          f"{'staged' if staged else 'not staged'})")
        n, crash = self._run(c, data, lambda: self.stores[c].release_publications([ref]))
        if crash is None:
            if n != int(staged):
                self._fail(f"release_publications returned {n}; spec staged={staged}")
            if staged:
                self._spec(A.release_publications, e)
            return
        dead = self._recover(c, crash)
        info = observe_catalog(self.sim).packs[ref.path]
        if staged and ref.offset in info.unstaged:
            self._spec(A.release_publications, e, why="the catalog shows it unstaged")
        self._writer_crashes(dead)

    # --- pins -------------------------------------------------------------------------------
    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.returned))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        assert self.cfg is not None
        s = self.spec.storage
        cands = sorted((r, e) for r in READERS for e in s.returned if (r, e) not in s.pins)
        if not cands:
            return
        STATS.step("pin")
        r, e = data.draw(st.sampled_from(cands), label="reader, extent")
        c = self._client(data)
        usable = A.usable(self.cfg, s, e)
        pin = self.stores[c].pin([self.refs[e]])
        self.trace.append(f"{c}: pin {r} {self.cfg.ename(e)} as {pin.owner[-8:]} (spec: "
                          f"{'ok' if usable else 'InvalidReference'})")
        try:
            _, crash = self._run(c, data, pin.__enter__)
        except InvalidReference as exc:
            STATS.invalid_reference_replies += 1
            if usable:
                self._fail(f"engine refused pin of usable {self.cfg.ename(e)}: {exc}")
            return
        def restore() -> None:
            self.stores[c].release(pin.owner)

        if crash is None:
            if not usable:
                self._known_bug_or_fail(
                    e, restore, f"engine accepted pin of {self.cfg.ename(e)} but the spec "
                    "refuses it with InvalidReference (it, or an extent of its dependency "
                    "closure, lies in a tombstoned pack)")
                return
            self._spec(A.pin, r, e)
            self.pins[(r, e)] = (pin, c, self.gen[c])
            return
        dead = self._recover(c, crash)
        if pin.owner in observe_catalog(self.sim).run_owners(RUN) and not usable:
            self._known_bug_or_fail(e, restore, f"after an interrupted pin the catalog pins "
                                    f"{self.cfg.ename(e)}, which the spec refuses")
        elif pin.owner in observe_catalog(self.sim).run_owners(RUN):
            self._spec(A.pin, r, e, why="the catalog shows the pin")
            self.pins[(r, e)] = (pin, c, -1)
        self._writer_crashes(dead)

    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.pins))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        assert self.cfg is not None
        cands = sorted(self.spec.storage.pins)
        if not cands:
            return
        STATS.step("unpin")
        r, e = data.draw(st.sampled_from(cands), label="reader, extent")
        pin, c, g = self.pins[(r, e)]
        if g == self.gen[c]:
            self.trace.append(f"{c}: unpin {r} {self.cfg.ename(e)} (exit the pin block)")
            _, crash = self._run(c, data, lambda: pin.__exit__(None, None, None))
        else:
            c = self._client(data)
            self.trace.append(f"{c}: release {pin.owner[-8:]} (pin of {r} on "
                              f"{self.cfg.ename(e)}, whose process died)")
            got, crash = self._run(c, data, lambda: self.stores[c].release(pin.owner))
            if crash is None and got is not True:
                self._fail(f"release of the pin owner {pin.owner} returned {got}")
        if crash is None:
            self._spec(A.unpin, r, e)
            del self.pins[(r, e)]
            return
        dead = self._recover(c, crash)
        if pin.owner not in observe_catalog(self.sim).run_owners(RUN):
            self._spec(A.unpin, r, e, why="the catalog no longer shows the pin")
            del self.pins[(r, e)]
        self._writer_crashes(dead)

    # --- collection -------------------------------------------------------------------------
    @precondition(lambda self: self.cfg is not None and bool(self.spec.storage.returned))
    @rule(data=st.data())
    def collect_garbage(self, data: st.DataObject) -> None:
        assert self.cfg is not None
        STATS.step("collect_garbage")
        c = self._client(data)
        s = self.spec.storage
        unfinished = {p for p in s.tombstones if s.packs[p] == PackStatus.SEALED}
        self.trace.append(f"{c}: collect_garbage")
        res, crash = self._run(c, data, self.stores[c].collect_garbage)
        if crash is None:
            self._spec(A.gc_lock)
            self._spec(A.gc_scan)
            plan = self.spec.collector.plan
            assert plan is not None
            got = {self._spec_pack(path) for path in res["tombstoned"]
                   if path not in self.phantoms}
            if not got <= plan:
                self._fail("collect_garbage tombstoned "
                           f"{sorted(self.cfg.packs[p] for p in got)}; the spec's scan plans "
                           f"only {sorted(self.cfg.packs[p] for p in plan)}")
            deferred = plan - got
            if deferred - self._open_pack_closure_packs():
                self._fail("collect_garbage left "
                           f"{sorted(self.cfg.packs[p] for p in deferred)} although the spec's "
                           "scan plans them and no extent of an open pack reaches them")
            if deferred:
                STATS.deferred += len(deferred)
                self.trace.append("    deferred (reached from an open pack): "
                                  f"{sorted(self.cfg.packs[p] for p in deferred)}")
            plan = got
            finished = {self._spec_pack(path) for path in res["finished_interrupted"]
                        if path not in self.phantoms}
            if not unfinished <= finished <= set(s.tombstones):
                self._fail(f"collect_garbage finished interrupted collections of "
                           f"{sorted(finished)}; spec: unfinished {sorted(unfinished)}")
            for p in sorted(plan):
                self._spec(A.gc_tombstone, p)
                STATS.tombstoned += 1
            for p in range(len(self.cfg.packs)):
                st_ = self.spec.storage
                if p in st_.tombstones and st_.packs[p] == PackStatus.SEALED:
                    self._spec(A.gc_unlink, p)
            self._spec(A.gc_unlock)
            return
        dead = self._recover(c, crash)
        cat = observe_catalog(self.sim)
        self._spec(A.gc_lock)
        self._spec(A.gc_scan)
        for p, path in sorted(self.pack_path.items()):
            if cat.is_tombstoned(path) and p not in self.spec.storage.tombstones:
                self._spec(A.gc_tombstone, p, why="the catalog shows its tombstone")
        for p, path in sorted(self.pack_path.items()):
            st_ = self.spec.storage
            if p in st_.tombstones and st_.packs[p] == PackStatus.SEALED and \
                    cat.packs[path].unlinked:
                self._spec(A.gc_unlink, p, why="the catalog records the unlink")
        self._spec(A.collector_crash)
        self._writer_crashes(dead)

    def _open_pack_closure_packs(self) -> set[int]:
        """Packs the spec reaches if, as the engine documents, every durable extent of an
        OPEN pack protects its dependencies until the pack is sealed (even after
        release_publications): the engine's only allowed deviation, a deferral."""
        assert self.cfg is not None
        cfg, s = self.cfg, self.spec.storage
        roots = set(A.protected_roots(s)) | {
            e for e, ext in enumerate(s.extents)
            if ext == ExtentStatus.DURABLE and s.packs[cfg.extents[e].pack] == PackStatus.OPEN}
        closure = A.dependency_closure(frozenset(roots), cfg.edges())
        return {cfg.extents[e].pack for e in closure} | {
            p for p, st_ in enumerate(s.packs) if st_ == PackStatus.OPEN}

    # --- the refinement check ---------------------------------------------------------------
    @invariant()
    def engine_maps_onto_spec(self) -> None:
        if self.cfg is None:
            return
        STATS.checks += 1
        cfg, s = self.cfg, self.spec.storage
        for iid in CHECKED_INVARIANTS:
            msg = STATE_INVARIANTS[iid](cfg, self.spec)
            if msg is not None:
                self._fail(f"spec invariant {iid} violated: {msg}")
        cat = observe_catalog(self.sim)
        files = set(self.sim.files())
        # packs: state, tombstone, file
        for p, status in enumerate(s.packs):
            path = self.pack_path.get(p)
            name = cfg.packs[p]
            if status == PackStatus.ABSENT:
                if path is not None:
                    self._fail(f"spec pack {name} is absent but bound to {path}")
                continue
            if path is None or path not in cat.packs:
                self._fail(f"spec pack {name} is {status.value}; the catalog has no pack "
                           f"{path}")
            assert path is not None
            info = cat.packs[path]
            if info.tombstoned != (p in s.tombstones):
                self._fail(f"pack {name} ({path}): catalog tombstoned={info.tombstoned}, "
                           f"spec {p in s.tombstones}")
            want = "open" if status == PackStatus.OPEN else "sealed"
            if info.state != want:
                self._fail(f"pack {name} ({path}) is {info.state} in the catalog, spec "
                           f"{status.value}")
            if info.unlinked != (status == PackStatus.UNLINKED):
                self._fail(f"pack {name} ({path}): catalog unlinked={info.unlinked}, spec "
                           f"{status.value}")
            exists = os.path.join(ROOT, path) in files
            if exists and status == PackStatus.UNLINKED:
                self._fail(f"pack {name} ({path}) is unlinked in the spec and the catalog, but "
                           "its file exists")
            if not exists and p not in s.tombstones:
                self._fail(f"pack {name} ({path}) has no tombstone, but its file is gone")
        known = set(self.pack_path.values()) | self.phantoms
        stray = sorted(set(cat.packs) - known)
        if stray:
            self._fail(f"catalog packs bound to no spec pack: {stray}")
        # owners and their roots
        want_owners: dict[str, frozenset[Extent]] = {}
        if s.roots[0]:
            want_owners["app"] = self._extents(s.roots[0])
        for r, e in s.pins:
            want_owners[self.pins[(r, e)][0].owner] = self._extents({e})
        if cat.run_owners(RUN) != want_owners:
            self._fail(f"catalog owners {cat.run_owners(RUN)}; spec {want_owners}")
        # staging and liveness
        for e, ext in enumerate(s.extents):
            if ext != ExtentStatus.DURABLE or cfg.extents[e].pack in s.tombstones:
                continue
            ref = self.refs[e]
            info = cat.packs[ref.path]
            if info.state == "open":
                continue  # the engine counts every extent of an open pack as staged
            staged = ref.offset in info.offsets and ref.offset not in info.unstaged
            if staged != (e in s.staged):
                self._fail(f"{cfg.ename(e)}: catalog staged={staged}, spec "
                           f"{e in s.staged}")
        reach = A.reachable(cfg, s)
        live = cat.live_packs()
        lenient = self._open_pack_closure_packs()
        for p, path in self.pack_path.items():
            if A.pack_dead(s, p):
                continue
            spec_live = s.packs[p] == PackStatus.OPEN or any(
                cfg.extents[e].pack == p for e in reach)
            if spec_live and path not in live:
                self._fail(f"pack {cfg.packs[p]} ({path}) is reachable in the spec but not "
                           "live in the catalog")
            if path in live and not spec_live and p not in lenient:
                self._fail(f"pack {cfg.packs[p]} ({path}) is live in the catalog but the spec "
                           "reaches nothing in it (not even from an open pack)")
        # reads through a third client
        with self.reader.read_session() as rs:
            for e in sorted(s.returned):
                ref = self.refs[e]
                if s.packs[cfg.extents[e].pack] == PackStatus.UNLINKED:
                    try:
                        rs.read(ref)
                    except InvalidReference:
                        continue
                    self._fail(f"{cfg.ename(e)} in reclaimed pack {ref.path} still reads")
                try:
                    got = list(rs.read(ref))
                except InvalidReference:
                    if cfg.extents[e].pack in s.tombstones:
                        continue  # tombstoned, its unlink not recorded yet: may be gone
                    raise
                if got != self.records[e]:
                    self._fail(f"{cfg.ename(e)} ({ref}) reads back as {got}, published "
                               f"{self.records[e]}")


TestRetentionConformance = RetentionConformance.TestCase
TestRetentionConformance.settings = PROFILES[os.environ.get("STRAW_HYPOTHESIS_PROFILE", "ci")]


@pytest.fixture(autouse=True, scope="module")
def _report_steps(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    yield
    text = STATS.summary()
    print("\n" + text)
    (tmp_path_factory.getbasetemp() / "conformance-steps.txt").write_text(text + "\n")


def test_retain_refuses_a_reference_whose_dependency_was_reclaimed() -> None:
    """The minimised counterexample of the (fixed) "retain-ignores-dependency-tombstone" bug:
    y (pack P1, kept alive by x) depends on a (pack P0); nothing protects y or a, so a
    collection reclaims P0.  The spec refuses to retain or pin y (``spec.actions.usable``:
    an extent of its dependency closure lies in a tombstoned pack, D4); the engine accepts."""
    sim = SimFS(0)
    c0, c1 = open_store(sim, "c0"), open_store(sim, "c1")
    a = c0.publish([Record("a", b"A")], submission_id="a")
    c0.seal()
    x = c1.publish([Record("x", b"X")], submission_id="x")
    y = c1.publish([Record("y", b"Y")], submission_id="y", dependencies=[a])
    c1.seal()
    c1.retain("app", [x])
    assert c0.release_publications([a, x, y]) == 3
    assert c0.collect_garbage()["tombstoned"] == [a.path]
    with pytest.raises(InvalidReference):
        c1.retain("app", [x, y])
    with pytest.raises(InvalidReference), c1.pin([y]):
        pass
