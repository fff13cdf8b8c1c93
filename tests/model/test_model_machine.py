"""The Hypothesis state machine over the spec: the correct protocol keeps every invariant on
random deep runs of the large configuration; a shallow mutant is found."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from model.machine import machine_for, profile
from spec.config import LARGE, QUEUE_FULL, SHARE
from spec.mutants import mutant


@pytest.mark.parametrize("cfg", [LARGE, QUEUE_FULL, SHARE], ids=lambda c: c.name)
def test_spec_machine_keeps_invariants(cfg: object) -> None:
    run_state_machine_as_test(machine_for(cfg), settings=profile())  # type: ignore[arg-type]


def test_spec_machine_finds_a_mutant() -> None:
    fast = settings(profile(), max_examples=200, phases=[Phase.generate])
    with pytest.raises(AssertionError, match="D2"):
        run_state_machine_as_test(
            machine_for(LARGE, mutant("journal_before_retain")), settings=fast
        )
