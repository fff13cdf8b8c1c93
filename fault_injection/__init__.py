"""Fault injection for straw: SimFS (simulated, crashable, multi-client filesystem),
FaultyFS (errno rules over a real directory) and the shared fault rules.

A crash campaign over one workload ``run(fs)``::

    probe = SimFS(seed=0)
    run(probe)
    n = sum(1 for e in probe.trace if e.op in MUTATING_OPS)
    for i in range(1, n + 2):            # n + 1: the workload ran to completion
        for variant in VARIANTS:
            sim = SimFS(seed=i)
            sim.crash_at(i, ops=MUTATING_OPS)
            try:
                run(sim)
            except SimulatedCrash:
                pass
            sim.crash(variant)            # power loss; sim.kill_client(name) for SIGKILL
            check(sim)                    # reopen on what survived; on failure print
                                          # sim.describe() (seed, rules, faults)

The campaigns themselves: ``fault_injection.campaigns`` (store and catalog workloads,
frame campaign, negative controls; ``just crash``), ``fault_injection.journal_campaign``,
``fault_injection.checkpoint_campaign`` (a rollout job's checkpoint save and restore),
and ``fault_injection.fuzz`` (real processes under SIGKILL/SIGSTOP; ``just fuzz``; its rollout
scenario is ``fault_injection.rollout_fuzz``, its whole-job checkpoint scenario
``fault_injection.job_fuzz``).
"""

from fault_injection.faultyfs import FaultyFS
from fault_injection.rules import (
    ALL_OPS,
    MUTATING_OPS,
    SYNC_OPS,
    CrashPoint,
    ErrnoRule,
    FaultEvent,
    FaultPlan,
    SimulatedCrash,
    TraceEntry,
)
from fault_injection.simfs import SimClient, SimDeadlock, SimFS
from fault_injection.simstate import VARIANTS

__all__ = [
    "ALL_OPS",
    "MUTATING_OPS",
    "SYNC_OPS",
    "VARIANTS",
    "CrashPoint",
    "ErrnoRule",
    "FaultEvent",
    "FaultPlan",
    "FaultyFS",
    "SimClient",
    "SimDeadlock",
    "SimFS",
    "SimulatedCrash",
    "TraceEntry",
]
