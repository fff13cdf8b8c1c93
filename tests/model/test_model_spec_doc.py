"""spec/ stays an independent oracle, and SPEC.md documents exactly what the code defines."""

from __future__ import annotations

import ast
from pathlib import Path

from spec.actions import successors
from spec.config import CONFIGS
from spec.invariants import ALL_IDS, STATE_INVARIANTS, STEP_INVARIANTS
from spec.mutants import CORRECT, MUTANT_NAMES, mutant
from spec.state import initial_state

ROOT = Path(__file__).resolve().parents[2]
SPEC_MD = (ROOT / "spec" / "SPEC.md").read_text()


def test_spec_imports_only_stdlib_and_itself() -> None:
    allowed = {"__future__", "collections", "dataclasses", "enum", "typing", "spec"}
    for path in sorted((ROOT / "spec").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for m in mods:
                assert m.split(".")[0] in allowed, f"{path.name} imports {m}"


def test_every_invariant_id_is_documented() -> None:
    assert set(ALL_IDS) >= set(STATE_INVARIANTS) | set(STEP_INVARIANTS)
    for iid in ALL_IDS:
        assert f"**{iid}**" in SPEC_MD, f"invariant {iid} missing from SPEC.md"


def _action_names() -> set[str]:
    names: set[str] = set()
    for cfg in CONFIGS.values():
        frontier = [initial_state(cfg)]
        seen = set(frontier)
        while frontier and len(seen) < 3000:
            s = frontier.pop(0)
            for a, s2 in successors(cfg, CORRECT, s):
                names.add(a.name)
                if s2 not in seen:
                    seen.add(s2)
                    frontier.append(s2)
    # coord_persist_epoch is only enabled under its mutant, after a recovery
    cfg = CONFIGS["queue-small"]
    mut = mutant("epoch_not_durable_before_service")
    start = initial_state(cfg)
    crashed = next(s for a, s in successors(cfg, mut, start) if a.name == "coord_crash")
    recovered = next(s for a, s in successors(cfg, mut, crashed) if a.name == "coord_recover")
    names |= {a.name for a, _ in successors(cfg, mut, recovered)}
    assert "coord_persist_epoch" in names
    return names


def test_every_action_is_documented() -> None:
    names = _action_names()
    assert {"write", "gc_tombstone", "acquire", "complete", "coord_recover", "rewind"} <= names
    for name in sorted(names):
        assert f"`{name}" in SPEC_MD, f"action {name} missing from SPEC.md"


def test_every_mutant_is_documented() -> None:
    assert len(MUTANT_NAMES) >= 10
    for name in MUTANT_NAMES:
        assert f"`{name}`" in SPEC_MD, f"mutant {name} missing from SPEC.md"
