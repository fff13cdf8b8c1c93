"""Hypothesis `RuleBasedStateMachine` over the straw specification.

Role: random deep runs of the same transition relation the explorer exhausts
(`spec.actions.successors`), for configurations larger than exhaustive search can cover
(`spec.config.LARGE`: 4 packs with a cross-pack dependency, 2 queues sharing an input, 3 tasks,
3 workers, 5 epochs, 4 crashes, 2 pauses, GC, consumers and checkpoints). After every step
all state invariants are checked, and every transition is checked against the step invariants.

Profiles: "ci" (fast, for the test suite) and "deep" (for `just fuzz`-style long runs); choose
with HYPOTHESIS_PROFILE=deep. `machine_for(cfg, mut)` builds a machine class for any
configuration and protocol variant.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from spec.actions import successors
from spec.config import LARGE, Config
from spec.invariants import check_state, check_step
from spec.mutants import CORRECT, Mutants
from spec.state import State, initial_state

CI = settings(
    max_examples=100,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
DEEP = settings(
    max_examples=2000,
    stateful_step_count=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", CI)
settings.register_profile("deep", DEEP)


def profile() -> settings:
    """The settings chosen by HYPOTHESIS_PROFILE ("ci" unless it says "deep")."""
    return DEEP if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else CI


# Actions drawn only a quarter of the time: they are always enabled or cut runs short
# (collection cycles, cancellation, faults, checkpoint churn), so they would crowd out the rest.
RARE = frozenset(
    {
        "gc_lock",
        "cancel",
        "coord_crash",
        "coord_pause",
        "collector_crash",
        "writer_crash",
        "worker_crash",
        "register_checkpoint",
        "release_checkpoint",
        "rewind",
        "restore",
    }
)


class SpecMachine(RuleBasedStateMachine):
    """Drives the spec one enabled action at a time (enumeration order is deterministic, so
    shrinking moves towards alphabetically earlier action names and earlier instances)."""

    cfg: Config = LARGE
    mut: Mutants = CORRECT

    def __init__(self) -> None:
        super().__init__()
        self.state: State = initial_state(self.cfg)
        self.trace: list[str] = []

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        options = list(successors(self.cfg, self.mut, self.state))
        if not options:
            return
        # Choose the action name first, then the instance: frequent families (the collector's
        # lock/scan/unlock cycle) do not crowd out rare ones (yield, expiry, crashes).
        names = sorted({a.name for a, _ in options})
        common = [n for n in names if n not in RARE]
        if common and data.draw(st.integers(0, 3), label="rare?") != 0:
            names = common
        name = data.draw(st.sampled_from(names), label="action")
        same = [(a, s) for a, s in options if a.name == name]
        action, nxt = same[data.draw(st.integers(0, len(same) - 1), label="instance")]
        self.trace.append(str(action))
        bad = check_step(self.cfg, self.state, action, nxt)
        assert bad is None, f"{bad[0]}: {bad[1]}\n" + "\n".join(self.trace)
        self.state = nxt

    @invariant()
    def state_invariants(self) -> None:
        bad = check_state(self.cfg, self.state)
        assert bad is None, f"{bad[0]}: {bad[1]}\n" + "\n".join(self.trace)


def machine_for(cfg: Config, mut: Mutants = CORRECT) -> type[SpecMachine]:
    """A SpecMachine subclass bound to cfg and mut."""
    return type(
        f"SpecMachine_{cfg.name.replace('-', '_')}", (SpecMachine,), {"cfg": cfg, "mut": mut}
    )


TestSpecMachine = machine_for(LARGE).TestCase
TestSpecMachine.settings = profile()
