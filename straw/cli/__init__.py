"""The ``straw`` command: demo, qualify, inspect, top, gc, bench.

    straw demo [--root DIR]                      the library's main job, verified
    straw qualify PATH [--peer PATH] [--quick] [--full-check DIR] [--json FILE] [--plot FILE]
    straw inspect POOL [--named-in DIR ...] [--json FILE] [--plot FILE]
    straw top POOL [--interval S] [--iterations N] [--json FILE]
    straw gc POOL [--dry-run] [--release-orphans [--named-in DIR ...]] [--json FILE]
    straw bench [--root DIR] [--rounds N] [--json FILE]

Exit status: 0 success (qualify: every clause passed), 1 a failed verdict or a storage
error, 2 bad input (a path that is not a pool, a pool of a newer format, a path to
qualify that does not exist, a peer that is not the same volume, unknown options) --
with a message naming what was wrong, and nothing written.  ``inspect``, ``top`` and
``gc --dry-run`` never write to the pool (``straw.pool_view``).  ``inspect`` lists every
owner with what names it, and the orphans nothing names (``straw.orphans``; checkpoint
markers and archive indexes are searched in ``--named-in`` directories, the pool's parent
by default); ``gc --release-orphans`` releases those orphans before it collects.
``--json FILE`` (``-``: stdout) writes the report as JSON; ``--plot FILE`` draws it (the
``plot`` extra).

Layering: this package uses the core's public API and read-only accessors only; the core
never imports it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..errors import StrawError, UnsupportedSchema
from ..fs import PosixFS
from . import render


class BadInput(Exception):
    """Exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="straw", description="straw: durable filesystem queues "
                                "and packed tensor storage -- operator commands")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the demo on a temp pool (or --root DIR)")
    d.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of python -m straw.cli.demo")

    q = sub.add_parser("qualify", help="measure the filesystem contract on a mount")
    q.add_argument("path", help="a directory on the filesystem to qualify (client A)")
    q.add_argument("--peer", help="the same directory through a second mount (client B)")
    q.add_argument("--quick", action="store_true", help="3 rounds, 3 s deadline (CI)")
    q.add_argument("--rounds", type=int, help="samples per clause (default 8)")
    q.add_argument("--deadline", type=float,
                   help="longest wait for one staleness sample, seconds (default 5)")
    q.add_argument("--full-check", metavar="DIR",
                   help="a directory on a SMALL filesystem qualify may fill (tmpfs, quota)")
    q.add_argument("--full-limit", type=int, default=256 << 20, metavar="BYTES",
                   help="give up filling --full-check after this many bytes")
    q.add_argument("--clause", action="append", help="run only this clause (repeatable)")
    q.add_argument("--declaration", metavar="FILE",
                   help="a JuiceFS deployment declaration (JSON) to check against the mount "
                   "first (profile juicefs; a contradiction exits 2)")
    q.add_argument("--json", metavar="FILE")
    q.add_argument("--plot", metavar="FILE", help="staleness CDF (png/svg/pdf)")

    i = sub.add_parser("inspect", help="what a pool holds (read-only)")
    i.add_argument("pool")
    i.add_argument("--json", metavar="FILE")
    i.add_argument("--plot", metavar="FILE", help="bytes by owner, staleness")
    _named_in(i)

    t = sub.add_parser("top", help="a live, refreshing view of a pool (read-only)")
    t.add_argument("pool")
    t.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    t.add_argument("--iterations", type=int, help="refresh this many times, then exit")
    t.add_argument("--json", metavar="FILE", help="append each refresh as a JSON line")

    g = sub.add_parser("gc", help="collect the pool's unreachable packs")
    g.add_argument("pool")
    g.add_argument("--dry-run", action="store_true", help="show what would be reclaimed")
    g.add_argument("--release-orphans", action="store_true",
                   help="first release the owners nothing names (see straw inspect)")
    _named_in(g)
    g.add_argument("--json", metavar="FILE")

    b = sub.add_parser("bench", help="publish throughput vs raw write+fdatasync")
    b.add_argument("--root", help="directory to measure on (default: a temp dir)")
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--records", type=int, default=16)
    b.add_argument("--record-bytes", type=int, default=1 << 20)
    b.add_argument("--json", metavar="FILE")
    return p


def _named_in(p: argparse.ArgumentParser) -> None:
    p.add_argument("--named-in", action="append", metavar="DIR",
                   help="where to look for the checkpoint markers and archive indexes that "
                        "name the pool's owners (repeatable; default: the pool's parent)")


def _owners(args: argparse.Namespace) -> list[dict[str, Any]]:
    from .. import orphans
    from ..rollout.orphans import namers
    for d in args.named_in or ():
        if not PosixFS().exists(d):
            raise BadInput(f"--named-in {d} does not exist; give a directory to search")
    judges = namers(args.pool, args.named_in)
    return [o.as_dict() for o in orphans.survey(args.pool, namers=judges)]


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise BadInput(f"{name} must be positive, got {value}")


def _report(out: render.Out, args: argparse.Namespace, data: dict[str, Any],
            show: Any) -> None:
    if args.json:
        render.write_json(data, args.json)
    if args.json != "-":
        show(out, data)


def cmd_qualify(args: argparse.Namespace, out: render.Out) -> int:
    from .. import qualify
    _positive("--rounds", args.rounds)
    _positive("--deadline", args.deadline)
    declared = _check_declaration(args.declaration, args.path) if args.declaration else None
    try:
        env = qualify.prepare(args.path, peer=args.peer, quick=args.quick,
                              rounds=args.rounds, deadline=args.deadline,
                              full=args.full_check, full_limit=args.full_limit)
    except qualify.QualifyInputError as e:
        raise BadInput(str(e)) from None
    names = args.clause or list(qualify.CLAUSES)
    with out.progress(len(names), "qualify") as step:
        try:
            rep = qualify.run(env, names, progress=lambda n, i, total: step(n))
        except qualify.QualifyInputError as e:
            raise BadInput(str(e)) from None
    data = rep.to_dict()
    if declared is not None:
        data["declaration"] = declared
    _report(out, args, data, render.qualify)
    if args.plot:
        render.plot_qualify(data, args.plot)
    return rep.exit_status


def _check_declaration(path: str, root: str) -> dict[str, Any]:
    """Validate the declaration file and check it against the live mount of ``root``."""
    from ..backend import FilesystemBackend
    from ..errors import DeploymentMismatch
    try:
        declaration = json.loads(PosixFS().read_file(path))
    except (OSError, ValueError) as e:
        raise BadInput(f"--declaration {path}: cannot read a JSON object: {e}") from None
    try:
        backend = FilesystemBackend(root, profile="juicefs", declaration=declaration)
        backend.verify()
    except (TypeError, ValueError, DeploymentMismatch) as e:
        raise BadInput(f"--declaration {path}: {e}") from None
    return {"file": path, "verified": True, **backend.diagnostics()}


def cmd_inspect(args: argparse.Namespace, out: render.Out) -> int:
    from .. import pool_view as pool
    view = pool.inspect(args.pool)
    view["owner_status"] = _owners(args)
    _report(out, args, view, render.inspect)
    if args.plot:
        render.plot_inspect(view, args.plot)
    return 1 if view["errors"] else 0


def cmd_top(args: argparse.Namespace, out: render.Out) -> int:
    from .. import pool_view as pool
    _positive("--iterations", args.iterations)
    if args.interval < 0:
        raise BadInput(f"--interval must be >= 0, got {args.interval}")
    pool.check_pool(pool.PosixFS(), args.pool)  # bad input before the first refresh
    n = 0
    while args.iterations is None or n < args.iterations:
        if n:
            time.sleep(args.interval)  # the refresh period of a live view
        view = pool.inspect(args.pool)
        n += 1
        if args.json:
            render.append_line(args.json, json.dumps({"refresh": n, "time": time.time(),
                                                      **view}))
        if out.console is not None and out.stream.isatty():
            out.console.clear()
        out.line(f"straw top {view['pool']}  refresh {n}  {time.strftime('%H:%M:%S')}")
        render.inspect(out, view)
    return 0


def cmd_gc(args: argparse.Namespace, out: render.Out) -> int:
    from .. import orphans
    from .. import pool_view as pool
    if args.named_in and not args.release_orphans:
        raise BadInput("--named-in is for --release-orphans (or straw inspect)")
    pool.check_pool(PosixFS(), args.pool)  # bad input before any search
    chosen = [o for o in _owners(args) if o["status"] == orphans.ORPHAN] \
        if args.release_orphans else []
    released = [] if args.dry_run else orphans.release(
        args.pool, [(o["run"], o["name"]) for o in chosen])
    report = pool.collect(args.pool, dry_run=args.dry_run)
    if args.release_orphans:
        report["orphans"] = chosen
        report["released_orphans"] = [f"{run}/{name}" for run, name in released]
    _report(out, args, report, render.gc)
    return 0


def cmd_bench(args: argparse.Namespace, out: render.Out) -> int:
    from . import bench
    for name in ("rounds", "records", "record_bytes"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    with out.progress(args.rounds, "bench") as step:
        res = bench.run(args.root, rounds=args.rounds, records=args.records,
                        record_bytes=args.record_bytes, step=step)
    _report(out, args, res, render.bench)
    return 0


COMMANDS = {"qualify": cmd_qualify, "inspect": cmd_inspect, "top": cmd_top, "gc": cmd_gc,
            "bench": cmd_bench}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # its own options (--root, --keep) pass through unparsed
        from . import demo
        return demo.main(argv[1:])
    args = _parser().parse_args(argv)  # usage errors exit 2 (argparse)
    from ..pool_view import NotAPool
    out = render.Out()
    try:
        return COMMANDS[args.command](args, out)
    except (BadInput, NotAPool, UnsupportedSchema) as e:
        print(f"straw {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # e.g. --plot without matplotlib
        print(f"straw {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (StrawError, OSError) as e:
        print(f"straw {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
