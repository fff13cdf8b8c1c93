"""The tensor figures of ``just bench`` and ``just bench-peer`` (issue 7).

Workloads (``bench.tensor_workloads``, run for both implementations): float32
[8192, 1024] (32 MiB) and int32 [8192, 48, 8] (12 MiB) torch tensors: publish (MiB/s),
checked ``load()`` with a warm page cache (MiB/s), one-row slice ``ref[i:i + 1]``
(median ms).

``just bench`` compares them with this machine's limits measured in the same round:
publish vs raw write+fsync (>= 0.6, as for plain records), load vs memcpy (>= 0.7), and
the slice against an absolute 0.5 ms.  ``just bench-peer`` adds the issue's targets
against straw-queue in the same run: publish and load at least 3x straw-queue's MiB/s.
"""

from __future__ import annotations

from typing import Any

from .report import fmt, fmt_summary, summary, table

KINDS = {"f32": "float32 [8192, 1024]", "i32": "int32 [8192, 48, 8]"}
PARAMS = {"tensor_rows": 8192, "tensor_count": 2, "tensor_passes": 2, "tensor_slice_reads": 200}
QUICK = {"tensor_rows": 256, "tensor_count": 1, "tensor_passes": 1, "tensor_slice_reads": 20}


def label(kind: str, rows: int) -> str:
    name = KINDS[kind]
    return name if rows == 8192 else name.replace("8192", str(rows))


def figure_specs(p: dict[str, int]) -> list[dict[str, Any]]:
    """Tensor rows of ``just bench`` (same shape as ``bench.bench.figure_specs``)."""
    specs = []
    for kind in KINDS:
        name = label(kind, p["tensor_rows"])
        specs += [
            {"key": f"tensor_{kind}_publish", "label": f"publish tensor {name}",
             "unit": "MiB/s", "value": (f"tensor_{kind}_publish", "mib_s"),
             "limit": ("raw_write", "mib_s"), "limit_label": "raw write+fsync",
             "op": ">=", "bound": 0.6},
            {"key": f"tensor_{kind}_load", "label": f"load() tensor {name}",
             "unit": "MiB/s", "value": (f"tensor_{kind}_load", "mib_s"),
             "limit": ("memcpy", "mib_s"), "limit_label": "memcpy", "op": ">=", "bound": 0.7},
            {"key": f"tensor_{kind}_slice", "label": f"one-row slice of {name}",
             "unit": "ms", "value": (f"tensor_{kind}_slice", "ms"), "limit": None,
             "limit_label": "", "op": "<=", "bound": 0.5},
        ]
    return specs


# (workload suffix, field, unit, higher is better, limit, target on ours/peer)
PEER_ROWS = [
    ("publish", "mib_s", "MiB/s", True, None, 3.0),
    ("load", "mib_s", "MiB/s", True, ("memcpy", "mib_s"), 3.0),
    ("slice", "ms", "ms", False, None, None),
]


def peer_figures(rounds: list[dict[str, Any]], p: dict[str, int]) -> dict[str, Any]:
    """ours vs peer for every tensor workload, with the issue's targets."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        for wl, field, unit, higher, limit, vs_peer in PEER_ROWS:
            key = f"tensor_{kind}_{wl}"
            ours = [rd["ours"][key][field] for rd in rounds]
            peer = [rd["peer"][key][field] for rd in rounds]
            ratio = summary([a / b for a, b in zip(ours, peer, strict=True)])
            fig: dict[str, Any] = {
                "label": f"{wl} tensor {label(kind, p['tensor_rows'])}", "unit": unit,
                "higher_is_better": higher, "ours": summary(ours), "peer": summary(peer),
                "ours_over_peer": ratio, "checks": []}
            if vs_peer is not None:
                fig["checks"].append({"what": "ours/peer", "op": ">=", "bound": vs_peer,
                                      "value": ratio["median"],
                                      "pass": ratio["median"] >= vs_peer})
            if limit is not None:
                lim = [rd["limits"][limit[0]][limit[1]] for rd in rounds]
                r = summary([a / b for a, b in zip(ours, lim, strict=True)])
                fig["limit"] = {**summary(lim), "name": limit[0]}
                fig["ours_over_limit"] = r
                fig["checks"].append({"what": f"ours/{limit[0]}", "op": ">=", "bound": 0.7,
                                      "value": r["median"], "pass": r["median"] >= 0.7})
            if wl == "slice":
                med = fig["ours"]["median"]
                fig["checks"].append({"what": "ours median ms", "op": "<=", "bound": 0.5,
                                      "value": med, "pass": med <= 0.5})
            out[key] = fig
    return out


def print_peer_table(figures: dict[str, Any]) -> None:
    rows = []
    for fig in figures.values():
        checks = "; ".join(f"{c['what']} {fmt(c['value'])} {c['op']} {c['bound']:g}: "
                           f"{'PASS' if c['pass'] else 'MISS'}" for c in fig["checks"])
        rows.append([f"{fig['label']} ({fig['unit']})", fmt_summary(fig["ours"]),
                     fmt_summary(fig["peer"]), fmt_summary(fig["ours_over_peer"]),
                     "higher" if fig["higher_is_better"] else "lower", checks])
    print(table(["tensor figure", "straw [min-max]", "straw-queue [min-max]",
                 "ours/peer [min-max]", "better", "targets"], rows))


def round_line(rd: dict[str, Any]) -> str:
    """A progress fragment for one round of ``just bench``."""
    parts = []
    for kind in KINDS:
        parts.append(f"{kind}: publish {fmt(rd[f'tensor_{kind}_publish']['mib_s'])}, load "
                     f"{fmt(rd[f'tensor_{kind}_load']['mib_s'])} MiB/s, row "
                     f"{fmt(rd[f'tensor_{kind}_slice']['ms'])} ms")
    return "; ".join(parts)
