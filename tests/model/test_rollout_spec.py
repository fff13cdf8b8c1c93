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
    assert "rollout-small" in out and "8/8 mutants caught" in out


def test_spec_document_names_every_rollout_id_action_and_mutant() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "spec" / "SPEC.md").read_text()
    section = text[text.index("## 9. The rollout layer"):]
    for iid in rollout.ALL_IDS:
        assert f"**{iid}**" in section, iid
    for name in rollout.MUTANT_NAMES:
        assert f"`{name}`" in section, name
    for action in ("controller_submit", "worker_yield_partial", "builder_plan", "builder_hooks",
                   "builder_ack", "trainer_finish", "crash_builder", "expire"):
        assert f"`{action}`" in section, action
