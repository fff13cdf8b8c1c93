"""The bounded explorer on the small configurations: the correct protocol has no counterexample
(safety and liveness), and every mutant is caught with a shortest counterexample."""

from __future__ import annotations

import pytest

from model.explore import CONFIG_SETS, explore, hunt_mutant, main
from spec.config import CONFIGS
from spec.invariants import ALL_IDS
from spec.mutants import CORRECT, MUTANT_NAMES

SMALL = CONFIG_SETS["small"]


@pytest.mark.parametrize("name", SMALL)
def test_correct_protocol_has_no_counterexample(name: str) -> None:
    res = explore(CONFIGS[name], CORRECT)
    assert res.violation is None, res.violation.render()
    assert res.states > 1000
    assert res.transitions > res.states
    assert res.liveness_checked, "a liveness property applies to every configuration"


@pytest.mark.parametrize("name", MUTANT_NAMES)
def test_every_mutant_is_caught(name: str) -> None:
    cname, res = hunt_mutant(name, SMALL)
    assert res is not None and res.violation is not None, f"mutant {name} survived"
    assert res.violation.iid in ALL_IDS
    assert len(res.violation.trace) >= 1


def test_counterexample_is_shortest_and_readable() -> None:
    # journal-before-retain is visible right after the producer's submit is journaled.
    _, res = hunt_mutant("journal_before_retain", SMALL)
    assert res is not None and res.violation is not None
    v = res.violation
    assert v.iid == "D2"
    assert [a.name for a in v.trace] == ["submit", "coord_journal_submit"]
    text = v.render()
    assert text.splitlines()[0].startswith("violates D2:")
    assert "  1. submit(t0) -> sent" in text


def test_fenced_old_coordinator_trace() -> None:
    _, res = hunt_mutant("fencing_skipped", SMALL)
    assert res is not None and res.violation is not None
    names = [a.name for a in res.violation.trace]
    assert res.violation.iid == "D8"
    assert "coord_pause" in names and "coord_recover" in names
    assert names[-1] == "old_coord_complete"


def test_cli_small_with_one_mutant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "small", "--only", "pin_dropped_on_expiry", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "pin_dropped_on_expiry" in out and "caught by" in out
