"""The demo: straw's main job on an embedded default pool (a temp directory).

    python3 dev.py demo            # or: python -m straw.demo [--root DIR] [--keep]

1. publishes records of several sizes (1 KiB .. 16 MiB) and a ``publish_many`` batch
   with a dependency, and reads every one back checked;
2. starts a writer process that publishes 4 MiB records as fast as it can and logs each
   acknowledged reference, SIGKILLs it mid-publication, then reopens the same writer id:
   every acknowledged publication reads back intact, the retried last submission returns
   its original reference, and the next writer incarnation starts cleanly;
3. publishes a rollout's tensors (int32 expert routes [tokens, 48, 8] and float32
   log-probs) with ``straw.tensor``, loads them back checked and reads one row, which
   verifies only the one chunk it touches;
4. runs a work queue: prompt tasks leased in priority order, results accepted exactly once,
   read by the trainer, and recovered by a new coordinator epoch;
5. prints what it verified and the pack files and bytes on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from .coordinator import Coordinator
from .fs import PosixFS
from .protocol import TaskSpec
from .publication_log import AckLog
from .refs import Publication, Record, RecordSetRef
from .store import SharedFilesystemStore
from .tensor import CHUNK_BYTES, publish_tensors

RUN = "demo"
SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}


def _payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def child(root: str, ack_path: str) -> None:
    """The writer that gets killed: publish forever, log every acknowledgement."""
    log = AckLog(PosixFS(), ack_path)
    with SharedFilesystemStore(root, RUN, writer_id="rollout-0") as store:
        i = 0
        while True:
            ref = store.publish([Record("sample", _payload(i, 4 << 20), metadata={"i": i})],
                                submission_id=f"sample-{i}")
            log.append({"submission_id": f"sample-{i}", "seed": i, "ref": ref.to_dict()})
            i += 1


def tensors_step(root: str, tokens: int = 4096) -> dict[str, object]:
    """Publish a rollout's routes and log-probs, load them, read one row."""
    rng = np.random.default_rng(7)
    routes = rng.integers(0, 128, (tokens, 48, 8), dtype=np.int32)
    logprobs = -rng.random(tokens, dtype=np.float32)
    with SharedFilesystemStore(root, RUN, writer_id="rollout-tensors") as store:
        r_ref, l_ref = publish_tensors(store, {"routes": routes, "logprobs": logprobs},
                                       submission_id="rollout-0-tensors")
        assert np.array_equal(r_ref.load(), routes)
        assert np.array_equal(l_ref.load(), logprobs)
        row = 1234
        assert np.array_equal(r_ref[row:row + 1], routes[row:row + 1])
        row_bytes = 48 * 8 * 4
    return {"tensor_bytes": routes.nbytes + logprobs.nbytes,
            "tensor_chunks": sum(-(-a.nbytes // CHUNK_BYTES) for a in (routes, logprobs)),
            "row_bytes": row_bytes, "chunk_bytes": CHUNK_BYTES,
            "route_shape": r_ref.shape, "row_chunk": row * row_bytes // CHUNK_BYTES}


def queue_step(root: str, tasks: int = 6) -> dict[str, object]:
    """The rollout loop in miniature: prompts become tasks, a worker leases each, publishes
    its sample naming the lease, and the queue accepts it exactly once; the trainer reads
    the commit log, records its progress, and processed history is retired."""
    with SharedFilesystemStore(root, RUN, writer_id="producer") as producer, \
            SharedFilesystemStore(root, RUN, writer_id="worker-0") as worker, \
            SharedFilesystemStore(root, RUN, writer_id="trainer-q") as trainer:
        q = Coordinator(trainer, queue_id="rollout", exclusive_owner="the demo's only process")
        prompts = [producer.publish([Record("prompt", f"prompt {i}".encode())],
                                    submission_id=f"prompt-{i}") for i in range(tasks)]
        q.submit_tasks("prompts-0", [TaskSpec(f"p{i}", input_ref=ref, priority=i % 2)
                                     for i, ref in enumerate(prompts)])
        order = []
        while (got := q.acquire("worker-0")).status == "acquired":
            (a,) = got.assignments
            order.append(a.task.task_id)
            assert a.task.input_ref is not None
            (prompt,) = worker.read(a.task.input_ref)
            out = worker.publish([Record("sample", bytes(prompt.payload) + b" -> answer",
                                         metadata={"task_id": a.lease.task_id,
                                                   "attempt_id": a.lease.attempt_id})],
                                 submission_id=f"sample-{a.lease.task_id}")
            receipt = q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}",
                                      result_ref=out)
            again = q.complete_task(a.lease, submission_id=f"done-{a.lease.task_id}",
                                    result_ref=out)  # a retry after a lost reply
            assert again == receipt
        page = q.read_commits(0, 100)
        for c in page.commits:
            (rec,) = trainer.read(c.result_ref)
            assert bytes(rec.payload).endswith(b" -> answer")
        token = q.open_consumer("training", exclusive_owner="the demo's one trainer")
        state = trainer.publish([Record("trainer-state", b"step 1")],
                                submission_id="trainer-state-1")
        q.save_consumer_state("training", token=token, request_id="trained-1",
                              state_ref=state, fetch_cursor=page.cursor,
                              processed_cursor=page.cursor)
        q.close()
        # the coordinator "dies"; a new one recovers the same queue under a new epoch
        q = Coordinator(trainer, queue_id="rollout", recover=True,
                        exclusive_owner="the demo's only process (the old one is closed)")
        assert [c.task_id for c in q.read_commits(0, 100).commits] == order
        epoch = q.epoch
        q.close()
    return {"tasks": tasks, "order": order, "commits": len(page.commits), "epoch": epoch}


def run(root: str) -> dict[str, object]:
    report: dict[str, object] = {}
    # 1. several sizes, a batch with a dependency, checked reads
    with SharedFilesystemStore(root, RUN, writer_id="trainer") as store:
        refs = {}
        for n, (name, size) in enumerate(SIZES.items()):
            refs[name] = store.publish(
                [Record(f"payload-{name}", _payload(n, size), metadata={"size": size})],
                submission_id=f"sizes-{name}",
            )
        batch = store.publish_many(
            [Publication([Record("prompt", b"What is 2+2?", codec="bytes.v1")]),
             Publication([Record("answer", json.dumps({"text": "4"}).encode(),
                                 codec="json.v1")], dependencies=[0, refs["1KiB"]])],
            submission_id="batch-0",
        )
        for n, (name, size) in enumerate(SIZES.items()):
            (rec,) = store.read(refs[name])
            assert rec.payload == _payload(n, size), name
        deps = store.checked_manifest(batch[1]).dependencies
        assert deps == (batch[0], refs["1KiB"])
        report["sizes_verified"] = list(SIZES)
        report["batch_dependencies_verified"] = len(deps)

    report["tensors"] = tensors_step(root)
    report["queue"] = queue_step(root)

    # 2. a writer killed mid-publication
    ack_path = os.path.join(root, "acks.log")
    proc = subprocess.Popen([sys.executable, "-m", "straw.demo", "--child", root, ack_path])
    log = AckLog(PosixFS(), ack_path)
    deadline = time.monotonic() + 120
    while len(log.read()) < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    acks = log.read()
    if not acks:
        raise RuntimeError("the writer process acknowledged nothing; see its output above")
    with SharedFilesystemStore(root, RUN, writer_id="rollout-0") as store:
        for a in acks:
            (rec,) = store.read(RecordSetRef.from_dict(a["ref"]))
            assert rec.payload == _payload(a["seed"], 4 << 20), a["submission_id"]
        last = acks[-1]
        again = store.publish([Record("sample", _payload(last["seed"], 4 << 20),
                                      metadata={"i": last["seed"]})],
                              submission_id=last["submission_id"])
        assert again == RecordSetRef.from_dict(last["ref"])
        nxt = len(acks)
        fresh = store.publish([Record("sample", _payload(nxt, 4 << 20), metadata={"i": nxt})],
                              submission_id=f"sample-{nxt}")
        (rec,) = store.read(fresh)
        assert rec.payload == _payload(nxt, 4 << 20)
        report["killed_writer_acknowledged"] = len(acks)
        report["killed_writer_verified"] = len(acks)
        report["retry_returned_original_reference"] = True
        report["new_incarnation"] = store.writer_info()
        report["disk"] = store.disk_usage()
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", help="pool directory (default: a fresh temp directory)")
    p.add_argument("--keep", action="store_true", help="keep the temp pool afterwards")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    root = args.root or tempfile.mkdtemp(prefix="straw-demo-")
    t0 = time.monotonic()
    try:
        report = run(root)
    finally:
        if not args.root and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    disk = report["disk"]
    assert isinstance(disk, dict)
    print(f"straw demo: pool {root}{'' if args.root or args.keep else ' (removed)'}")
    print(f"  published and read back checked: {', '.join(report['sizes_verified'])} "  # type: ignore[arg-type]
          f"records, and a batch with {report['batch_dependencies_verified']} dependencies")
    print(f"  writer SIGKILLed mid-publication after {report['killed_writer_acknowledged']} "
          f"acknowledged publications: all {report['killed_writer_verified']} read back intact")
    print("  retrying the last submission id returned its original reference; the writer "
          f"restarted as {report['new_incarnation']}")
    t = report["tensors"]
    assert isinstance(t, dict)
    print(f"  tensors: int32 routes {list(t['route_shape'])} and float32 log-probs "
          f"({t['tensor_bytes']:,} bytes) published zero-copy and loaded back, all "
          f"{t['tensor_chunks']} chunks of {t['chunk_bytes'] // 1024} KiB verified; a one-row "
          f"read ({t['row_bytes']:,} bytes) verified only chunk {t['row_chunk']}")
    qr = report["queue"]
    assert isinstance(qr, dict)
    print(f"  queue: {qr['tasks']} prompt tasks leased in priority order {qr['order']}, each "
          f"result accepted exactly once (a retried completion returned the same receipt); "
          f"the trainer read {qr['commits']} commits and the queue recovered them at epoch "
          f"{qr['epoch']}")
    print(f"  on disk: {disk['pack_files']} pack files, {disk['bytes']:,} bytes "
          f"({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
