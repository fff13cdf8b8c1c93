"""``straw qualify``: measure, on a real mount, the filesystem contract straw relies on.

``prepare(path, peer=...)`` builds the run's ``Env`` (client A = ``path``, client B =
``peer``, a second mount of the same volume; without a peer both are one local view);
``run(env)`` runs every clause of ``straw.qualify.clauses`` and returns a ``Report``: a
verdict per clause with its figures, an overall verdict (exit status 0/1), and the store
settings the figures imply (the visibility retry window, space reservation, the JuiceFS
declaration that describes the mount).  Everything qualify creates lives in
``<path>/.straw-qualify/`` under a per-run prefix and is removed at the end (the empty
directory stays).  Bad input (a missing path, a peer that does not show the same
directory) raises ``QualifyInputError`` before anything is written.

The full-filesystem clause needs a filesystem it may fill: ``full=DIR`` (``--full-check``)
names a directory on a small one (a small tmpfs, or a JuiceFS directory with a quota:
``juicefs quota set META --path /dir --capacity 1``); without it that clause is skipped.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..backend import implied_declaration
from ..clock import Clock, SystemClock
from ..fs import Filesystem, PosixFS
from .clauses import CLAUSES, FAIL, PASS, SKIP, Client, Env, HolderFactory, Result, converge

SCRATCH = ".straw-qualify"
DEFAULT_BACKOFF = 0.05  # the store's visibility_backoff default
DEFAULT_RETRIES = 8  # the store's visibility_retries default


class QualifyInputError(ValueError):
    """The paths given to qualify cannot be qualified (exit status 2)."""


@dataclass
class Report:
    path: str
    peer: str | None
    results: list[Result]
    implied: dict[str, Any]
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.verdict != FAIL for r in self.results)

    @property
    def exit_status(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "peer": self.peer, "passed": self.passed,
                "verdicts": {r.clause: r.verdict for r in self.results},
                "clauses": [r.to_dict() for r in self.results], "implied": self.implied,
                "settings": self.settings, "seconds": round(self.seconds, 2)}


def _directory(fs: Filesystem, path: str, what: str) -> str:
    try:
        st = fs.stat(path)
    except FileNotFoundError:
        raise QualifyInputError(f"{what} {path} does not exist; give an existing directory "
                                "on the filesystem to qualify") from None
    if not st.is_dir:
        raise QualifyInputError(f"{what} {path} is not a directory")
    return fs.realpath(path)


def prepare(path: str, *, peer: str | None = None, fs: Filesystem | None = None,
            peer_fs: Filesystem | None = None, clock: Clock | None = None,
            quick: bool = False, rounds: int | None = None, deadline: float | None = None,
            full: str | None = None, full_limit: int = 256 << 20,
            holder: HolderFactory | None = None, seed: int = 0) -> Env:
    """The run's environment; creates the scratch directory (after checking the input)."""
    fs = fs or PosixFS()
    a = Client(fs, os.path.join(_directory(fs, os.path.abspath(path), "path"), SCRATCH))
    b = a
    if peer is not None:
        pfs = peer_fs or fs
        b = Client(pfs, os.path.join(_directory(pfs, os.path.abspath(peer), "peer"), SCRATCH))
    full_client = None
    if full is not None:
        full_client = Client(fs, _directory(fs, os.path.abspath(full), "--full-check directory"))
    if holder is None and isinstance(fs, PosixFS):
        from .holder import ProcessHolder
        holder = ProcessHolder
    env = Env(a=a, b=b, clock=clock or SystemClock(), token=f"q{uuid.uuid4().hex[:10]}",
              rounds=rounds or (3 if quick else 8), deadline=deadline or (3.0 if quick else 5.0),
              holder=holder, full=full_client, full_limit=full_limit, seed=seed)
    if b is not a:
        _check_same_directory(env)
    for c in {id(x): x for x in (a, b)}.values():
        if not c.fs.exists(c.dir):
            try:
                c.fs.mkdir(c.dir)
            except FileExistsError:
                pass
    return env


def _check_same_directory(env: Env) -> None:
    """The peer must show the directory of ``path`` (two mounts of one volume).  Probed
    with one file next to the scratch directory, removed again: bad input leaves
    nothing behind."""
    name = f".{SCRATCH.lstrip('.')}-peer-{env.token}"
    a_path = os.path.join(os.path.dirname(env.a.dir), name)
    b_path = os.path.join(os.path.dirname(env.b.dir), name)
    fd = env.a.fs.open(a_path, write=True, create=True, exclusive=True)
    try:
        env.a.fs.writev(fd, [env.token.encode()], 0)
        env.a.fs.fsync(fd)
    finally:
        env.a.fs.close(fd)
    try:
        seen = converge(env, lambda: env.b.fs.probe(b_path))
    finally:
        env.a.fs.unlink(a_path)
    if seen is None:
        raise QualifyInputError(
            f"peer {os.path.dirname(env.b.dir)} does not show what was written to "
            f"{os.path.dirname(env.a.dir)} within {env.deadline:g} s: the peer must be the same "
            "directory seen through another mount (client) of the same volume")


def run(env: Env, clauses: Iterable[str] | None = None,
        progress: Callable[[str, int, int], None] | None = None) -> Report:
    """Run the clauses (all by default, in ``CLAUSES`` order); always cleans up."""
    names = list(CLAUSES) if clauses is None else list(clauses)
    for n in names:
        if n not in CLAUSES:
            raise QualifyInputError(f"clause {n!r} is unknown; the clauses are "
                                    f"{', '.join(CLAUSES)}")
    t0 = time.monotonic()
    results = []
    try:
        for i, n in enumerate(names):
            if progress is not None:
                progress(n, i, len(names))
            try:
                results.append(CLAUSES[n](env))
            except (OSError, RuntimeError) as e:
                # an error the contract does not allow (or a holder process that could not
                # take its lock) is the clause's failure
                results.append(Result(n, FAIL, f"unexpected error: {e!r}"))
    finally:
        cleanup(env)
    peer = None if env.b is env.a else os.path.dirname(env.b.dir)
    return Report(os.path.dirname(env.a.dir), peer, results, implied_settings(results),
                  time.monotonic() - t0,
                  {"rounds": env.rounds, "deadline_s": env.deadline, "poll_s": env.poll})


def cleanup(env: Env) -> None:
    """Remove everything this run created (names with its token)."""
    for c in {id(x): x for x in (env.a, env.b, env.full) if x is not None}.values():
        try:
            names = c.fs.listdir(c.dir)
        except OSError:
            continue
        for n in names:
            if n.startswith(env.token):
                try:
                    c.fs.unlink(c.path(n))
                except OSError:
                    pass


def retry_window(retries: int, backoff: float) -> float:
    """How long the store's bounded visibility retries wait in total (straw.reader: the
    delay doubles from ``backoff`` up to 1 s)."""
    return sum(min(backoff * 2 ** i, 1.0) for i in range(retries))


def implied_settings(results: list[Result]) -> dict[str, Any]:
    by = {r.clause: r for r in results}
    lags = []
    for clause, key in (("attribute_staleness", None), ("entry_staleness", None),
                        ("listing_staleness", None), ("rename_atomic", "visible")):
        r = by.get(clause)
        if r is None or r.verdict == SKIP:
            continue
        fig = r.figures.get(key, {}) if key else r.figures
        if isinstance(fig, dict) and fig.get("max") is not None:
            lags.append(float(fig["max"]))
    out: dict[str, Any] = {}
    if lags:
        need = 2 * max(lags) + 0.1  # twice the worst window seen, plus a margin
        retries = 1
        while retry_window(retries, DEFAULT_BACKOFF) < need and retries < 64:
            retries += 1
        out["visibility_window_s"] = round(need, 3)
        out["visibility_retries"] = max(retries, DEFAULT_RETRIES)
        out["visibility_backoff"] = DEFAULT_BACKOFF
        out["default_window_covers_it"] = retry_window(DEFAULT_RETRIES, DEFAULT_BACKOFF) >= need
    r = by.get("space_reservation")
    if r is not None and r.verdict == PASS:
        out["reserve_bytes"] = "default (64 MiB)" if r.figures.get("supported") else 0
    r = by.get("lock_release_on_death")
    if r is not None and r.verdict == PASS:
        out["dead_holder_lock_released_within_s"] = r.figures["release"]["max"]
    r = by.get("mount_options")
    if r is not None:
        live = r.figures.get("path", {}).get("juicefs")
        if live:
            out["profile"] = "juicefs"
            out["declaration"] = implied_declaration(live)
        elif r.figures.get("path"):
            kind = r.figures["path"].get("type")
            out["profile"] = "local" if "peer" not in r.figures else \
                f"none: straw has profiles for local disks and JuiceFS, not for {kind}"
    return out


__all__ = ["CLAUSES", "QualifyInputError", "Report", "cleanup", "implied_settings",
           "prepare", "retry_window", "run"]
