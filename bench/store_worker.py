"""A store-workload worker, run as a script by ``bench.peer`` under either virtualenv.

    <python> bench/store_worker.py --impl ours|peer

straw and straw-queue are both imported as ``straw``, so each runs in its own
interpreter: this repository's ``.venv`` for ``ours``, ``.venv-peer`` for ``peer``.  The
worker loads ``workloads.py`` next to it as a plain module (run as a script, its own
directory is first on ``sys.path``, the repository root is not).

Protocol, one JSON object per line: the worker first prints ``{"hello": {...}}`` (which
implementation, version, module file, python); then for each line read from stdin,
``{"cmd": "round", "dir": DIR, "params": {...}}`` runs the three store workloads in DIR
(and those of ``tensor_workloads`` when the params name ``tensor_rows``) and prints
``{"ok": true, "result": {...}}`` (or ``{"ok": false, "error": "..."}``);
``{"cmd": "quit"}`` or end of input stops it.  Anything the libraries print goes to
stderr, so stdout carries only these lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

import tensor_workloads  # type: ignore[import-not-found]  # bench/tensor_workloads.py
import workloads  # type: ignore[import-not-found]  # bench/workloads.py, see above


def run_round(impl: workloads.Impl, directory: str, p: dict[str, int]) -> dict[str, Any]:
    os.makedirs(directory, exist_ok=True)
    tensors = tensor_workloads.run_all(impl, directory, p) if "tensor_rows" in p else {}
    return {**tensors,
        "publish_large": workloads.publish_large(
            impl, os.path.join(directory, "large"), size=p["large_size"],
            count=p["large_count"]),
        "publish_small": workloads.publish_small(
            impl, os.path.join(directory, "small"), size=p["small_size"],
            count=p["small_count"], warmup=p["small_warmup"]),
        "read_large": workloads.read_large(
            impl, os.path.join(directory, "read"), size=p["read_size"],
            count=p["read_count"], passes=p["read_passes"]),
    }


MARK = "/nonexistent-straw-bench-mark-{}"


def count_pass(impl: workloads.Impl, directory: str, count: int, size: int = 1024) -> None:
    """For syscall counting under strace (``bench.peer``): warm up, then ``count`` small
    publications between two marker ``stat`` calls of paths that cannot exist."""
    store = impl.make_store(directory)
    try:
        data = workloads.payloads(size, 16)
        for i in range(20):
            store.publish([impl.record("warm", data[i % 16])], submission_id=f"warm-{i}")
        os.path.exists(MARK.format("start"))
        for i in range(count):
            store.publish([impl.record(f"r{i}", data[i % 16])], submission_id=f"count-{i}")
        os.path.exists(MARK.format("end"))
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("ours", "peer"), required=True)
    ap.add_argument("--count-pass", nargs=2, metavar=("DIR", "N"),
                    help="run only the syscall-counting pass (under strace) and exit")
    args = ap.parse_args()
    if args.count_pass:
        impl = workloads.ours() if args.impl == "ours" else workloads.peer()
        count_pass(impl, args.count_pass[0], int(args.count_pass[1]))
        return 0
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints, from Python or native code, go to stderr
    sys.stdout = sys.stderr
    impl = workloads.ours() if args.impl == "ours" else workloads.peer()
    out.write(json.dumps({"hello": {"impl": impl.name, "version": impl.version,
                                    "module": impl.module_file,
                                    "python": sys.executable}}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        try:
            reply = {"ok": True, "result": run_round(impl, msg["dir"], msg["params"])}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
