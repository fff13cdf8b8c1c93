"""The consumer rules (``straw.queue.rules_consumers``) against the spec's consumer actions.

A queue of four accepted results is consumed in every order the spec allows (consume,
acknowledge out of order, restore to the start, register a checkpoint, replacing the
previous one, release it, rewind to it), breadth-first over the spec's states; the
engine's ``QueueState`` follows along, each spec step mirrored by the transactions the
rules decide (``cons_save``, ``ckpt``, ``ckpt_release``).  In every state:

* the results the queue still keeps are the ones the spec's journal names (D2);
* consume, acknowledge and release_checkpoint are refused exactly where the spec's action
  is; restore, register_checkpoint and rewind are never refused by the rules where the
  spec allows them (its other preconditions are the caller's: a view to move back to, the
  registrations the model bounds, a checkpoint to rewind to);
* the history a save or a registration needs again (which the coordinator checks and
  adopts before journaling it) is exactly what the spec's journal names anew.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from spec import actions as A
from spec.config import CONSUME, ExtentDecl, TaskDecl
from spec.mutants import CORRECT
from spec.state import State, initial_state
from straw.errors import InvalidReference
from straw.queue import rules, rules_consumers
from straw.queue.state import QueueState

RUN, CONSUMER = "run", "training"
N = 4  # accepted results
# the spec's consume configuration, with more results and registrations
CFG = dataclasses.replace(
    CONSUME,
    name="consumer-rules",
    packs=("p0", "p1"),
    pack_writer=("prod", "work"),
    extents=tuple([ExtentDecl(f"i{i}", 0) for i in range(N)]
                  + [ExtentDecl(f"r{i}", 1) for i in range(N)]),
    preloaded=tuple(range(N)),
    tasks=tuple(TaskDecl(f"t{i}", 0, input=i, result=N + i, priority=0, key=0, fifo=i)
                for i in range(N)),
    checkpoints=2,
)


def stored(e: int) -> tuple[Any, ...]:
    return (f"runs/{RUN}/packs/w/i1/pack-{e}.pack", 0, 64, "0" * 32, f"{e:032x}", 1, 0, 8, 0)


def spec_step(s: State, name: str, *args: Any) -> State:
    out = getattr(A, name)(CFG, CORRECT, s, *args)
    assert out is not None, (name, args)
    return out.state


class Engine:
    """The engine's side: its journal so far, and the id of its current checkpoint."""

    def __init__(self, txns: tuple[bytes, ...] = (), checkpoint: str | None = None,
                 registered: int = 0) -> None:
        self.txns, self.checkpoint, self.registered = txns, checkpoint, registered
        self.state = QueueState()
        for t in txns:
            self.state.apply(msgpack.unpackb(t, raw=False))

    def then(self, *txns: dict[str, Any] | None, checkpoint: Any = ...) -> Engine:
        more = tuple(msgpack.packb(t) for t in txns if t is not None)
        return Engine(self.txns + more,
                      self.checkpoint if checkpoint is ... else checkpoint,
                      self.registered + (checkpoint is not ... and checkpoint is not None))


def start() -> tuple[State, Engine]:
    """Every task submitted, leased and completed, in the spec and in the engine."""
    s = initial_state(CFG)
    eng = Engine().then(rules.recover(1, True))
    for t, d in enumerate(CFG.tasks):
        s = spec_step(s, "submit", t)
        s = spec_step(s, "coord_retain_input", t)
        s = spec_step(s, "coord_journal_submit", t)
        row = [d.name, list(stored(d.input)), {}, 0, 0, 1, False, False, 1, 0, 0]
        eng = eng.then({"t": "submit", "req": f"r{t}", "digest": f"d{t}", "tasks": [row],
                        "producer": None})
    for _ in CFG.tasks:
        s = spec_step(s, "acquire", 0, 0)
        (le,) = s.leases
        s = spec_step(s, "complete", le, True)
        s = spec_step(s, "release_reads", 0, le.task)
        name = CFG.tasks[le.task].name
        eng = eng.then({"t": "lease", "epoch": 1, "worker": "w0", "grants": [[name, 1]]},
                       {"t": "complete", "task": name, "attempt": 1, "sub": f"s-{name}",
                        "result": list(stored(CFG.tasks[le.task].result)),
                        "digest": f"{CFG.tasks[le.task].result:032x}", "epoch": 1,
                        "meta": {"worker": "w0"}})
    assert [tuple(c.result) for c in eng.state.commits] == \
        [stored(c.result) for c in A.queue_log(CFG, s, 0)]
    return s, eng


def save(cursor: int, acked: frozenset[int]) -> dict[str, Any]:
    """The designated consumer's save of the spec's view (``cursor``, ``acked``)."""
    return {"t": "cons_save", "consumer": CONSUMER, "req": None,
            "fetch": max(cursor, N), "processed": cursor, "state": list(stored(0)),
            "progress": None, "sparse": sorted(acked), "finished": [], "digest": "d"}


def decide_save(eng: Engine, txn: dict[str, Any]) -> list[Any] | None:
    """The history the save needs again, or None where the rule refuses it."""
    try:
        return rules_consumers.consumer_save(eng.state, CONSUMER, txn, designated=CONSUMER,
                                             durable_commits=N)
    except (ValueError, InvalidReference):
        return None


def register(eng: Engine, cursor: int) -> tuple[list[Any], Engine]:
    """A checkpoint at ``cursor`` replacing the current one: the new one is registered
    (the history it needs again decided with both kept), then the old one released."""
    ck = f"ck{eng.registered}"
    decision, needed = rules_consumers.register_checkpoint(
        eng.state, ck, stored(0), cursor, {"batch_ids": []}, f"d-{ck}", designated=CONSUMER,
        durable_commits=N)
    assert decision.txn is not None
    nxt = eng.then(decision.txn, checkpoint=ck)
    if eng.checkpoint is not None:
        nxt = nxt.then(rules_consumers.release_checkpoint(nxt.state, eng.checkpoint).txn)
    return needed, nxt


def named_results(s: State) -> set[tuple[Any, ...]]:
    """The results the spec's journal still names."""
    named = A.journal_named(CFG, s, 0)
    return {stored(c.result) for c in A.queue_log(CFG, s, 0) if c.result in named}


def kept_results(eng: Engine) -> set[tuple[Any, ...]]:
    st = eng.state
    cursor, sparse = st.retirement_cursor(CONSUMER), st.retired_sparse(CONSUMER)
    return {tuple(c.result) for i, c in enumerate(st.commits) if i >= cursor and i not in sparse}


def successors(s: State, eng: Engine) -> list[tuple[State, Engine, list[Any] | None]]:
    """Every consumer action the spec enables, mirrored: (state, engine, the history the
    rule said the step needs again, or None for a step that needs none by construction)."""
    out: list[tuple[State, Engine, list[Any] | None]] = []
    for name, args in (("consume", ()), ("restore", ()), ("rewind", ()),
                       *(("acknowledge", (i,)) for i in range(N))):
        o = getattr(A, name)(CFG, CORRECT, s, 0, *args)
        if o is None:
            continue
        cons = o.state.consumers[0]
        txn = save(cons.cursor, cons.acked)
        needed = decide_save(eng, txn)
        assert needed is not None, (name, args)
        out.append((o.state, eng.then(txn), needed))
    if (o := A.register_checkpoint(CFG, CORRECT, s, 0)) is not None:
        needed, nxt = register(eng, s.consumers[0].cursor)
        out.append((o.state, nxt, needed))
    if (o := A.release_checkpoint(CFG, CORRECT, s, 0)) is not None:
        assert eng.checkpoint is not None
        d = rules_consumers.release_checkpoint(eng.state, eng.checkpoint)
        out.append((o.state, eng.then(d.txn, checkpoint=None), None))
    return out


def check(s: State, eng: Engine) -> None:
    assert kept_results(eng) == named_results(s)
    cons = s.consumers[0]
    # consume: refused where the spec's is (nothing left to read)
    nxt = cons.cursor + 1
    while nxt in cons.acked:
        nxt += 1
    consumed = decide_save(eng, save(nxt, cons.acked - set(range(nxt))))
    assert (consumed is not None) == (A.consume(CFG, CORRECT, s, 0) is not None)
    # acknowledge: refused where the spec's is (not past the cursor, not a commit)
    for i in range(N + 2):
        if i == cons.cursor or i in cons.acked:
            continue  # the cursor's own position is consume's; a repeated one changes nothing
        got = decide_save(eng, save(cons.cursor, cons.acked | {i}))
        assert (got is not None) == (A.acknowledge(CFG, CORRECT, s, 0, i) is not None), i
    # release_checkpoint: a transaction exactly where the spec has a checkpoint to release
    held = eng.checkpoint if eng.checkpoint is not None else "ck-none"
    released = rules_consumers.release_checkpoint(eng.state, held).txn is not None
    assert released == (A.release_checkpoint(CFG, CORRECT, s, 0) is not None)


def explore(limit: int = 100_000) -> int:
    s0, e0 = start()
    seen = {s0}
    todo = [(s0, e0)]
    while todo:
        s, eng = todo.pop()
        check(s, eng)
        for s2, e2, needed in successors(s, eng):
            if needed is not None:  # the history the step needs again: what the spec names anew
                assert set(map(tuple, needed)) == named_results(s2) - named_results(s)
            if s2 not in seen:
                seen.add(s2)
                todo.append((s2, e2))
        assert len(seen) < limit
    return len(seen)


def test_consumer_rules_refuse_exactly_where_the_spec_does() -> None:
    assert explore() > 500


def test_a_checkpoint_that_keeps_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a registration that ignores its own cursor (the results it keeps
    are not adopted again) disagrees with the spec's register_checkpoint."""
    real = rules_consumers.register_checkpoint

    def forgets_cursor(*args: Any, **kwargs: Any) -> Any:
        decision, _needed = real(*args, **kwargs)
        return decision, []

    monkeypatch.setattr(rules_consumers, "register_checkpoint", forgets_cursor)
    with pytest.raises(AssertionError):
        explore()
