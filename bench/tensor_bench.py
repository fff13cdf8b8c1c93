"""The tensor figures of ``just bench`` and ``just bench-peer`` (issues 7 and 13).

Workloads (``bench.tensor_workloads``, run for both implementations): float32
[8192, 1024] (32 MiB) and int32 [8192, 48, 8] (12 MiB) torch tensors: publish (MiB/s),
checked ``load()``, ``load(out=x)`` into a reused tensor and ``ref[1:n - 1]`` (rows()
cutting a checksum chunk at both ends) with a warm page cache (MiB/s of the median
call), one-row slice ``ref[i:i + 1]`` (median ms).

``just bench`` compares them with this machine's limits: publish vs raw write+fsync
measured in the same round (>= 0.6, as for plain records); the three loads vs a 16 MiB
memcpy timed right before each call, alternating with it in the same process (>= 0.7:
issue 13); the slice against an absolute 0.5 ms.  The disk and the page cache of these
machines are bimodal from run to run (the same copy or read runs at very different
speeds in different runs), so only ratios measured in the same run count, never a MiB/s
figure compared across runs.  ``just bench-peer`` adds the issue's targets against
straw-queue in the same run: publish and load at least 3x straw-queue's MiB/s, and each
side's load against its own alternating memcpy.
"""

from __future__ import annotations

from typing import Any

from .report import fmt, fmt_summary, summary, table

KINDS = {"f32": "float32 [8192, 1024]", "i32": "int32 [8192, 48, 8]"}
PARAMS = {"tensor_rows": 8192, "tensor_count": 2, "tensor_passes": 5, "tensor_slice_reads": 200}
QUICK = {"tensor_rows": 256, "tensor_count": 1, "tensor_passes": 1, "tensor_slice_reads": 20}


def label(kind: str, rows: int) -> str:
    name = KINDS[kind]
    return name if rows == 8192 else name.replace("8192", str(rows))


# the load figures: (prefix of the workload's keys, label); each against its own memcpy
LOADS = [("", "load()"), ("out_", "load(out=x)"), ("rows_", "rows(1, n-1)")]
LOAD_TARGET = 0.7  # of memcpy (issue 13)


def figure_specs(p: dict[str, int]) -> list[dict[str, Any]]:
    """Tensor rows of ``just bench`` (same shape as ``bench.bench.figure_specs``)."""
    specs = []
    for kind in KINDS:
        name = label(kind, p["tensor_rows"])
        load = f"tensor_{kind}_load"
        specs.append(
            {"key": f"tensor_{kind}_publish", "label": f"publish tensor {name}",
             "unit": "MiB/s", "value": (f"tensor_{kind}_publish", "mib_s"),
             "limit": ("raw_write", "mib_s"), "limit_label": "raw write+fsync",
             "op": ">=", "bound": 0.6})
        for prefix, what in LOADS:
            specs.append(
                {"key": f"tensor_{kind}_{prefix}load", "label": f"{what} tensor {name}",
                 "unit": "MiB/s", "value": (load, f"{prefix}mib_s"),
                 "limit": (load, f"{prefix}memcpy_mib_s"),
                 "limit_label": "memcpy, alternating", "op": ">=", "bound": LOAD_TARGET})
        specs.append(
            {"key": f"tensor_{kind}_slice", "label": f"one-row slice of {name}",
             "unit": "ms", "value": (f"tensor_{kind}_slice", "ms"), "limit": None,
             "limit_label": "", "op": "<=", "bound": 0.5})
    return specs


def peer_figures(rounds: list[dict[str, Any]], p: dict[str, int]) -> dict[str, Any]:
    """ours vs peer for every tensor workload, with the issue's targets; each side's loads
    also against the memcpy it timed alternately with them (straw-queue has no
    ``load(out=)``: that figure is ours alone)."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        name = label(kind, p["tensor_rows"])
        # (figure key, label, workload, field, unit, higher is better, target ours/peer,
        #  memcpy field of the workload or None)
        rows: list[tuple[str, str, str, str, str, bool, float | None, str | None]] = [
            ("publish", f"publish tensor {name}", "publish", "mib_s", "MiB/s", True, 3.0,
             None)]
        rows += [(f"{prefix}load", f"{what} tensor {name}", "load", f"{prefix}mib_s",
                  "MiB/s", True, 3.0 if prefix == "" else None, f"{prefix}memcpy_mib_s")
                 for prefix, what in LOADS]
        rows.append(("slice", f"one-row slice of {name}", "slice", "ms", "ms", False, None,
                     None))
        for key, text, wl, field, unit, higher, vs_peer, memcpy in rows:
            src = f"tensor_{kind}_{wl}"
            ours = [rd["ours"][src][field] for rd in rounds]
            peer_has = all(field in rd["peer"][src] for rd in rounds)
            peer = [rd["peer"][src][field] for rd in rounds] if peer_has else None
            fig: dict[str, Any] = {
                "label": text, "unit": unit, "higher_is_better": higher,
                "ours": summary(ours), "peer": summary(peer) if peer else None,
                "ours_over_peer": None, "checks": []}
            if peer:
                ratio = summary([a / b for a, b in zip(ours, peer, strict=True)])
                fig["ours_over_peer"] = ratio
                if vs_peer is not None:
                    fig["checks"].append({"what": "ours/peer", "op": ">=", "bound": vs_peer,
                                          "value": ratio["median"],
                                          "pass": ratio["median"] >= vs_peer})
            if memcpy is not None:
                for side, vals in (("ours", ours), ("peer", peer)):
                    if vals is None:
                        continue
                    lim = [rd[side][src][memcpy] for rd in rounds]
                    r = summary([a / b for a, b in zip(vals, lim, strict=True)])
                    fig[f"{side}_over_memcpy"] = r
                    if side == "ours":
                        fig["checks"].append(
                            {"what": "ours/memcpy", "op": ">=", "bound": LOAD_TARGET,
                             "value": r["median"], "pass": r["median"] >= LOAD_TARGET})
            if wl == "slice":
                med = fig["ours"]["median"]
                fig["checks"].append({"what": "ours median ms", "op": "<=", "bound": 0.5,
                                      "value": med, "pass": med <= 0.5})
            out[f"tensor_{kind}_{key}"] = fig
    return out


def print_peer_table(figures: dict[str, Any]) -> None:
    rows = []
    for fig in figures.values():
        checks = "; ".join(f"{c['what']} {fmt(c['value'])} {c['op']} {c['bound']:g}: "
                           f"{'PASS' if c['pass'] else 'MISS'}" for c in fig["checks"])
        memcpy = " / ".join(fmt_summary(fig[f"{side}_over_memcpy"]) if f"{side}_over_memcpy"
                            in fig else "-" for side in ("ours", "peer"))
        rows.append([f"{fig['label']} ({fig['unit']})", fmt_summary(fig["ours"]),
                     fmt_summary(fig["peer"]), fmt_summary(fig["ours_over_peer"]),
                     "higher" if fig["higher_is_better"] else "lower",
                     memcpy if "ours_over_memcpy" in fig else "-", checks])
    print(table(["tensor figure", "straw [min-max]", "straw-queue [min-max]",
                 "ours/peer [min-max]", "better", "vs memcpy: straw / straw-queue",
                 "targets"], rows))
    print(NOTE)


NOTE = ("memcpy, alternating: a 16 MiB NumPy copy timed right before every load call in "
        "the same process; ratios are medians of per-round ratios.  This machine's disk "
        "and page cache are bimodal from run to run: only ratios measured in the same "
        "run count.")


def cpu_line(rounds: list[dict[str, Any]]) -> str:
    """The loads' CPU-time ratios to memcpy (medians over rounds): immune to other
    processes taking the cores, which the MiB/s ratios are not."""
    parts = []
    for kind in KINDS:
        ld = [rd[f"tensor_{kind}_load"] for rd in rounds]
        vals = []
        for prefix, what in LOADS:
            got = [x[f"{prefix}cpu_vs_memcpy"] for x in ld
                   if x.get(f"{prefix}cpu_vs_memcpy") is not None]
            vals.append(f"{what} {fmt_summary(summary(got)) if got else '-'}")
        parts.append(f"{kind}: " + ", ".join(vals))
    shares = [x.get("two_threads") for rd in rounds for kind in KINDS
              for x in (rd[f"tensor_{kind}_load"],)]
    known = [v for v in shares if v is not None]
    helped = (f"; large loads read with a second thread (a CPU idle, and timing showed it pays): "
              f"{100 * sum(known) / len(known):.0f}%" if known else "")
    return ("loads vs memcpy in CPU time of the process (all threads; not inflated while "
            "other processes hold the cores): " + "; ".join(parts) + helped)


def _split_med(loads: list[dict[str, Any]], prefix: str) -> str:
    """The median wall-clock and CPU-time ratios to memcpy of one load figure."""
    wall = summary([x[f"{prefix}vs_memcpy"] for x in loads])["median"]
    cpu = [x[f"{prefix}cpu_vs_memcpy"] for x in loads
           if x.get(f"{prefix}cpu_vs_memcpy") is not None]
    return f"{fmt(wall)} ({fmt(summary(cpu)['median']) if cpu else '-'} CPU)"


def split_line(rounds: list[dict[str, Any]]) -> str:
    """Where ``load(out=x)``'s time goes on one thread (medians over rounds of each figure
    against its own alternating memcpy): straw's load method in bare loops into the same
    buffer (``tensor_workloads._Bare``): the preads alone (the copy out of the page cache),
    the preads with each chunk hashed as its block lands (the method's floor), then what
    the library adds (its ``load(out=x)`` over the bare loop)."""
    parts = []
    for kind in KINDS:
        ld = [rd[f"tensor_{kind}_load"] for rd in rounds]
        if not all("bare_vs_memcpy" in x for x in ld):
            return ""
        over = summary([x["out_mib_s"] / x["bare_mib_s"] for x in ld])["median"]
        parts.append(f"{kind}: preads alone {_split_med(ld, 'preads_')}, preads + hash "
                     f"{_split_med(ld, 'bare_')}, load(out=x) {_split_med(ld, 'out_')}, "
                     f"{fmt(over)} of the bare loop's MiB/s")
    return ("where a one-thread load's time goes, x memcpy alternating (in CPU time): the "
            "page-cache copy, then with its chunks hashed in cache, in bare loops; then "
            "load(out=x): " + "; ".join(parts))


def round_line(rd: dict[str, Any]) -> str:
    """A progress fragment for one round of ``just bench``."""
    parts = []
    for kind in KINDS:
        ld = rd[f"tensor_{kind}_load"]
        parts.append(f"{kind}: publish {fmt(rd[f'tensor_{kind}_publish']['mib_s'])} MiB/s, "
                     f"load {fmt(ld['vs_memcpy'])} / out {fmt(ld['out_vs_memcpy'])} / rows "
                     f"{fmt(ld['rows_vs_memcpy'])} x memcpy, row "
                     f"{fmt(rd[f'tensor_{kind}_slice']['ms'])} ms")
    return "; ".join(parts)
