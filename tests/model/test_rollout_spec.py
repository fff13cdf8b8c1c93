"""The rollout layer's specification (spec/rollout.py): the correct protocol has no
counterexample on the small bounds, every mutant is caught by the invariant it breaks, and the
counterexamples are the stories the mutants tell."""

from __future__ import annotations

import pytest

from model.explore import ROLLOUT, explore, hunt_mutant, main
from spec import rollout

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
}


def test_every_mutant_has_an_expected_invariant() -> None:
    assert set(EXPECTED) == set(rollout.MUTANT_NAMES)


@pytest.mark.parametrize("name", SMALL)
def test_correct_protocol_has_no_counterexample(name: str) -> None:
    res = explore(rollout.CONFIGS[name], machine=ROLLOUT)
    assert res.violation is None, res.violation.render()
    assert res.states > 1000 and res.transitions > res.states


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
    assert "rollout-small" in out and "rollout-ckpt" in out and "16/16 mutants caught" in out


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
                   "collect"):
        assert f"`{action}`" in section, action
