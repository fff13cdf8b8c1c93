"""Helpers of the retention conformance machine: the drawn universe (a static
``spec.config.Config``), the engine world on one SimFS (several clients, one store each),
fresh observations of the engine, and the step counters printed at the end of the run.

The universe: writers ``c0`` and ``c1`` (each one SimFS client with one
``SharedFilesystemStore`` whose ``writer_id`` is the client name), three spec packs per
writer, one to three extents per pack, each extent depending on up to two extents declared
before it (same pack or any earlier pack of either writer).  Spec pack ``p`` is bound to an
engine pack path when the engine first puts one of ``p``'s extents into a pack (or when
recovery shows that the engine opened a pack for it); from then on the binding is fixed and
checked.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from hypothesis import strategies as st

from fault_injection.simfs import SimFS
from spec.config import Config, ExtentDecl
from straw import SharedFilesystemStore
from straw.catalog import Catalog, CatalogState
from straw.clock import ManualClock

ROOT = "/pool"
RUN = "run"
WRITERS = ("c0", "c1")
READERS = ("r0", "r1")
OBSERVER = "observer"
PACKS_PER_WRITER = 3


@st.composite
def universes(draw: st.DrawFn) -> Config:
    """A static universe for one run (see the module docstring)."""
    packs: list[str] = []
    pack_writer: list[str] = []
    decls: list[ExtentDecl] = []
    for k in range(PACKS_PER_WRITER):
        for w in WRITERS:
            p = len(packs)
            packs.append(f"{w}.p{k}")
            pack_writer.append(w)
            for j in range(draw(st.integers(1, 3))):
                deps: list[int] = []
                if decls:
                    deps = draw(st.lists(st.integers(0, len(decls) - 1), max_size=2,
                                         unique=True))
                decls.append(ExtentDecl(f"{w}.p{k}.x{j}", p, tuple(sorted(deps))))
    return Config(
        name="conformance",
        packs=tuple(packs),
        pack_writer=tuple(pack_writer),
        extents=tuple(decls),
        app_extents=tuple(range(len(decls))),
        readers=READERS,
        max_crashes=10**9,
        gc=True,
    )


def open_store(sim: SimFS, client: str) -> SharedFilesystemStore:
    return SharedFilesystemStore(ROOT, RUN, writer_id=client, fs=sim.client(client),
                                 clock=ManualClock(), reserve_bytes=0, visibility_retries=1)


def observe_catalog(sim: SimFS) -> CatalogState:
    """The catalog as a fresh client sees it (replayed from the first frame, under the lock)."""
    cat = Catalog(sim.client(OBSERVER), ROOT)
    try:
        with cat.locked() as state:
            return state
    finally:
        cat.close()


def pack_file_exists(sim: SimFS, rel: str) -> bool:
    return os.path.join(ROOT, rel) in sim.files()


def writer_prefix(client: str) -> str:
    return f"runs/{RUN}/writers/{client}/"


@dataclass
class Stats:
    """Counters for the closing note (printed by the test module at the end)."""

    examples: int = 0
    steps: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    checks: int = 0
    invalid_reference_replies: int = 0
    phantom_packs: int = 0
    deferred: int = 0
    tombstoned: int = 0
    notes: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def step(self, name: str) -> None:
        self.steps += 1
        self.by_rule[name] = self.by_rule.get(name, 0) + 1

    def bump(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def crash(self, kind: str) -> None:
        self.crashes[kind] = self.crashes.get(kind, 0) + 1

    def summary(self) -> str:
        secs = time.perf_counter() - self.started
        rules = ", ".join(f"{k} {v}" for k, v in sorted(self.by_rule.items()))
        crashes = ", ".join(f"{k} {v}" for k, v in sorted(self.crashes.items())) or "none"
        return (f"retention conformance: {self.steps} steps in {self.examples} runs, "
                f"{self.checks} state comparisons, {secs:.1f}s\n"
                f"  packs tombstoned by collections: {self.tombstoned}\n"
                f"  steps by rule: {rules}\n"
                f"  crashes injected mid-operation: {crashes}\n"
                f"  InvalidReference replies checked: {self.invalid_reference_replies}; "
                f"packs opened in the catalog but never created (crash): "
                f"{self.phantom_packs}; planned packs deferred by an open pack's staging: "
                f"{self.deferred}\n"
                + "".join(f"  {k}: {v}\n" for k, v in sorted(self.notes.items())))


STATS = Stats()
