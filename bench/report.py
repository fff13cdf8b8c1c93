"""Summaries (median with spread) and the printed tables of the benchmarks."""

from __future__ import annotations

import datetime
import json
import os
import statistics
from collections.abc import Sequence
from typing import Any


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median with its spread (min, max) over rounds."""
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals), "values": vals}


def fmt(x: float | None, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, without exponent for usual ranges."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 10 ** digits:
        return f"{x:.0f}"
    decimals = max(0, digits - 1 - int(f"{mag:e}".split("e")[1]))
    return f"{x:.{decimals}f}"


def fmt_summary(s: dict[str, Any] | None, digits: int = 3) -> str:
    if s is None:
        return "-"
    if s["min"] == s["max"]:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)), line]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def filesystem_of(path: str) -> dict[str, str]:
    """Mount point, device and type of the filesystem holding ``path`` (Linux)."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, kind = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[0]):
                    best = (mnt, dev, kind)
    except OSError:
        pass
    return {"mount": best[0], "device": best[1], "type": best[2]}


def machine() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load]}


def cpu_snapshot() -> tuple[float, float]:
    """(CPU seconds used by everything on the machine, by this process and its
    children); Linux /proc/stat, (0, 0) elsewhere."""
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, ours
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # minus idle, iowait
    return busy / os.sysconf("SC_CLK_TCK"), ours


def others_cpu(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """How many cores other processes kept busy on average between two snapshots (the
    benchmark's own noise indicator)."""
    if not before[0] or wall <= 0:
        return 0.0
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / wall)


def machine_after(before: dict[str, Any], cpu0: tuple[float, float],
                  duration: float) -> dict[str, Any]:
    """``machine()`` at the end of a run, with ``others_cpu_cores`` since ``cpu0``; prints
    the closing line (duration, load before and after, the other processes' CPU)."""
    after = machine()
    after["others_cpu_cores"] = others_cpu(cpu0, cpu_snapshot(), duration)
    print(f"{duration:.0f} s; load {before['loadavg']} -> {after['loadavg']}; other processes "
          f"kept {after['others_cpu_cores']:.2f} of {after['cpus']} cores busy on average")
    return after


def utc_iso(t: float) -> str:
    """A ``time.time()`` value as an ISO 8601 UTC time to the second."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` as indented JSON to ``path`` and say so."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"wrote {path}")


def scaling_bounds(single_rate: float, coord_cpu_ms: float, client_cpu_ms: float,
                   cores: int) -> dict[str, float]:
    """The best "N clients over 1" ratio this machine allows, from figures of one run
    (the queue bench's client processes, the rollout bench's generation processes).

    One client waits for each reply, so its rate is ``single_rate`` (1 / wall time per
    completion, sync waits included).  N clients can do no better than all ``cores`` busy
    with the CPU a completion costs at N clients (coordinator + clients, ms), nor better
    than the coordinator's one interpreter thread (its GIL) running flat out.  Either bound
    over the one-client rate is a ceiling on the ratio, whatever the code does: when it is
    below the target, the target needs more cores or less CPU per completion."""
    wall_single_ms = 1e3 / single_rate
    return {"cores": float(cores),
            "cores_bound": cores * wall_single_ms / (coord_cpu_ms + client_cpu_ms),
            "coordinator_bound": wall_single_ms / coord_cpu_ms}
