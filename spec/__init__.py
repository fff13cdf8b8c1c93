"""The straw specification: an explicit, pure state machine (no I/O, no clock).

Read `spec/SPEC.md` first. Modules: `config` (bounded universe), `state` (variables),
`actions` (transitions), `invariants` (D1–D9, R1, Q1–Q7, L1–L2), `helpers` (pure functions with
CrossHair contracts), `mutants` (one switch per deliberately broken variant).
This package imports nothing from `straw`: it is the oracle the engine is tested against.
"""
