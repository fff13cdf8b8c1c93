"""The rollout layer's specification (spec/rollout.py): the correct protocol has no
counterexample on the small bounds, every mutant is caught by the invariant it breaks, and the
counterexamples are the stories the mutants tell."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from model.explore import ROLLOUT, explore, hunt_mutant, main
from spec import rollout
from spec.actions import Action

SMALL = rollout.CONFIG_SETS["small"]

# The invariant each mutant must break (its comment in RolloutMutants names it).
EXPECTED = {
    "cursor_saved_apart": "RL1",
    "failed_refill_moves_cursor": "RL1",
    "refill_retry_new_request": "RL1",
    "completion_not_idempotent": "RL2",
    "replan_ignores_planned": "RL2",
    "hooks_before_plan": "RL3",
    "ack_before_training": "RL4",
    "expiry_restarts_from_prompt": "RL5",
    "fork_writes_source": "RL6",
    "fork_keeps_checkpoint_retention": "RL7",
    "ack_ignores_checkpoint_floor": "RL7",
    "checkpoint_retained_at_commit": "RL7",
    "salvage_boundary_inclusive": "RL8",
    "salvage_keeps_dead_markers": "RL8",
    "salvage_restarts_partial": "RL5",
    "marker_before_components_durable": "RL9",
    "resume_follows_tracker": "RL10",
    "lost_current_starts_new": "RL10",
    "ready_replay_ignores_plan": "RL11",
    "admits_only_empty_backlog": "RL12",
}


def test_every_mutant_has_an_expected_invariant() -> None:
    assert set(EXPECTED) == set(rollout.MUTANT_NAMES)


@pytest.mark.parametrize("name", SMALL)
def test_correct_protocol_has_no_counterexample(name: str) -> None:
    cfg = rollout.CONFIGS[name]
    res = explore(cfg, machine=ROLLOUT)
    assert res.violation is None, res.violation.render()
    assert res.states > 1000 and res.transitions > res.states
    assert res.liveness_checked == (["RL12"] if cfg.mix else [])


@pytest.mark.parametrize("name", rollout.MUTANT_NAMES)
def test_every_mutant_is_caught_by_its_invariant(name: str) -> None:
    _, res = hunt_mutant(name, SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None, f"mutant {name} survived"
    assert res.violation.iid == EXPECTED[name], res.violation.render()


def test_failed_refill_counterexample_is_the_story() -> None:
    _, res = hunt_mutant("failed_refill_moves_cursor", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = [(a.name, a.reply) for a in res.violation.trace]
    assert ("controller_publish", "failed") in names
    assert names[-1] == ("controller_submit", "ok")
    assert "positions [0]" in res.violation.message


def _names(trace: list) -> list[str]:
    return [a.name for a in trace]


def test_checkpoint_counterexamples_are_the_stories() -> None:
    # RL6: the fork itself writes into the run it restores from.
    _, res = hunt_mutant("fork_writes_source", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    assert _names(res.violation.trace)[-3:] == ["ckpt_commit", "crash_job", "fork"]
    assert "source run r0" in res.violation.message
    # RL7: the branch lives on the checkpoint's retention; releasing it loses a payload.
    _, res = hunt_mutant("fork_keeps_checkpoint_retention", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = _names(res.violation.trace)
    assert names.index("fork") < names.index("release") < len(names) - 1
    assert names[-1] == "collect" and "run r1" in res.violation.message
    # RL7: a group acknowledged after the last checkpoint is collected; salvage needs it.
    _, res = hunt_mutant("ack_ignores_checkpoint_floor", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    assert _names(res.violation.trace)[-2:] == ["builder_ack", "collect"]
    # RL7: retention taken at the marker: the snapshot's partial input went in between.
    _, res = hunt_mutant("checkpoint_retained_at_commit", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = _names(res.violation.trace)
    assert names.index("ckpt_capture") < names.index("collect") < names.index("ckpt_commit")
    assert "checkpoint r0.k1" in res.violation.message
    # RL8: the boundary and the dead run's markers, each at the salvage step.
    for name, before in (("salvage_boundary_inclusive", "builder_plan"),
                         ("salvage_keeps_dead_markers", "builder_ack")):
        _, res = hunt_mutant(name, SMALL, machine=ROLLOUT)
        assert res is not None and res.violation is not None
        names = _names(res.violation.trace)
        assert names[-2:] == ["crash_job", "salvage"] and before in names, name
        assert "missing from the restore: t0" in res.violation.message
    # RL5 across a salvage: a partial group made durable is not dropped for its prompt.
    _, res = hunt_mutant("salvage_restarts_partial", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = _names(res.violation.trace)
    assert names[-1] == "salvage" and "worker_yield_partial" in names
    # RL9: the marker over components that are only written: caught at the marker.
    _, res = hunt_mutant("marker_before_components_durable", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    assert _names(res.violation.trace)[-4:] == ["ckpt_write"] * 3 + ["ckpt_commit"]


def _walk(cfg: rollout.RolloutConfig, mut: rollout.RolloutMutants, names: list[str]
          ) -> rollout.State:
    """The state after taking, in order, the first successful action of each name."""
    s = rollout.initial_state(cfg)
    for name in names:
        s = next(s2 for a, s2 in rollout.successors(cfg, mut, s)
                 if a.name == name and a.reply == "ok")
    return s


# One batch of rollout-ckpt: a refill, its group generated and accepted, planned, trained.
BATCH = ["controller_read", "controller_publish", "controller_submit", "worker_take",
         "worker_generate", "worker_generate", "worker_complete", "builder_select",
         "builder_plan", "builder_hooks", "builder_ready", "trainer_finish"]


def test_resume_counterexamples_are_the_stories() -> None:
    # RL10, shortest: the first save wrote its model (and the framework's tracker), then
    # the job died before the marker; the resume starts empty from that step.
    _, res = hunt_mutant("resume_follows_tracker", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = _names(res.violation.trace)
    assert names[-3:] == ["ckpt_write", "crash_job", "restart_empty"]
    assert "ckpt_commit" not in names and "started from step 0" in res.violation.message
    # RL10: current.json lost after a commit: a new run from offset 0.
    _, res = hunt_mutant("lost_current_starts_new", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = _names(res.violation.trace)
    assert names[-2:] == ["crash_job", "restart_new"] and "ckpt_commit" in names
    assert "checkpoint r0.k1 is committed" in res.violation.message


def test_a_save_interrupted_before_its_marker_is_never_resumed() -> None:
    # Step 1 committed; the save of step 2 wrote its model and tracker, and the job died
    # before its marker.  The correct resume is a salvage from step 1; the mutant follows
    # the tracker to step 2 with an empty queue from dataset offset 0.
    cfg = rollout.CONFIGS["rollout-ckpt"]
    ckpt = ["ckpt_capture", "ckpt_write", "ckpt_write", "ckpt_write", "ckpt_commit"]
    path = ["controller_start", *BATCH, *ckpt, *BATCH, "ckpt_capture", "ckpt_write",
            "crash_job"]
    for mut in (rollout.CORRECT, rollout.mutant("resume_follows_tracker")):
        down = _walk(cfg, mut, path)
        assert down.down and [(c.step, c.committed) for c in down.ckpts] == [(1, True),
                                                                            (2, False)]
        assert rollout._tracker(down) == 2 and rollout._target(cfg, down) == 1
        starts = {a.name: (a, s2) for a, s2 in rollout.successors(cfg, mut, down)
                  if a.name != "collect"}
        if mut == rollout.CORRECT:
            assert set(starts) == {"fork", "salvage"}
            a, s2 = starts["salvage"]
            assert s2.base == 1 and s2.cursor == 2
            assert rollout.check_step(cfg, down, a, s2) is None
        else:
            assert set(starts) == {"fork", "restart_empty"}
            a, s2 = starts["restart_empty"]
            assert (s2.base, s2.cursor, s2.tasks) == (2, 0, ())
            bad = rollout.check_step(cfg, down, a, s2)
            assert bad is not None and bad[0] == "RL10", bad
            assert "from step 2" in bad[1] and "newest commit is step 1" in bad[1]


def test_layout_and_mix_counterexamples_are_the_stories() -> None:
    # RL11: a ready batch trained from a builder restarted with another layout.
    _, res = hunt_mutant("ready_replay_ignores_plan", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    names = _names(res.violation.trace)
    assert names[-3:] == ["builder_ready", "builder_restart", "trainer_finish"]
    assert "planned under layout 0" in res.violation.message
    # RL12: one group of a quota of 2 accepted, and no fair path admits another.
    _, res = hunt_mutant("admits_only_empty_backlog", SMALL, machine=ROLLOUT)
    assert res is not None and res.violation is not None
    assert _names(res.violation.trace)[-1] == "worker_complete"
    assert _names(res.violation.trace).count("controller_submit") == 1


def _explore(cname: str) -> Iterator[tuple[rollout.State, Action, rollout.State]]:
    """Every transition of the correct protocol in cname."""
    cfg = rollout.CONFIGS[cname]
    frontier = [rollout.initial_state(cfg)]
    visited = set(frontier)
    while frontier:
        s = frontier.pop()
        for a, s2 in rollout.successors(cfg, rollout.CORRECT, s):
            yield s, a, s2
            if s2 not in visited:
                visited.add(s2)
                frontier.append(s2)


def test_layout_bounds_reach_every_refusal_and_its_remedy() -> None:
    cfg = rollout.CONFIGS["rollout-layout"]
    cases: set[str] = set()
    for s, a, s2 in _explore("rollout-layout"):
        names = {x.name for x, _ in rollout.successors(cfg, rollout.CORRECT, s2)}
        if s2.ready < len(s2.plans) and s2.plan_layouts[s2.ready] != s2.layout:
            assert not {"builder_hooks", "builder_ready"} & names
            cases.add("planned batch refused")
        if s2.trained < s2.ready and s2.plan_layouts[s2.trained] != s2.layout:
            assert "trainer_finish" not in names
            cases.add("ready batch refused")
        if a.name == "trainer_finish" and s.faults == 2 and s.layout == 0:
            cases.add("trained after a restart back to its plan's layout")
        if a.name == "builder_plan" and s.layout == 1:
            cases.add("planned under the other layout")
    assert cases == {"planned batch refused", "ready batch refused",
                     "trained after a restart back to its plan's layout",
                     "planned under the other layout"}, cases


def test_mix_bounds_reach_a_backlog_short_of_its_quota() -> None:
    cfg = rollout.CONFIGS["rollout-mix"]
    cases: set[str] = set()
    for s, a, s2 in _explore("rollout-mix"):
        if a.name == "controller_read" and 0 < rollout._backlog(s) < cfg.batch:
            cases.add("a backlog short of its quota admits fresh work")
        waiting = s2.memory_cursor is not None and s2.refill is None and all(
            t.status != rollout.PENDING for t in s2.tasks)
        if waiting and s2.memory_cursor < cfg.positions and rollout._backlog(s2) >= cfg.batch:
            names = {x.name for x, _ in rollout.successors(cfg, rollout.CORRECT, s2)}
            assert "controller_read" not in names
            cases.add("a backlog that fills its quota drains first")
    assert cases == {"a backlog short of its quota admits fresh work",
                     "a backlog that fills its quota drains first"}, cases


def test_a_job_crash_loses_what_is_not_durable() -> None:
    # Under the RL9 mutant a component is only written; the job's crash loses it (and the
    # save in progress), while a durable component of the correct protocol stays.
    cfg = rollout.CONFIGS["rollout-ckpt"]
    snap = rollout._run_of(rollout.initial_state(cfg))
    ckpt = rollout.Checkpoint(0, 1, snap, components=(rollout.DURABLE, rollout.WRITTEN,
                                                      rollout.ABSENT))
    s = rollout.State(holds=(None,), ckpts=(ckpt,), saving=0, memory_cursor=0)
    crashed = next(s2 for a, s2 in rollout.successors(cfg, rollout.CORRECT, s)
                   if a.name == "crash_job")
    assert crashed.down and crashed.saving is None and crashed.memory_cursor is None
    assert crashed.ckpts[0].components == (rollout.DURABLE, rollout.ABSENT, rollout.ABSENT)
    # a crashed job only collects or restores
    assert {a.name for a, _ in rollout.successors(cfg, rollout.CORRECT, crashed)} <= {
        "collect", "fork", "salvage"}


def _explore_actions(cname: str) -> tuple[set[str], set[str]]:
    """Every action the correct protocol takes in cname, and which hard cases it meets."""
    cfg = rollout.CONFIGS[cname]
    frontier = [rollout.initial_state(cfg)]
    visited = set(frontier)
    seen: set[str] = set()
    cases: set[str] = set()
    while frontier:
        s = frontier.pop()
        for a, s2 in rollout.successors(cfg, rollout.CORRECT, s):
            seen.add(a.name)
            if a.name == "fork":
                c = next(c for c in s.ckpts if c.name == a.args[0])
                trained = {i for plan in c.snap.plans[: c.step] for i in plan}
                if any(t.status == rollout.DONE and i not in trained
                       for i, t in enumerate(c.snap.tasks)):
                    cases.add("fork restores an untrained group")
                if any(t.status != rollout.DONE and t.progress > 0 for t in c.snap.tasks):
                    cases.add("fork restores a partial group")
            if a.name == "salvage":
                dead = rollout._run_of(s)
                if dead.acked > s2.trained:
                    cases.add("salvage after acknowledgements past the checkpoint")
                if len(dead.plans) > s2.trained:
                    cases.add("salvage replays planned batches")
            if a.name == "release":
                own = any(c.name == a.args[0] and c.run == s.run_id for c in s.ckpts)
                cases.add("release superseded" if own else "release an earlier run's")
            if a.name == "collect" and not a.args[0].endswith(f"/r{s.run_id}"):
                cases.add("collect a shared payload")
            if s2 not in visited:
                visited.add(s2)
                frontier.append(s2)
    return seen, cases


def test_checkpoint_bounds_reach_every_hard_case() -> None:
    seen, cases = _explore_actions("rollout-ckpt")
    assert {"ckpt_capture", "ckpt_write", "ckpt_commit", "release", "crash_job", "fork",
            "salvage", "collect", "trainer_finish", "worker_yield_partial"} <= seen
    assert not {"restart_empty", "restart_new"} & seen  # RL10's mutants' steps only
    assert cases == {"fork restores an untrained group", "fork restores a partial group",
                     "salvage after acknowledgements past the checkpoint",
                     "salvage replays planned batches", "release superseded",
                     "release an earlier run's", "collect a shared payload"}, cases


def test_every_action_of_the_layer_is_reachable() -> None:
    # A spec whose actions never fire proves nothing: the small and fault bounds together
    # take every action the correct protocol has.
    seen: set[str] = set()
    for cname in ("rollout-small", "rollout-faults"):
        cfg = rollout.CONFIGS[cname]
        frontier = [rollout.initial_state(cfg)]
        visited = set(frontier)
        while frontier:
            s = frontier.pop()
            for a, s2 in rollout.successors(cfg, rollout.CORRECT, s):
                seen.add(a.name)
                if s2 not in visited:
                    visited.add(s2)
                    frontier.append(s2)
    expected = {"controller_start", "controller_read", "controller_publish", "controller_submit",
                "controller_submit_retry", "worker_take", "worker_generate",
                "worker_yield_partial", "worker_complete", "worker_complete_retry",
                "worker_drop_stale", "builder_select", "builder_plan", "builder_hooks",
                "builder_ready", "trainer_finish", "builder_ack", "collect",
                "crash_controller", "crash_worker", "expire", "crash_builder"}
    assert expected <= seen, sorted(expected - seen)


def test_cli_runs_the_rollout_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--machine", "rollout", "--config", "small", "--mutants", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "rollout-small" in out and "rollout-ckpt" in out and "20/20 mutants caught" in out
    assert "rollout-mix" in out and "liveness=RL12" in out


def test_spec_document_names_every_rollout_id_action_and_mutant() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "spec" / "SPEC.md").read_text()
    section = text[text.index("## 9. The rollout layer"):]
    for iid in rollout.ALL_IDS:
        assert f"**{iid}**" in section, iid
    for name in rollout.MUTANT_NAMES:
        assert f"`{name}`" in section, name
    for action in ("controller_submit", "worker_yield_partial", "builder_plan", "builder_hooks",
                   "builder_ack", "trainer_finish", "crash_builder", "expire", "ckpt_capture",
                   "ckpt_write", "ckpt_commit", "release", "crash_job", "fork", "salvage",
                   "collect", "controller_read", "builder_restart", "restart_empty",
                   "restart_new"):
        assert f"`{action}`" in section, action
