"""Terminal output and plots for the ``straw`` command.

Tables go through rich when it is installed (the ``cli`` extra) and fall back to plain
aligned text otherwise, so the command works on a core install; ``--json`` output never
depends on either.  Plots need matplotlib (the ``plot`` extra)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..fs import PosixFS

HAVE_RICH = True
try:  # optional: the `cli` extra
    from rich import box
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover - exercised when rich is absent
    HAVE_RICH = False
    Console = None  # type: ignore[assignment,misc]
    Table = None  # type: ignore[assignment,misc]


class Out:
    """Where reports go: a rich console, or plain text on ``stream``."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.console = Console(file=self.stream, highlight=False) if HAVE_RICH else None

    def line(self, text: str = "") -> None:
        if self.console is not None:
            self.console.print(text, markup=False, soft_wrap=True)
        else:
            print(text, file=self.stream)

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        cells = [[_cell(v) for v in r] for r in rows]
        if self.console is not None:
            t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD,
                      show_header=any(headers))
            for h in headers:
                t.add_column(h, overflow="fold")
            for r in cells:
                t.add_row(*r)
            self.console.print(t)
            return
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
        print(title, file=self.stream)
        for r in ([list(headers)] if any(headers) else []) + cells:
            print(("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
                  .rstrip(), file=self.stream)

    @contextmanager
    def progress(self, total: int, what: str) -> Iterator[Any]:
        """A progress bar on a terminal (rich), otherwise silent; yields ``step(label)``."""
        if self.console is not None and self.stream.isatty():
            from rich.progress import Progress
            with Progress(console=self.console, transient=True) as p:
                task = p.add_task(what, total=total)

                def step(label: str) -> None:
                    p.update(task, advance=1, description=f"{what}: {label}")
                yield step
            return
        yield lambda label: None


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_cell(x)}" for k, x in v.items()) if v else "-"
    if isinstance(v, list):
        return ", ".join(_cell(x) for x in v) if v else "-"
    return "-" if v is None else str(v)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return str(n)


def write_json(data: Any, target: str) -> None:
    text = json.dumps(data, indent=2, sort_keys=False, default=str)
    if target == "-":
        print(text)
    else:  # through the Filesystem like every file straw writes (atomic: temp + rename)
        PosixFS().write_file_durable(os.path.abspath(target), (text + "\n").encode())


def append_line(target: str, text: str) -> None:
    """Append one line to ``target`` (created if missing), through the Filesystem."""
    fs = PosixFS()
    fd = fs.open(target, write=True, create=True)
    try:
        fs.writev(fd, [(text + "\n").encode()], fs.fstat(fd).size)
    finally:
        fs.close(fd)


# --- reports ------------------------------------------------------------------------------
def qualify(out: Out, rep: dict[str, Any]) -> None:
    where = rep["path"] + (f" + peer {rep['peer']}" if rep["peer"] else " (one client)")
    out.line(f"straw qualify {where}: {'PASS' if rep['passed'] else 'FAIL'} "
             f"({rep['seconds']} s)")
    if rep.get("declaration"):
        out.line(f"declaration {rep['declaration']['file']}: verified against the live mount")
    rows = []
    for c in rep["clauses"]:
        rows.append([c["clause"], c["verdict"].upper(), _figure(c["figures"]), c["detail"]])
    out.table("clauses", ["clause", "verdict", "p50 / p99 / max s", "detail"], rows)
    implied = dict(rep["implied"])
    declaration = implied.pop("declaration", None)
    if implied:
        out.table("implied settings", ["setting", "value"],
                  [[k, v] for k, v in implied.items()])
    if declaration is not None:
        out.line("implied declaration (profile juicefs; describe durability yourself):")
        out.line("  " + json.dumps(declaration))


def _figure(fig: dict[str, Any]) -> str:
    for w in (fig, *(v for v in fig.values() if isinstance(v, dict))):
        if isinstance(w, dict) and "p50" in w and w.get("samples"):
            return " / ".join("-" if w[k] is None else f"{w[k]:.3f}" for k in
                              ("p50", "p99", "max"))
    return ""


def inspect(out: Out, v: dict[str, Any]) -> None:
    p = v["packs"]
    out.line(f"pool {v['pool']} (format {v['format']})")
    out.table("packs", ["total", "open", "sealed", "tombstoned", "unlinked", "bytes"],
              [[p["total"], p.get("open", 0), p.get("sealed", 0), p.get("tombstoned", 0),
                p.get("unlinked", 0), human_bytes(p["bytes"])]])
    out.table("bytes by owner (packs reached)",
              ["owner", "roots", "packs", "bytes"],
              [[o, d["roots"], d["packs"], human_bytes(d["bytes"])]
               for o, d in v["owners"].items()] or [["(none)", 0, 0, "0 B"]])
    s, t, c = v["staged"], v["tombstones"], v["collectable"]
    out.table("protection and reclamation", ["staged packs", "staged bytes", "tombstones",
                                             "not unlinked", "collectable", "collectable bytes"],
              [[s["packs"], human_bytes(s["bytes"]), t["total"], t["not_unlinked"],
                c["packs"], human_bytes(c["bytes"])]])
    owners = v.get("owner_status", [])
    if owners:
        out.table("owners: what names them", ["owner", "kind", "bytes", "status", "why"],
                  [[f"{o['run']}/{o['name']}", o["kind"], human_bytes(o["bytes"]),
                    o["status"], o["why"]] for o in owners])
        orphans = [o for o in owners if o["status"] == "orphan"]
        if orphans:
            out.line(f"{len(orphans)} orphaned owners keep "
                     f"{human_bytes(sum(o['bytes'] for o in orphans))} (shared packs counted "
                     "for each): straw gc --release-orphans frees them")
    for err in v.get("errors", ()):
        out.line(f"cannot read {err}")
    if not v["queues"] and not v.get("errors"):
        out.line("no queues")
    for q in v["queues"]:
        consumers = {k: f"processed {c['processed']} of {c['fetch']} fetched"
                     for k, c in q["consumers"].items()}
        out.table(f"queue {q['queue']} (epoch {q['epoch']}{', sealed' if q['sealed'] else ''})",
                  ["", ""],
                  [["tasks by status", q["tasks"]],
                   ["open tasks by stage", q["tasks_by_stage"]],
                   ["leases by worker", q["leases_by_worker"]],
                   ["outstanding reads", q["outstanding_reads"]], ["commits", q["commits"]],
                   ["consumers", consumers], ["batches", q["batches"]],
                   ["checkpoints", len(q["checkpoints"])]])
        hist = q["staleness_histogram"]
        if hist:
            out.table("staleness", ["versions behind", "committed samples"],
                      [[k, n] for k, n in hist.items()])
        else:
            out.line("  staleness: no committed result's records carry 'staleness' metadata")


def gc(out: Out, r: dict[str, Any]) -> None:
    if "orphans" in r:
        verb = "would release" if r["dry_run"] else "released"
        out.line(f"{verb} {len(r['orphans'])} orphaned owners")
        for o in r["orphans"]:
            out.line(f"  {o['run']}/{o['name']} ({o['kind']}, {human_bytes(o['bytes'])}): "
                     f"{o['why']}")
    if r["dry_run"]:
        out.line(f"straw gc --dry-run {r['pool']}: would reclaim {r['would_reclaim_files']} "
                 f"pack files, {human_bytes(r['would_reclaim_bytes'])}; "
                 f"{r['unfinished_tombstones']} interrupted collections to finish")
        for p in r["paths"]:
            out.line(f"  {p}")
    else:
        out.line(f"straw gc {r['pool']}: reclaimed {r['reclaimed_files']} pack files, "
                 f"{human_bytes(r['reclaimed_bytes'])}; {r['retained_packs']} packs "
                 f"retained by {r['owners']} owners")


def bench(out: Out, r: dict[str, Any]) -> None:
    out.line(f"straw bench on {r['root']} ({r['rounds']} rounds of {r['records']} x "
             f"{human_bytes(r['record_bytes'])}, interleaved)")
    out.table("publish vs the machine's own limit", ["path", "MiB/s (median)", "ratio"],
              [["raw write+fdatasync", r["raw_mib_s"], 1.0],
               ["store.publish", r["publish_mib_s"], r["ratio"]],
               ["store.read (checked)", r["read_mib_s"], ""]])


# --- plots --------------------------------------------------------------------------------
def _pyplot() -> Any:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'straw-store[plot]'") from None
    return plt


def plot_inspect(v: dict[str, Any], path: str) -> None:
    plt = _pyplot()
    hists = [(q["queue"], q["staleness_histogram"]) for q in v["queues"]
             if q["staleness_histogram"]]
    fig, axes = plt.subplots(1, 1 + bool(hists), figsize=(10 if hists else 6, 4))
    ax = axes[0] if hists else axes
    owners = list(v["owners"])
    ax.barh(owners or ["(none)"], [v["owners"][o]["bytes"] / 2**20 for o in owners] or [0])
    ax.set_xlabel("MiB (packs reached)")
    ax.set_title("bytes by owner")
    if hists:
        for name, h in hists:
            axes[1].bar([int(k) for k in h], list(h.values()), alpha=0.6, label=name)
        axes[1].set_xlabel("staleness (weight versions)")
        axes[1].set_ylabel("committed samples")
        axes[1].legend()
        axes[1].set_title("staleness")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# (clause, sub-figure) series of the staleness CDF
CDF_SERIES = (("close_to_open", "lag"), ("rename_atomic", "visible"),
              ("attribute_staleness", None), ("entry_staleness", "new_name_open"),
              ("entry_staleness", "removed_name_stat"), ("listing_staleness", None))


def plot_qualify(rep: dict[str, Any], path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    by = {c["clause"]: c["figures"] for c in rep["clauses"]}
    for clause, key in CDF_SERIES:
        w = by.get(clause, {})
        w = w.get(key, {}) if key else w
        xs = sorted(w.get("values") or [])
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                    label=clause + (f" ({key})" if key else ""))
    ax.set_xlabel("seconds until the other client saw the change")
    ax.set_ylabel("fraction of samples")
    ax.set_title(f"staleness CDF: {rep['path']}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
