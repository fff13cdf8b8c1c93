"""The checkpoint crash campaign (``python -m fault_injection.checkpoint_campaign``).

Role: verification layer 6 for ``straw.rollout``'s checkpoints. A small rollout job (a
controller, a builder, a generation worker completing groups;
``fault_injection.checkpoint_job``) runs on SimFS; a probe run counts the mutating
filesystem ops of the operation under test, then every one of them is a crash point,
*before* and *after* it (plus the completed run), each under every mode:
``power/<variant>/<k>`` (power loss: SimFS keeps what was synced,
``clear-cache``/``torn-seq``/``torn-op``) and ``kill`` (SIGKILL of the process: the page
cache survives).  Workloads:

* ``save-eager`` / ``save-lazy``: a job that trained batch 0, saved step 0 and accepted
  two more groups saves step 1 (the model's files, ``queue_state_1``/``builder_state_1``,
  the retention under the checkpoint's owner, the registration on the source queue,
  the commit marker, the trackers, ``current.json``, the release of step 0's
  registration).  The save writes its state files on a thread while the main thread
  retains and registers; the campaign makes that schedule deterministic (so that every
  op is a crash point and a key replays exactly): ``eager`` writes the files first,
  ``lazy`` after retention and registration -- the two orders the thread allows.
* ``restore-salvage``: the job above, killed after step 1 and two more accepted groups
  (power loss: only what was synced survives), restarted without arguments: a salvage
  of step 1 (resolution, the save lock, ``branch.json``, tracker and ``current.json``,
  the dead queue reopened, the isolated queue retained and seeded, ``seeded.json``, the
  builder's restored state).
* ``restore-exact``: the same dead job rolled back to step 0 (``load=save, step=0``).

The checks after each crash (``Violation``):

* **RL9** (a marker implies every component durable): every ``committed_<k>.json`` that
  survived validates (``load_marker``: each component present, same size and sha256,
  optimizer/RNG state), its owner retains every payload its state files name, and its
  registration is on the source queue;
* **old or new, never a mix**: automatic resolution selects step 0 or 1 and the job it
  starts holds exactly what a start from that checkpoint without a crash holds (its
  *content*: the builder's backlog in selection order with each group's payload read
  back, the mix state, the pending prompt tasks, the dataset cursor);
* a restore after the crash **either never started or is complete**: an automatic
  restart starts a job with the content of the source run's resume (never started) or of
  the restore (complete) -- nothing in between; and it is **restartable**: running the
  same restore again succeeds and yields the restore's content, and a clean restart then
  recovers that same content (after a garbage collection, every payload reads back);
* **RL6** (a fork never changes its source): the source queue's logical state (commit
  log, pending tasks, dataset cursor, checkpoint registrations) is what it was before
  the restore, before and after the restarts; an exact restore leaves the source
  queue's files and the checkpoint's files byte for byte as they were.

Each state runs on a fresh ``SimFS`` seeded from its key, so ``--replay KEY`` reruns it.
The negative controls (``CONTROLS``, ``fault_injection.checkpoint_controls``) break one
ordering each through a patch and must be caught, each by the check it breaks: the save's
state files, or the model's files, named by a marker without being fsynced first (a
marker before its components are durable), the retention after the marker, and a restore
that records its branch as seeded before the builder's restored state is durable (the bug
this campaign found).
Exit status 1 on any violation or missed control.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fault_injection.checkpoint_controls import CONTROLS as CONTROLS
from fault_injection.checkpoint_controls import model_unsynced as model_unsynced
from fault_injection.checkpoint_controls import retain_after_marker as retain_after_marker
from fault_injection.checkpoint_controls import seeded_before_builder as seeded_before_builder
from fault_injection.checkpoint_controls import states_unsynced as states_unsynced
from fault_injection.checkpoint_job import BATCH as BATCH
from fault_injection.checkpoint_job import CONFIG as CONFIG
from fault_injection.checkpoint_job import PROMPTS as PROMPTS
from fault_injection.checkpoint_job import ROOT as ROOT
from fault_injection.checkpoint_job import RUN as RUN
from fault_injection.checkpoint_job import SAVE as SAVE
from fault_injection.checkpoint_job import accept_two as accept_two
from fault_injection.checkpoint_job import close_job as close_job
from fault_injection.checkpoint_job import content as content
from fault_injection.checkpoint_job import payload as payload
from fault_injection.checkpoint_job import run_prefix as run_prefix
from fault_injection.checkpoint_job import save_model as save_model
from fault_injection.checkpoint_job import schedule as schedule
from fault_injection.checkpoint_job import sim_store as sim_store
from fault_injection.checkpoint_job import source_files as source_files
from fault_injection.checkpoint_job import source_queue as source_queue
from fault_injection.checkpoint_job import source_view as source_view
from fault_injection.checkpoint_job import start as start
from fault_injection.checkpoint_job import started_content as started_content
from fault_injection.checkpoint_job import without_ids as without_ids
from fault_injection.queue_campaign import crash_in
from fault_injection.rules import MUTATING_OPS, SimulatedCrash, TraceEntry
from fault_injection.simfs import SimFS
from fault_injection.simstate import SimState
from fault_injection.sweep import (
    WorkloadReport,
    campaign_main,
    crash_points,
    run_all,
    state_seed,
    sweep,
)
from straw.catalog import Catalog
from straw.clock import ManualClock
from straw.refs import RecordSetRef
from straw.rollout import checkpoint as checkpoint_mod
from straw.rollout.builder import Accepted
from straw.rollout.checkpoint_files import committed_steps, read_json, rollout_file
from straw.rollout.resolve import Resolution, load_marker, resolve_checkpoint

FULL_MODES: tuple[str, ...] = (
    "power/clear-cache/0", "power/torn-seq/0", "power/torn-op/0", "kill",
)  # fmt: skip
"""Modes per crash point for ``just crash``."""

QUICK_MODES: tuple[str, ...] = ("power/clear-cache/0", "power/torn-op/0", "kill")
"""Modes per crash point for the bounded test-suite campaign."""

WORKLOADS = ("save-eager", "save-lazy", "restore-salvage", "restore-exact")


class Violation(Exception):
    """A checkpoint broke RL6, RL9 or old-or-new selection."""


def _diff(got: Any, want: Any) -> str:
    for k in sorted(set(got) | set(want)):
        if got.get(k) != want.get(k):
            return (f"{k}: got {json.dumps(got.get(k))[:300]}, expected "
                    f"{json.dumps(want.get(k))[:300]}")
    return "equal"


# --- RL9 -------------------------------------------------------------------------------------

def _refs_of(states: Sequence[Any]) -> list[RecordSetRef]:
    q, b = states
    refs = [RecordSetRef.from_dict(t["input_ref"]) for t in q["tasks"] if t["input_ref"]]
    refs += [e.ref for e in checkpoint_mod.saved_backlog(b)]  # its form: its version's
    refs += [Accepted.from_dict(g).ref for p in b["planned"] for g in p["groups"]]
    return refs


def check_markers(sim: SimFS) -> None:
    """RL9: every surviving marker validates, its owner retains every payload its state
    files name, and its registration is on its queue (or superseded by a later one)."""
    steps = committed_steps(sim, SAVE)
    if not steps:
        raise Violation(f"no commit marker in {SAVE}: step 0 was committed before the crash")
    cat = Catalog(sim.client("checker"), ROOT)
    try:
        with cat.locked() as st:
            owners = st.run_owners(RUN)
    finally:
        cat.close()
    for k in steps:
        try:
            marker = load_marker(sim, SAVE, k)
        except Exception as e:  # noqa: BLE001 - any refusal of a committed marker
            raise Violation(f"RL9: committed_{k}.json survived but does not validate: "
                            f"{type(e).__name__}: {e}") from None
        states = [read_json(sim, rollout_file(SAVE, kind, k), kind)
                  for kind in ("queue_state", "builder_state")]
        roots = owners.get(marker["owner"])
        missing = [r for r in _refs_of(states)
                   if roots is None or (r.path, r.offset) not in roots]
        if missing:
            raise Violation(f"RL9: committed_{k}.json names payloads its owner "
                            f"{marker['owner']!r} does not retain: {missing[:2]}")
        if k == steps[-1]:  # a later checkpoint releases the earlier registrations
            registered = source_view(sim, dict(marker["queue"]))["checkpoints"]
            if marker["registration"] not in registered:
                raise Violation(f"RL9: committed_{k}.json's registration "
                                f"{marker['registration']!r} is not on the source queue "
                                f"(registered: {registered})")


# --- the states -------------------------------------------------------------------------------

def _apply_mode(sim: SimFS, mode: str) -> None:
    parts = mode.split("/")
    if parts[0] == "power":
        sim.crash(parts[1])
    elif parts[0] == "kill":
        sim.kill_client("main")
    else:
        raise ValueError(f"unknown mode {mode!r}")


def clone(sim: SimFS, seed: int) -> SimFS:
    """A new SimFS holding ``sim``'s current state (its page cache too; no handles)."""
    out = SimFS(seed)
    for f in sim.state.dirty.values():  # every file with unsynced data ops
        # memoryviews do not copy; the same bytes do
        f.pending = [(s, k, a, bytes(d)) for s, k, a, d in f.pending]
    out.state = copy.deepcopy(sim.state)
    return out


def _expect(got: dict[str, Any], allowed: dict[str, dict[str, Any]], what: str) -> str:
    for name, want in allowed.items():
        if got == want:
            return name
    diffs = "; ".join(f"vs {name}: {_diff(got, want)}" for name, want in allowed.items())
    raise Violation(f"{what} holds neither {' nor '.join(allowed)}: {diffs}")


@dataclass
class Base:
    """What a workload's checks compare with, computed once (no crash)."""

    state: SimState | None = None  # the dead job's durable state (restore workloads)
    queue: dict[str, str] = field(default_factory=dict)
    view: dict[str, Any] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    refs: dict[str, dict[str, Any]] = field(default_factory=dict)


_BASES: dict[str, Base] = {}


def _restore_resolution(workload: str, sim: SimFS) -> Resolution:
    if workload == "restore-exact":
        return resolve_checkpoint(SAVE, SAVE, 0, fs=sim)
    return resolve_checkpoint(SAVE, fs=sim)


def _dead_job() -> SimFS:
    """The job of the save workloads, saved at step 1, two more groups accepted, then a
    power loss (only what was synced survives)."""
    sim = SimFS(0, record_trace=False)
    clock = ManualClock()
    with schedule("eager"):
        store, job = run_prefix(sim, clock)
        job.save(1, save_model(sim))
    accept_two(sim, clock, job, "c")
    sim.crash("clear-cache")
    return sim


def _from(state: SimState, seed: int, record_trace: bool = True) -> SimFS:
    sim = SimFS(seed, record_trace=record_trace)
    sim.state = copy.deepcopy(state)
    return sim


def base(workload: str) -> Base:
    """The workload's references (cached per process; pure functions of the workload)."""
    if workload in _BASES:
        return _BASES[workload]
    b = Base()
    if workload.startswith("save-"):
        with schedule(workload.removeprefix("save-")):
            for step, complete in ((0, False), (1, True)):
                sim = SimFS(0, record_trace=False)
                store, job = run_prefix(sim, ManualClock())
                if complete:
                    job.save(1, save_model(sim))
                close_job(store, job)
                sim.crash("clear-cache")
                b.refs[str(step)] = without_ids(started_content(sim))
    else:
        dead = _dead_job()
        b.state = dead.state
        b.queue = source_queue(dead)
        probe = _from(dead.state, 0, record_trace=False)
        b.files = source_files(probe, b.queue)
        b.view = source_view(probe, b.queue)
        b.refs["never started"] = started_content(_from(dead.state, 0, record_trace=False))
        sim = _from(dead.state, 0, record_trace=False)
        b.refs["restored"] = started_content(sim, _restore_resolution(workload, sim))
    _BASES[workload] = b
    return b


def probe(workload: str) -> list[TraceEntry]:
    """The mutating ops of the operation under test, in a run without a crash (under
    whatever control is active)."""
    b = base(workload)
    if workload.startswith("save-"):
        with schedule(workload.removeprefix("save-")):
            sim = SimFS(0)
            store, job = run_prefix(sim, ManualClock())
            n0 = len(sim.trace)
            job.save(1, save_model(sim))
            ops = [e for e in sim.trace[n0:] if e.op in MUTATING_OPS]
            close_job(store, job)
            return ops
    assert b.state is not None
    sim = _from(b.state, 0)
    store, job = start(sim, ManualClock(), _restore_resolution(workload, sim))
    close_job(store, job)
    return [e for e in sim.trace if e.op in MUTATING_OPS]


def operation_ops(workload: str) -> int:
    return len(probe(workload))


def _crashing(fn: Callable[[], None]) -> None:
    """Run ``fn``; a simulated crash (or an error it caused) ends it."""
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - only a simulated crash is expected
        if crash_in(e) is None:
            raise


def run_save_state(workload: str, nth: int | None, when: str, mode: str, key: str) -> None:
    b = base(workload)
    sim = SimFS(state_seed(key), record_trace=False)
    clock = ManualClock()
    with schedule(workload.removeprefix("save-")):
        store, job = run_prefix(sim, clock)
        if nth is not None:  # counts the matching calls from here on: the save's
            sim.crash_at(nth, ops=MUTATING_OPS, when=when)

        def save() -> None:
            job.save(1, save_model(sim))
            close_job(store, job)
        _crashing(save)
        _apply_mode(sim, mode)
        check_markers(sim)
        r = resolve_checkpoint(SAVE, fs=sim)
        if r.step not in (0, 1):
            raise Violation(f"resolution after the crash selects step {r.step}, neither the "
                            "old (0) nor the new (1) checkpoint")
        got = started_content(sim, r)
        if without_ids(got) != b.refs[str(r.step)]:
            raise Violation(f"the job resumed from step {r.step} ({r.mode}) differs from a "
                            f"resume of that checkpoint without a crash: "
                            f"{_diff(without_ids(got), b.refs[str(r.step)])}")
        check_markers(sim)
        again = started_content(sim)  # a clean restart recovers the same content
        if again != got:
            raise Violation(f"a clean restart after the resume changed its content: "
                            f"{_diff(again, got)}")


def run_restore_state(workload: str, nth: int | None, when: str, mode: str, key: str
                      ) -> None:
    b = base(workload)
    assert b.state is not None
    sim = _from(b.state, state_seed(key), record_trace=False)
    if nth is not None:
        sim.crash_at(nth, ops=MUTATING_OPS, when=when)

    def restore() -> None:
        store, job = start(sim, ManualClock(), _restore_resolution(workload, sim))
        close_job(store, job)
    _crashing(restore)
    _apply_mode(sim, mode)
    rerun = clone(sim, state_seed(key) + 1)
    _check_source(sim, b, workload, "after the crash", files=True)
    # an automatic restart: the restore never started, or it is complete
    got = started_content(sim)
    _expect(got, b.refs, "an automatic restart after the crash")
    _check_source(sim, b, workload, "after an automatic restart", files=False)
    # running the same restore again succeeds, with the restore's content
    again = started_content(rerun, _restore_resolution(workload, rerun))
    if again != b.refs["restored"]:
        raise Violation(f"running the restore again after the crash yields other content: "
                        f"{_diff(again, b.refs['restored'])}")
    # and it is durable: a clean restart recovers it, with its payloads kept
    clock = ManualClock()
    store, job = start(rerun, clock)
    try:
        store.collect_garbage()
        later = content(store, job)
    finally:
        close_job(store, job)
    if later != b.refs["restored"]:
        raise Violation(f"a clean restart after the restore (and a collection) holds other "
                        f"content: {_diff(later, b.refs['restored'])}")
    _check_source(rerun, b, workload, "after the restore was run again", files=True)


def _check_source(sim: SimFS, b: Base, workload: str, when: str, *, files: bool) -> None:
    """RL6: the source queue's logical state is unchanged; an exact restore leaves its
    files (and the checkpoints') byte for byte (``files``: compared before anything
    recovered the source queue, which writes its epoch)."""
    if files and workload == "restore-exact":
        now = source_files(sim, b.queue)
        changed = sorted(p for p in set(now) | set(b.files) if now.get(p) != b.files.get(p))
        if changed:
            raise Violation(f"RL6: an exact restore changed its source {when}: {changed[:4]}")
    view = source_view(sim, b.queue)
    if view != b.view:
        raise Violation(f"RL6: the source queue's state changed {when}: {_diff(view, b.view)}")


def run_state(workload: str, nth: int | None, when: str, mode: str, key: str
              ) -> str | None:
    """One crash state; a violation report or None."""
    try:
        if workload.startswith("save-"):
            run_save_state(workload, nth, when, mode, key)
        else:
            run_restore_state(workload, nth, when, mode, key)
    except (Violation, Exception, SimulatedCrash) as e:
        kind = "violation" if isinstance(e, Violation) else f"raised {type(e).__name__}"
        tb = "" if isinstance(e, Violation) else "\n" + "".join(
            traceback.format_exception(type(e), e, e.__traceback__, limit=-4))
        return (f"[{key}] {kind}: {e}{tb}\n  replay: python -m "
                f"fault_injection.checkpoint_campaign --replay {key}")
    return None


def run_workload(workload: str, modes: Sequence[str], *, max_points: int | None = None,
                 stop_at_first: bool = False) -> WorkloadReport:
    points = crash_points(operation_ops(workload), max_points)
    return sweep(workload, workload, points, modes,
                 lambda nth, when, mode, key: run_state(workload, nth, when, mode, key),
                 stop_at_first=stop_at_first)


def run_checkpoint_campaign(modes: Sequence[str], *, only: Sequence[str] | None = None,
                            max_points: int | None = None, stop_at_first: bool = False,
                            log: Callable[[str], None] = print) -> list[WorkloadReport]:
    return run_all(WORKLOADS, lambda w: run_workload(w, modes, max_points=max_points,
                                                     stop_at_first=stop_at_first),
                   only=only, stop_at_first=stop_at_first, log=log)


def replay(key: str) -> str | None:
    workload, nth, when, mode = key.split(":", 3)
    return run_state(workload, None if nth == "end" else int(nth), when, mode, key)


# --- negative controls -------------------------------------------------------------------------

def run_control(name: str, modes: Sequence[str] = QUICK_MODES,
                max_points: int | None = None,
                points: Sequence[tuple[int | None, str]] | None = None) -> str | None:
    """The first state in which control ``name`` shows a violation the unpatched engine
    does not show (None: MISSED); ``points``: these crash points only."""
    control, workloads, says = CONTROLS[name]
    for w in workloads:
        for nth, when in points if points is not None else crash_points(operation_ops(w),
                                                                        max_points):
            for mode in modes:
                key = f"{w}:{nth if nth is not None else 'end'}:{when}:{mode}"
                with control():
                    msg = run_state(w, nth, when, mode, key)
                if msg is not None and says in msg.splitlines()[0] and \
                        run_state(w, nth, when, mode, key) is None:
                    return msg
    return None


def run_controls(modes: Sequence[str] = QUICK_MODES, *, max_points: int | None = None,
                 log: Callable[[str], None] = print) -> dict[str, str | None]:
    out = {}
    for name in CONTROLS:
        found = run_control(name, modes, max_points)
        out[name] = found
        log(f"  {'caught' if found else 'MISSED':<7} {name:<24} "
            f"{found.splitlines()[0][:110] if found else ''}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    return campaign_main(argv, prog="fault_injection.checkpoint_campaign", doc=__doc__,
                         title="checkpoint", full_modes=FULL_MODES, quick_modes=QUICK_MODES,
                         run_campaign=run_checkpoint_campaign, run_controls=run_controls,
                         replay=replay)


if __name__ == "__main__":
    sys.exit(main())
