"""Staleness windows: how long client B's stat sizes, name lookups and directory listings
lag behind client A's changes (p50/p99/max, each sample bounded by ``env.deadline``).  The
store's visibility retry window must cover them (D6).  Samples are taken in batches: each
change is polled from the moment it was made, so one slow sample does not delay the rest."""

from __future__ import annotations

from collections.abc import Callable

from .env import (
    Client,
    Env,
    Result,
    append_file,
    converge,
    poll_batch,
    stat_size,
    window,
    window_verdict,
    write_file,
)


def _has_size(c: Client, n: str, size: int | None) -> Callable[[], bool]:
    return lambda: stat_size(c, n) == size


def _opens(c: Client, n: str) -> Callable[[], bool]:
    return lambda: c.fs.probe(c.path(n))


def _listed(c: Client, n: str, present: bool) -> Callable[[], bool]:
    return lambda: (n in c.fs.listdir(c.dir)) == present


def attribute_staleness(env: Env) -> Result:
    names = [env.name("attr") for _ in range(env.rounds)]
    for n in names:
        write_file(env.a, n, b"1")
    samples: list[float | None] = []
    pending: dict[str, tuple[float, Callable[[], bool]]] = {}
    for n in names:
        stat_size(env.b, n)  # B caches the old size
        append_file(env.a, n, b"2" * 4095, 1)
        pending[n] = (env.clock.now(), _has_size(env.b, n, 4096))
        poll_batch(env, pending, samples, once=True)
    poll_batch(env, pending, samples)
    return window_verdict("attribute_staleness", env, samples, "new size in B's stat")


def entry_staleness(env: Env) -> Result:
    new: list[float | None] = []
    gone: list[float | None] = []
    appear: dict[str, tuple[float, Callable[[], bool]]] = {}
    vanish: dict[str, tuple[float, Callable[[], bool]]] = {}
    for _ in range(env.rounds):
        n = env.name("entry-new")
        env.b.fs.probe(env.b.path(n))  # B looked the name up: not found (negative entry)
        stat_size(env.b, n)
        write_file(env.a, n, b"x")
        appear[n] = (env.clock.now(), _opens(env.b, n))
        poll_batch(env, appear, new, once=True)
    for _ in range(env.rounds):
        n = env.name("entry-gone")
        write_file(env.a, n, b"x")
        stat_size(env.b, n)  # B resolved the name
        env.a.fs.unlink(env.a.path(n))
        vanish[n] = (env.clock.now(), _has_size(env.b, n, None))
        poll_batch(env, vanish, gone, once=True)
    poll_batch(env, appear, new)
    poll_batch(env, vanish, gone)
    samples = new + gone
    res = window_verdict("entry_staleness", env, samples,
                          "new name in B's open, removed name gone from its stat")
    res.figures = {**window(samples), "new_name_open": window(new),
                   "removed_name_stat": window(gone)}
    return res


def listing_staleness(env: Env) -> Result:
    samples: list[float | None] = []
    for _ in range(env.rounds):
        n = env.name("listing")
        env.b.fs.listdir(env.b.dir)  # B caches the listing
        write_file(env.a, n, b"x")
        samples.append(converge(env, _listed(env.b, n, True)))
        env.a.fs.unlink(env.a.path(n))
        samples.append(converge(env, _listed(env.b, n, False)))
    return window_verdict("listing_staleness", env, samples,
                           "names added/removed in B's listing")
