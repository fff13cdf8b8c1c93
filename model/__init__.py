"""Checks of the specification: `explore` (exhaustive BFS with mutants and liveness) and
`machine` (Hypothesis RuleBasedStateMachine over the same transition relation)."""
