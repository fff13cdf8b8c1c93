"""The tensor workloads, written once for straw and straw-queue (both ``straw.tensor``).

Like ``workloads``, this module imports neither implementation at module level and uses
no relative imports, so ``bench/store_worker.py`` loads it as a plain module under either
interpreter.  Tensors are torch tensors for both (straw-queue's tensor module needs torch);
each implementation's store keeps its defaults, except that straw-queue must be told
about the ``tensor.v1`` codec (straw has it built in).

* ``tensor_publish``: ``count`` publications of one tensor each (after one untimed
  warm-up); tensor MiB/s over the timed publications.
* ``tensor_load``: ``load()`` of ``count`` published tensors, page cache warm (each is
  loaded and compared once, then loaded once more untimed), ``passes`` passes; then the
  same for ``load(out=x)`` into one reused tensor (straw only: straw-queue has no
  ``out``) and for ``ref[1:n - 1]`` (rows(): all but the first and the last row, so both
  ends cut a checksum chunk).  Every timed call follows a 16 MiB memcpy (NumPy, into a
  pre-faulted buffer, right after an untimed one) timed in the same process, so each
  figure has its own memcpy measured alternately with it.  MiB/s of the median call
  (``mib_s``, ``out_mib_s``, ``rows_mib_s``; the memcpy figures, cache-warm, are medians
  too) and of the mean (``mean_mib_s``): a median is what the memcpy limit uses, and on
  two shared cores one preempted call in a handful moves a mean by more than any change
  of the code.  ``cpu_vs_memcpy`` (and ``out_``, ``rows_``): the same ratio in CPU
  time of the whole process (``time.process_time``, every thread), which other
  processes holding the cores do not inflate: how much work a load costs against a
  memcpy, where the MiB/s ratios say how long it took.  ``two_threads`` (and ``out_``,
  ``rows_``): the share of the timed calls' spans of 8 MiB or more that straw read with a
  second thread (``straw.tensor._helpers``, which decides it from present signals; None
  for straw-queue).  For straw, ``preads_`` and ``bare_`` (the same fields): its
  one-thread load method in bare loops into ``load(out=x)``'s buffer (``_Bare``: the
  preads alone, then with every chunk hashed as its block lands), timed the same way, so
  that a load's time splits into the copy, the hash and what the library adds.
* ``tensor_slice``: ``ref[i:i + 1]`` one-row reads at seeded random rows of one tensor
  (after 20 untimed reads); median and p90 latency in ms.
"""

from __future__ import annotations

import importlib
import os
import shutil
import statistics
import time
from typing import Any

MiB = 1024 * 1024
RUN_ID = "bench"
SHAPES = {"f32": ((8192, 1024), "float32"), "i32": ((8192, 48, 8), "int32")}

_TENSORS: dict[tuple[Any, ...], list[Any]] = {}


def shape_of(kind: str, rows: int) -> tuple[tuple[int, ...], str]:
    shape, dtype = SHAPES[kind]
    return (rows, *shape[1:]), dtype


def tensors(shape: tuple[int, ...], dtype: str, count: int) -> list[Any]:
    """``count`` distinct seeded random torch tensors (made once per process)."""
    import torch

    key = (shape, dtype, count)
    if key not in _TENSORS:
        g = torch.Generator().manual_seed(1234)
        if dtype == "float32":
            made = [torch.randn(shape, generator=g) for _ in range(count)]
        else:
            made = [torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int32)
                    for _ in range(count)]
        _TENSORS[key] = made
    return _TENSORS[key]


def _store(impl: Any, root: str) -> Any:
    if impl.name == "straw-queue":
        straw = importlib.import_module("straw")
        return straw.SharedFilesystemStore(root, RUN_ID,
                                           codecs=("bytes.v1", "json.v1", "tensor.v1"))
    return impl.make_store(root)


def _publish_tensors() -> Any:
    return importlib.import_module("straw.tensor").publish_tensors


def tensor_publish(impl: Any, root: str, *, shape: tuple[int, ...], dtype: str,
                   count: int = 2) -> dict[str, Any]:
    publish = _publish_tensors()
    data = tensors(shape, dtype, count + 1)
    nbytes = data[0].numel() * data[0].element_size()
    store = _store(impl, root)
    try:
        publish(store, {"x": data[count]}, submission_id="warm")
        times = []
        for i in range(count):
            t0 = time.perf_counter()
            publish(store, {"x": data[i]}, submission_id=f"t-{i}")
            times.append(time.perf_counter() - t0)
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"mib_s": nbytes * count / MiB / sum(times), "seconds": sum(times),
            "per_publication_s": times}


MEMCPY_BYTES = 16 * MiB  # as bench.limits.memcpy (the limit of ``just bench``)


class _Memcpy:
    """A 16 MiB NumPy copy into a pre-faulted buffer: ``bench.limits.memcpy``, one timed
    repetition at a time so that it alternates with the calls it is compared with.  Each
    timed copy follows an untimed one, so that it runs cache-warm as the back-to-back
    repetitions of ``bench.limits.memcpy`` do (the strict limit), not with the caches a
    tensor load just flushed."""

    def __init__(self) -> None:
        import numpy as np

        self.src = np.frombuffer(os.urandom(MEMCPY_BYTES), dtype=np.uint8)
        self.dst = np.empty_like(self.src)
        self.copy = np.copyto
        self.copy(self.dst, self.src)  # fault the destination pages in

    def seconds(self) -> tuple[float, float]:
        """(wall, CPU) seconds of one cache-warm copy."""
        self.copy(self.dst, self.src)
        return _timed(lambda: self.copy(self.dst, self.src))


def _timed(call: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all its threads) of ``call()``; the
    CPU time does not grow while other processes hold the cores."""
    c0, t0 = time.process_time(), time.perf_counter()
    got = call()
    t1, c1 = time.perf_counter(), time.process_time()
    del got
    return t1 - t0, c1 - c0


def _alternating(memcpy: _Memcpy, calls: list[Any], passes: int
                 ) -> tuple[list[tuple[float, float]], list[tuple[float, float]], float | None]:
    """((wall, CPU) seconds of every call, of every memcpy, the share of the large spans
    the timed calls read that straw read with a second thread, or None for an
    implementation without that choice): ``passes`` times each call, each right after
    one memcpy."""
    helpers = getattr(importlib.import_module("straw.tensor"), "_helpers", None)
    times, copies, spans, helped = [], [], 0, 0
    for _ in range(passes):
        for call in calls:
            copies.append(memcpy.seconds())
            before = (helpers.spans, helpers.helped) if helpers is not None else (0, 0)
            times.append(_timed(call))
            if helpers is not None:
                spans += helpers.spans - before[0]
                helped += helpers.helped - before[1]
    return times, copies, helped / spans if spans else None


class _Bare:
    """straw's one-thread load method in a bare loop (straw only: the pack is found through
    its read session): ``preads`` reads the payload into ``out`` in the load's blocks
    (``straw.tensor._READ_BYTES``, one descriptor opened ahead, as the session holds one),
    ``preads_hashed`` also hashes each checksum chunk right after its block lands and
    compares it with the published digest, as ``load()`` does on one thread.  Timed against
    the same alternating memcpy as ``load(out=x)`` (the same buffer), they split a load's
    time into the copy from the page cache, the hash, and what the library adds."""

    def __init__(self, ref: Any, out: Any) -> None:
        import xxhash

        tensor = importlib.import_module("straw.tensor")
        session = ref._session()
        digests, path, self.origin, self.chunk = ref._checked(session)
        self.digests = [digests[i:i + 16] for i in range(0, len(digests), 16)]
        self.fd = os.open(os.path.join(session.root, path), os.O_RDONLY | os.O_CLOEXEC)
        self.view = memoryview(out.reshape(-1).view(importlib.import_module("torch").uint8)
                               .numpy()).cast("B")
        self.block = max(1, tensor._READ_BYTES // self.chunk) * self.chunk
        self.digest = xxhash.xxh3_128_digest

    def preads(self) -> None:
        view, fd, origin = self.view, self.fd, self.origin
        for lo in range(0, view.nbytes, self.block):
            os.preadv(fd, [view[lo:lo + self.block]], origin + lo)

    def preads_hashed(self) -> None:
        view, fd, origin, c, digest = self.view, self.fd, self.origin, self.chunk, self.digest
        for lo in range(0, view.nbytes, self.block):
            os.preadv(fd, [view[lo:lo + self.block]], origin + lo)
            for pos in range(lo, min(lo + self.block, view.nbytes), c):
                if digest(view[pos:pos + c]) != self.digests[pos // c]:
                    raise AssertionError("bare loop: a chunk fails its checksum")

    def close(self) -> None:
        os.close(self.fd)


def tensor_load(impl: Any, root: str, *, shape: tuple[int, ...], dtype: str, count: int = 2,
                passes: int = 5) -> dict[str, Any]:
    import torch

    publish = _publish_tensors()
    data = tensors(shape, dtype, count)
    nbytes = data[0].numel() * data[0].element_size()
    row = nbytes // shape[0]
    memcpy = _Memcpy()
    store = _store(impl, root)
    bare: list[_Bare] = []
    try:
        refs = [publish(store, {"x": t}, submission_id=f"l-{i}")[0]
                for i, t in enumerate(data)]
        out = torch.empty_like(data[0])
        with_out = impl.name != "straw-queue"  # straw-queue's load() has no out=
        for ref, t in zip(refs, data, strict=True):  # check the content once
            got = ref.load()
            if not torch.equal(got, t):
                raise AssertionError(f"{impl.name}: loaded tensor differs from the published")
            if not torch.equal(ref[1:shape[0] - 1], t[1:shape[0] - 1]):
                raise AssertionError(f"{impl.name}: rows differ from the published")
            if with_out and (ref.load(out=out) is not out or not torch.equal(out, t)):
                raise AssertionError(f"{impl.name}: load(out=) differs from the published")
            del got
        for ref in refs:  # warm pass
            got = ref.load()
            del got
        result: dict[str, Any] = {}
        kinds: list[tuple[str, list[Any], int]] = [
            ("", [ref.load for ref in refs], nbytes),
            ("rows_", [lambda ref=ref: ref[1:shape[0] - 1] for ref in refs],
             nbytes - 2 * row)]
        if with_out:
            kinds.append(("out_", [lambda ref=ref: ref.load(out=out) for ref in refs],
                          nbytes))
            # where load(out=x)'s time goes: its method in bare loops into the same buffer
            bare = [_Bare(ref, out) for ref in refs]
            for b in bare:  # (the bare loop checks what it reads, as a load does)
                b.preads_hashed()
                if not torch.equal(out, data[bare.index(b)]):
                    raise AssertionError(f"{impl.name}: the bare loop read other bytes")
            kinds += [("preads_", [b.preads for b in bare], nbytes),
                      ("bare_", [b.preads_hashed for b in bare], nbytes)]
        for prefix, calls, size in kinds:
            timed, copied, two_threads = _alternating(memcpy, calls, passes)
            times = [w for w, _ in timed]
            mib_s = size / MiB / statistics.median(times)
            memcpy_mib_s = MEMCPY_BYTES / MiB / statistics.median(w for w, _ in copied)
            cpu = statistics.median(c for _, c in timed)
            memcpy_cpu = statistics.median(c for _, c in copied)
            result.update({f"{prefix}mib_s": mib_s,
                           f"{prefix}mean_mib_s": size * len(times) / MiB / sum(times),
                           f"{prefix}memcpy_mib_s": memcpy_mib_s,
                           f"{prefix}vs_memcpy": mib_s / memcpy_mib_s,
                           f"{prefix}cpu_vs_memcpy": (size / cpu) / (MEMCPY_BYTES / memcpy_cpu)
                           if cpu > 0 and memcpy_cpu > 0 else None,
                           f"{prefix}per_call_s": times,
                           f"{prefix}two_threads": two_threads})
    finally:
        for b in bare:
            b.close()
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return result


def tensor_slice(impl: Any, root: str, *, shape: tuple[int, ...], dtype: str,
                 reads: int = 200) -> dict[str, Any]:
    import random

    import torch

    publish = _publish_tensors()
    (t,) = tensors(shape, dtype, 1)
    store = _store(impl, root)
    rng = random.Random(7)
    rows = [rng.randrange(shape[0]) for _ in range(reads)]
    try:
        (ref,) = publish(store, {"x": t}, submission_id="s")
        for i in range(20):
            got = ref[i:i + 1]
        if not torch.equal(got, t[19:20]):
            raise AssertionError(f"{impl.name}: a row read differs from the published")
        times = []
        for r in rows:
            t0 = time.perf_counter()
            got = ref[r:r + 1]
            times.append(time.perf_counter() - t0)
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    times.sort()
    return {"ms": statistics.median(times) * 1e3,
            "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3, "reads": reads}


def run_all(impl: Any, directory: str, p: dict[str, int]) -> dict[str, Any]:
    """Every tensor workload for both shapes, as ``tensor_<kind>_<workload>``."""
    out: dict[str, Any] = {}
    for kind in SHAPES:
        shape, dtype = shape_of(kind, p["tensor_rows"])
        base = os.path.join(directory, f"tensor-{kind}")
        out[f"tensor_{kind}_publish"] = tensor_publish(
            impl, base + "-pub", shape=shape, dtype=dtype, count=p["tensor_count"])
        out[f"tensor_{kind}_load"] = tensor_load(
            impl, base + "-load", shape=shape, dtype=dtype, count=p["tensor_count"],
            passes=p["tensor_passes"])
        out[f"tensor_{kind}_slice"] = tensor_slice(
            impl, base + "-slice", shape=shape, dtype=dtype, reads=p["tensor_slice_reads"])
    return out
