"""Debug archives as self-contained ``.pt`` dumps, and dumps back into archives (issue 16).

``RolloutArchive.export_pt(path)`` and ``RolloutArchive.import_pt(pt_path, path)``
delegate here; ``load_pt(path)`` reads a dump into ``Sample``s without writing anything::

    with RolloutArchive("/shared/debug/rollout_7.straw.json") as archive:
        archive.export_pt("/shared/debug/rollout_7.pt")     # tensors materialised
    dump = load_pt("/shared/debug/rollout_7.pt")           # PtDump(rollout_id, ..., samples)
    RolloutArchive.import_pt("/shared/debug/rollout_7.pt", "/shared/debug/imported_7.straw.json")

LAYERING DECISION.  ``straw.rollout`` is NumPy-only; torch is allowed in exactly one of its
modules, this one, and only imported inside its functions (``_torch()``), behind the
``torch`` extra: without torch they raise an ``ImportError`` naming ``pip install
straw-store[torch]``.  ``import straw.rollout`` (and importing this module) loads no torch
(``tests/rollout/test_layering.py`` checks both).  A ``.pt`` file is torch's format, so its
reading and writing cannot live anywhere torch is not; everything else (the samples'
values, their validation) is the rollout codec's, reused, not re-implemented.

The dump (``torch.save`` of plain values only, so that ``torch.load(weights_only=True)``
reads it and a colleague needs neither straw nor the pool)::

    {"format": "straw.rollout-archive.pt", "version": 1,
     "rollout_id": 7, "evaluation": False,      # eval_<id> rollouts: evaluation True
     "samples": [{"prompt": ..., "tokens": [int, ...], "response_length": int,
                  "status": "completed", "reward": float | {str: float} | None,
                  "versions": [[start, stop, version], ...], "group_index": int | None,
                  "index": int | None, "metadata": {...},
                  "routes": Tensor | None, "topk_ids": Tensor | None,
                  "topk_logprobs": Tensor | None}, ...]}      # in archive order

Values a dump may hold (``PLAIN``): None, bool, int, float, str, bytes, lists, tuples,
dicts with exact types (keys of those scalar types or tuples of them) and dense CPU
``torch.Tensor``s of straw's ten dtypes.  Export materialises every ``TensorRef`` (loaded
and checked) and turns NumPy arrays into tensors and NumPy scalars into Python numbers; any
other value (a dataclass prompt, a set in the metadata) is a ``TypeError`` naming the
sample and the field, before anything is written.  The file is created exclusively (an
existing path is ``FileExistsError``) and streamed to disk through the archive's
``Filesystem``, then synced.  Memory: every tensor of the rollout is materialised at once
(a dump is one pickle), so a rollout with large captures needs that much memory.

Loading never unpickles arbitrary objects: ``torch.load(weights_only=True)`` refuses
anything but tensors and built-in containers (``UnsupportedSchema`` naming the file and
torch's reason); what it accepts is then checked against the sample codec: the exact
top-level and per-sample keys, the value types above (``weights_only`` also admits sets,
complex numbers, ``OrderedDict``, dtypes, parameters and sparse tensors: refused), and
every sample rebuilt through the rollout codec's validation (``_sample_from_value``).
Anything else is ``UnsupportedSchema`` (a type or format this straw does not store) or
``CorruptData`` (a value that is no sample, an unreadable or truncated file), each naming
the file and the offending key, e.g. ``samples[3]['metadata']['x']``.  Nothing is written
before the whole dump has passed.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from straw.checks import INT64_MAX, INT64_MIN
from straw.codec import MAX_DEPTH
from straw.errors import CorruptData, UnsupportedSchema
from straw.fs import Filesystem, PosixFS
from straw.tensor import TensorRef
from straw.tensor_format import DTYPES

from .codec import _CAPTURES, _SAMPLE_KEYS, _sample_from_value, _token_bytes
from .samples import Sample


class Archived(Protocol):
    """What a dump is written from (``straw.rollout.archive.RolloutArchive``)."""

    path: str
    rollout_id: int
    evaluation: bool

    def __len__(self) -> int: ...

    def keys(self) -> list[tuple[str, str | None]]: ...

    def load_samples(self) -> list[Sample]: ...

PT_FORMAT = "straw.rollout-archive.pt"
PT_VERSION = 1
_DUMP_KEYS = frozenset({"format", "version", "rollout_id", "evaluation", "samples"})
_SCALARS = (type(None), bool, int, float, str, bytes)
PLAIN = "None, bool, int, float, str, bytes, list, tuple, dict and dense CPU torch tensors"


def _torch() -> Any:
    """torch, imported here only (the layering decision above)."""
    try:
        import torch
    except ImportError:
        raise ImportError("reading or writing .pt debug dumps needs torch: "
                          "pip install straw-store[torch]") from None
    return torch


@dataclass(frozen=True)
class PtDump:
    """A loaded ``.pt`` dump: its rollout and its samples (captures as torch tensors)."""

    rollout_id: int
    evaluation: bool
    samples: list[Sample]

    @property
    def rollout_key(self) -> str | int:
        """What ``RolloutArchive.save(rollout_id=)`` takes: the id, or ``eval_<id>``."""
        return f"eval_{self.rollout_id}" if self.evaluation else self.rollout_id


# --- export ---------------------------------------------------------------------------


def _torch_dtype_ok(torch: Any, t: Any) -> bool:
    return str(t.dtype).removeprefix("torch.") in DTYPES


def _plain(torch: Any, value: Any, where: str) -> Any:
    """``value`` as a dump holds it: tensors materialised, NumPy made torch / Python."""
    if isinstance(value, TensorRef):
        return value.load(framework="torch")
    if isinstance(value, np.ndarray):
        if value.dtype.name not in DTYPES or value.dtype.name == "bfloat16":
            raise TypeError(f"{where} is a NumPy {value.dtype} array, which a .pt dump "
                            f"cannot hold (dtypes {', '.join(DTYPES)})")
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if type(value) is torch.Tensor:
        if value.layout != torch.strided or value.device.type != "cpu" \
                or not _torch_dtype_ok(torch, value):
            raise TypeError(f"{where} is a {value.layout} {value.dtype} tensor on "
                            f"{value.device}: a .pt dump holds dense CPU tensors of "
                            f"{', '.join(DTYPES)}")
        return value.detach().contiguous()
    if type(value) in _SCALARS:
        return value
    if type(value) in (list, tuple):
        out = [_plain(torch, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return out if type(value) is list else tuple(out)
    if type(value) is dict:
        for k in value:
            _check_key(k, where)
        return {k: _plain(torch, v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{where} is a {type(value).__name__}, which a .pt dump cannot hold "
                    f"({PLAIN}); nothing was written")


def _check_key(key: Any, where: str) -> None:
    if type(key) in _SCALARS:
        return
    if type(key) is tuple:
        for k in key:
            _check_key(k, where)
        return
    raise TypeError(f"{where} has a key of type {type(key).__name__}, which a .pt dump "
                    f"cannot hold ({PLAIN})")


def sample_dict(sample: Sample, where: str = "sample") -> dict[str, Any]:
    """One sample as a dump holds it (captures materialised as torch tensors)."""
    torch = _torch()
    return {
        "prompt": _plain(torch, sample.prompt, f"{where}.prompt"),
        "tokens": list(sample.tokens),
        "response_length": sample.response_length,
        "status": sample.status.value,
        "reward": _plain(torch, sample.reward, f"{where}.reward"),
        "versions": [[v.start, v.stop, v.version] for v in sample.versions],
        "group_index": sample.group_index,
        "index": sample.index,
        "metadata": _plain(torch, dict(sample.metadata), f"{where}.metadata"),
        **{name: None if getattr(sample, name) is None
           else _plain(torch, getattr(sample, name), f"{where}.{name}")
           for name in _CAPTURES},
    }


class _Writer:
    """The file-like ``torch.save`` streams into: appends through a ``Filesystem``.  The
    first failure is kept: torch reports a failed write as its own puzzling RuntimeError,
    and the caller must see the storage's error (ENOSPC, EIO) instead."""

    def __init__(self, fs: Filesystem, fd: int) -> None:
        self.fs, self.fd, self.offset = fs, fd, 0
        self.failed: BaseException | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < view.nbytes:  # (a short write is continued, not lost)
                done += self.fs.writev(self.fd, [view[done:]], self.offset + done)
        except BaseException as e:
            self.failed = self.failed or e
            raise
        self.offset += done
        return done

    def flush(self) -> None:
        pass


def export_pt(archive: Archived, path: str | os.PathLike[str], *,
              fs: Filesystem | None = None) -> str:
    """Write ``archive``'s samples to the new file ``path`` (see the module docstring);
    returns its absolute path."""
    torch = _torch()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a .pt path must be a str or a path, got {type(path).__name__}")
    pt_path = os.path.abspath(os.fspath(path))
    fs = fs or PosixFS()
    if fs.probe(pt_path):
        raise FileExistsError(f"{pt_path} exists: choose a new path for the .pt dump")
    samples = archive.load_samples() if len(archive) else []
    keys = archive.keys()
    dump = {"format": PT_FORMAT, "version": PT_VERSION, "rollout_id": archive.rollout_id,
            "evaluation": archive.evaluation,
            "samples": [sample_dict(s, f"archive {archive.path} {keys[i][0]}")
                        for i, s in enumerate(samples)]}
    fs.makedirs_durable(os.path.dirname(pt_path))
    fd = fs.open(pt_path, write=True, create=True, exclusive=True)
    writer = _Writer(fs, fd)
    try:
        try:
            torch.save(dump, writer)
            fs.fsync(fd)
        finally:
            fs.close(fd)
    except BaseException as e:
        fs.unlink(pt_path)  # ours and incomplete: never leave half a dump behind
        if writer.failed is not None and writer.failed is not e:
            raise writer.failed from None  # the storage's error, not torch's wrapper
        raise
    fs.fsync_dir(os.path.dirname(pt_path))
    return pt_path


# --- import ---------------------------------------------------------------------------


def _refuse(pt_path: str, key: str, why: str, kind: type[Exception] = UnsupportedSchema
            ) -> Exception:
    return kind(f"{pt_path}: {key} {why}; it is not a straw rollout dump "
                f"({PT_FORMAT} version {PT_VERSION}); nothing was written")


class _Held:
    """What the tensors of a dump checked so far hold: their elements' bytes (``dense``)
    and the bytes of the distinct storages they view (``stored``: what the file holds)."""

    def __init__(self) -> None:
        self.dense = self.stored = 0
        self.storages: set[int] = set()  # their data pointers


def _check_tensor(torch: Any, value: Any, pt_path: str, key: str, held: _Held) -> Any:
    """``value`` made contiguous if it is a dense CPU tensor of straw's dtypes whose
    elements the file holds: materialising a dump never allocates more than its storages
    hold, neither for one view (stride 0, overlapping strides) nor for many views of one
    storage (each would become its own copy in the pool)."""
    if value.layout != torch.strided or value.device.type != "cpu" \
            or not _torch_dtype_ok(torch, value) or value.requires_grad:
        raise _refuse(pt_path, key, f"is a {value.layout} {value.dtype} tensor "
                      f"(requires_grad {value.requires_grad}), not a dense CPU tensor "
                      f"of {', '.join(DTYPES)}")
    dense = value.numel() * value.element_size()
    storage = value.untyped_storage()
    stored = storage.nbytes()
    if dense > stored:
        # a view repeating its storage: materialising it would allocate what the file
        # never held
        raise _refuse(pt_path, key, f"is a view of {value.numel()} elements "
                      f"({dense} bytes) over {stored} stored bytes (repeating strides "
                      f"{tuple(value.stride())})", CorruptData)
    if storage.data_ptr() not in held.storages:
        held.storages.add(storage.data_ptr())
        held.stored += stored
    held.dense += dense
    if held.dense > held.stored:
        raise _refuse(pt_path, key, f"views a storage other tensors view too: the dump's "
                      f"tensors hold {held.dense} bytes over {held.stored} stored bytes, "
                      "which importing would copy once per view", CorruptData)
    return value.contiguous()


def _check_plain(torch: Any, value: Any, pt_path: str, key: str, held: _Held,
                 depth: int) -> Any:
    """``value`` if it holds only ``PLAIN`` values (tensors made contiguous), in fewer
    than ``MAX_DEPTH`` containers counted from the dump's top (``depth``: ``value``'s;
    the sample codec stores an archived sample's fields as deep and refuses deeper)."""
    if type(value) in _SCALARS:
        return value  # (a NaN reward is refused by the sample's own validation below)
    if type(value) is torch.Tensor:
        return _check_tensor(torch, value, pt_path, key, held)
    if type(value) in (list, tuple, dict) and depth >= MAX_DEPTH:
        raise _refuse(pt_path, key, f"nests deeper than {MAX_DEPTH} containers, which the "
                      "sample codec refuses", CorruptData)
    if type(value) in (list, tuple):
        out = [_check_plain(torch, v, pt_path, f"{key}[{i}]", held, depth + 1)
               for i, v in enumerate(value)]
        return out if type(value) is list else tuple(out)
    if type(value) is dict:
        for k in value:
            try:
                _check_key(k, key)
            except TypeError:
                raise _refuse(pt_path, key, f"has a key of type {type(k).__name__}, "
                              f"outside the sample codec ({PLAIN})") from None
        return {k: _check_plain(torch, v, pt_path, f"{key}[{k!r}]", held, depth + 1)
                for k, v in value.items()}
    raise _refuse(pt_path, key, f"is a {type(value).__name__}, outside the sample codec "
                  f"({PLAIN})")


def _tokens(value: Any, pt_path: str, key: str) -> list[Any]:
    if type(value) not in (list, tuple) or any(type(t) is not int for t in value):
        raise _refuse(pt_path, key, "is not a list of int token ids", CorruptData)
    if value and (min(value) < INT64_MIN or max(value) > INT64_MAX):
        raise _refuse(pt_path, key, "holds a token id outside the signed 64-bit range",
                      CorruptData)
    return _token_bytes(tuple(value))


def _sample(torch: Any, value: Any, pt_path: str, i: int, held: _Held) -> Sample:
    key = f"samples[{i}]"
    if type(value) is not dict:
        raise _refuse(pt_path, key, f"is a {type(value).__name__}, not a sample dict")
    if set(value) != _SAMPLE_KEYS:
        odd = sorted(map(repr, set(value) ^ _SAMPLE_KEYS))
        raise _refuse(pt_path, key, f"does not have a sample's keys (differs in "
                      f"{', '.join(odd)})", CorruptData)
    # a field sits 3 containers deep (the dump, its samples, the sample), as in a chunk
    checked = {k: _check_plain(torch, v, pt_path, f"{key}[{k!r}]", held, 3)
               for k, v in value.items()}
    checked["tokens"] = _tokens(value["tokens"], pt_path, f"{key}['tokens']")
    for name in _CAPTURES:
        if checked[name] is not None and type(checked[name]) is not torch.Tensor:
            raise _refuse(pt_path, f"{key}[{name!r}]", "is neither a tensor nor None",
                          CorruptData)
    versions = checked["versions"]
    if type(versions) is list:  # the codec's shape: [start, stop, version] lists
        checked["versions"] = [list(v) if type(v) is tuple else v for v in versions]
    try:
        return _sample_from_value(checked, f"{pt_path}: {key}")
    except CorruptData as e:
        raise CorruptData(f"{e}; nothing was written") from None


def load_pt(path: str | os.PathLike[str], *, fs: Filesystem | None = None) -> PtDump:
    """The dump at ``path``, loaded with ``weights_only`` and checked whole (see the module
    docstring); writes nothing."""
    torch = _torch()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a .pt path must be a str or a path, got {type(path).__name__}")
    pt_path = os.path.abspath(os.fspath(path))
    fs = fs or PosixFS()
    try:
        raw = fs.read_file(pt_path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no .pt dump at {pt_path}") from None
    if not raw.startswith(b"PK\x03\x04"):
        # torch.save's format is a zip; anything else (torch's legacy format included) is
        # not a dump, and its bytes would reach the unpickler as if they were one
        raise CorruptData(f"{pt_path} is not a readable torch file (not torch.save's zip "
                          f"format: {'empty' if not raw else 'other bytes'}); nothing was "
                          "written")
    try:
        # weights_only: torch's restricted unpickler; never a general unpickle of the file
        dump = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        why = str(e)
        at = why.find("WeightsUnpickler error:")
        lines = [ln.strip() for ln in why[at + 23 if at >= 0 else 0:].splitlines()]
        # (torch's advice to allowlist the global is exactly what a dump must not need)
        reason = next((ln for ln in lines if ln), "refused").split(". Please use")[0]
        raise UnsupportedSchema(f"{pt_path} holds objects that weights_only loading "
                                f"refuses ({reason[:300]}); a straw rollout dump holds "
                                f"{PLAIN} only; nothing was written") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise CorruptData(f"{pt_path} is not a readable torch file ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'empty or truncated'}); "
                          "nothing was written") from None
    return _dump(torch, dump, pt_path)


def _dump(torch: Any, dump: Any, pt_path: str) -> PtDump:
    if type(dump) is not dict:
        raise _refuse(pt_path, "the file", f"holds a {type(dump).__name__}, not a dict")
    if dump.get("format") != PT_FORMAT or dump.get("version") != PT_VERSION:
        raise _refuse(pt_path, "the file", f"has format {dump.get('format')!r} version "
                      f"{dump.get('version')!r}")
    if set(dump) != _DUMP_KEYS:
        odd = sorted(map(repr, set(dump) ^ _DUMP_KEYS))
        raise _refuse(pt_path, "the file", f"has other top-level keys (differs in "
                      f"{', '.join(odd)})", CorruptData)
    rid, evaluation, samples = dump["rollout_id"], dump["evaluation"], dump["samples"]
    if type(rid) is not int or rid < 0:
        raise _refuse(pt_path, "'rollout_id'", f"is {rid!r}, not an int >= 0", CorruptData)
    if type(evaluation) is not bool:
        raise _refuse(pt_path, "'evaluation'", f"is a {type(evaluation).__name__}, not a "
                      "bool", CorruptData)
    if type(samples) is not list:
        raise _refuse(pt_path, "'samples'", f"is a {type(samples).__name__}, not a list",
                      CorruptData)
    held = _Held()
    return PtDump(rid, evaluation, [_sample(torch, s, pt_path, i, held)
                                    for i, s in enumerate(samples)])


__all__ = ["PT_FORMAT", "PT_VERSION", "PLAIN", "PtDump", "export_pt", "load_pt",
           "sample_dict"]
