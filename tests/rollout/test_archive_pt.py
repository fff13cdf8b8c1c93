"""Debug archives' ``.pt`` dumps (issue 16): export, the round trip through release and
collection, import, and every dump that is not one (``straw.rollout.archive_pt``'s
module docstring holds the claims)."""

from __future__ import annotations

import collections
import io
import os
import sys

import numpy as np
import pytest

from straw import SharedFilesystemStore
from straw.errors import CorruptData, InvalidReference, UnsupportedSchema
from straw.fs import PosixFS
from straw.rollout import RolloutArchive, Sample, Status
from straw.rollout.archive import ADJACENT_POOL
from straw.rollout.archive_pt import PT_FORMAT, PT_VERSION, load_pt, sample_dict
from straw.rollout.samples import VersionSpan
from straw.tensor import TensorRef

from .pool import published_samples

torch = pytest.importorskip("torch")


def _sample(i: int, *, routes: bool = True, **kw: object) -> Sample:
    tokens = tuple(range(i, i + 8))
    base: dict[str, object] = dict(
        tokens=tokens, response_length=4, status=Status.COMPLETED, reward=float(i),
        versions=(VersionSpan(0, 2, 3), VersionSpan(2, 4, "v4")), group_index=i // 2,
        index=i, metadata={"task_id": f"prompt:{i // 2}", "temperature": 0.7,
                           "nested": {"k": [1, (2, "x")], 3: None}},
        routes=np.full((7, 4, 2), i, dtype=np.int32) if routes else None,
        topk_ids=np.full((4, 3), i, dtype=np.int64) if routes else None,
        topk_logprobs=torch.full((4, 3), -float(i), dtype=torch.bfloat16) if routes else None)
    base.update(kw)
    return Sample(("prompt", i // 2), **base)  # type: ignore[arg-type]


def _np(x: object) -> np.ndarray:
    if isinstance(x, TensorRef):
        x = x.load(framework="torch")
    if isinstance(x, torch.Tensor):
        return x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
    return np.asarray(x)


def _same_captures(a: Sample, b: Sample) -> None:
    for name in ("routes", "topk_ids", "topk_logprobs"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(_np(x), _np(y))


def _tree(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root)
            for d, dirs, files in os.walk(root) for f in files + dirs}


def _save_pt(path, obj) -> None:
    torch.save(obj, path)


def _dump(samples: list[Sample], **top: object) -> dict:
    dump = {"format": PT_FORMAT, "version": PT_VERSION, "rollout_id": 7,
            "evaluation": False, "samples": [sample_dict(s) for s in samples]}
    dump.update(top)
    return dump


@pytest.fixture
def pool(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "job")
    yield store
    store.close()


# --- export and the round trip --------------------------------------------------------


def test_save_export_release_collect_then_read_the_pt(tmp_path, pool):
    samples = published_samples(pool, [_sample(i) for i in range(5)])
    path = RolloutArchive.save(tmp_path / "rollout_7.straw.json", samples, rollout_id=7,
                               store=pool)
    pool.seal()
    pool.release_publications([s.routes.blob_set for s in samples])  # the queue let go
    with RolloutArchive(path) as archive:
        pt = archive.export_pt(tmp_path / "out" / "rollout_7.pt")  # parents created
        assert archive.release() is True
    assert pt == str(tmp_path / "out" / "rollout_7.pt")
    assert pool.collect_garbage()["reclaimed_files"] >= 1  # the payloads are gone
    with pytest.raises(InvalidReference):
        RolloutArchive(path)
    with pytest.raises(InvalidReference):
        samples[2].routes.load()
    # the dump needs neither straw nor the pool: weights_only torch.load of plain values
    raw = torch.load(pt, weights_only=True)
    assert (raw["format"], raw["version"], raw["rollout_id"], raw["evaluation"]) == \
        (PT_FORMAT, PT_VERSION, 7, False)
    one = raw["samples"][3]
    assert one["tokens"] == list(range(3, 11)) and one["status"] == "completed"
    assert one["versions"] == [[0, 2, 3], [2, 4, "v4"]]
    assert one["metadata"] == {"task_id": "prompt:1", "temperature": 0.7,
                               "nested": {"k": [1, (2, "x")], 3: None}}
    assert type(one["routes"]) is torch.Tensor and one["routes"].dtype == torch.int32
    assert one["topk_logprobs"].dtype == torch.bfloat16
    np.testing.assert_array_equal(one["routes"].numpy(), np.full((7, 4, 2), 3, np.int32))
    # and through straw: the samples as they were saved
    dump = load_pt(pt)
    assert (dump.rollout_id, dump.evaluation, dump.rollout_key) == (7, False, 7)
    assert dump.samples == [_sample(i) for i in range(5)]
    for got, want in zip(dump.samples, [_sample(i) for i in range(5)], strict=True):
        _same_captures(got, want)


def test_a_dump_holds_only_plain_values(tmp_path, pool):
    with RolloutArchive(RolloutArchive.save(tmp_path / "r.straw.json",
                                            [_sample(0), _sample(1, routes=False)],
                                            rollout_id=1, store=pool)) as archive:
        pt = archive.export_pt(tmp_path / "r.pt")
    plain = (type(None), bool, int, float, str, bytes, list, tuple, dict, torch.Tensor)

    def walk(v):
        assert type(v) in plain, type(v)
        if isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    walk(torch.load(pt, weights_only=True))


def test_an_evaluation_rollout_exports_and_imports_as_eval(tmp_path, pool):
    path = RolloutArchive.save(tmp_path / "eval_3.straw.json", [_sample(0)],
                               rollout_id="eval_3", store=pool)
    with RolloutArchive(path) as archive:
        pt = archive.export_pt(tmp_path / "eval_3.pt")
    dump = load_pt(pt)
    assert (dump.rollout_id, dump.evaluation, dump.rollout_key) == (3, True, "eval_3")
    with RolloutArchive(RolloutArchive.import_pt(pt, tmp_path / "d" / "e.straw.json")) as a:
        assert a.key == "eval_3"


def test_export_refuses_an_existing_path_and_writes_nothing(tmp_path, pool):
    path = RolloutArchive.save(tmp_path / "r.straw.json", [_sample(0)], rollout_id=0,
                               store=pool)
    (tmp_path / "r.pt").write_bytes(b"mine")
    with RolloutArchive(path) as archive:
        with pytest.raises(FileExistsError, match="new path"):
            archive.export_pt(tmp_path / "r.pt")
    assert (tmp_path / "r.pt").read_bytes() == b"mine"


def test_export_of_a_value_no_dump_can_hold_names_it_and_writes_nothing(tmp_path, pool):
    odd = _sample(0, metadata={"task_id": "prompt:0", "seen": bytearray(b"x")})
    path = RolloutArchive.save(tmp_path / "r.straw.json", [_sample(1), odd], rollout_id=0,
                               store=pool)
    with RolloutArchive(path) as archive:
        with pytest.raises(TypeError, match=r"sample:0\.metadata\[.seen.\] is a bytearray"):
            archive.export_pt(tmp_path / "r.pt")
    assert not (tmp_path / "r.pt").exists()


def test_an_empty_archive_exports_and_imports(tmp_path, pool):
    with RolloutArchive(RolloutArchive.save(tmp_path / "e.straw.json", [], rollout_id=2,
                                            store=pool)) as archive:
        pt = archive.export_pt(tmp_path / "e.pt")
    assert load_pt(pt).samples == []
    with RolloutArchive(RolloutArchive.import_pt(pt, tmp_path / "i.straw.json")) as again:
        assert again.keys() == []


# --- import ---------------------------------------------------------------------------


def test_an_exported_pt_imports_as_an_archive_with_an_adjacent_pool(tmp_path, pool):
    samples = published_samples(pool, [_sample(i) for i in range(3)])
    samples.append(_sample(9, index=None, metadata={}))  # position:3, no task key
    path = RolloutArchive.save(tmp_path / "rollout_7.straw.json", samples, rollout_id=7,
                               store=pool)
    with RolloutArchive(path) as archive:
        pt = archive.export_pt(tmp_path / "rollout_7.pt")
        keys = archive.keys()
    imported = RolloutArchive.import_pt(pt, tmp_path / "shared" / "imported_7.straw.json")
    assert os.path.exists(tmp_path / "shared" / ADJACENT_POOL / "POOL")
    with RolloutArchive(imported) as archive:
        assert (archive.key, archive.keys()) == ("7", keys)
        assert archive.root == str(tmp_path / "shared" / ADJACENT_POOL)
        got = archive.load_samples()
        assert got == [_sample(0), _sample(1), _sample(2),
                       _sample(9, index=None, metadata={})]
        for g, w in zip(got[:3], [_sample(0), _sample(1), _sample(2)], strict=True):
            _same_captures(g, w)
        assert archive.load_samples(task_key="prompt:1") == [_sample(2)]


def test_import_into_a_store_and_under_another_rollout_id(tmp_path, pool):
    with RolloutArchive(RolloutArchive.save(tmp_path / "r.straw.json", [_sample(0)],
                                            rollout_id=7, store=pool)) as archive:
        pt = archive.export_pt(tmp_path / "r.pt")
    path = RolloutArchive.import_pt(pt, tmp_path / "again.straw.json", rollout_id=8,
                                    store=pool)
    with RolloutArchive(path) as archive:
        assert archive.key == "8" and archive.root == pool.root
        _same_captures(archive.load_samples(sample_key="sample:0")[0], _sample(0))


def test_import_refuses_an_existing_index_before_reading_the_dump(tmp_path, pool):
    path = RolloutArchive.save(tmp_path / "r.straw.json", [_sample(0)], rollout_id=0,
                               store=pool)
    before = open(path, "rb").read()
    with pytest.raises(FileExistsError, match="immutable"):
        RolloutArchive.import_pt(tmp_path / "no-such.pt", path, store=pool)
    assert open(path, "rb").read() == before


def test_a_missing_dump_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .pt dump"):
        RolloutArchive.import_pt(tmp_path / "none.pt", tmp_path / "r.straw.json")
    assert _tree(tmp_path) == set()


# --- dumps that are not straw rollout dumps: clear errors, nothing written -------------


class _Pickled:  # a class weights_only loading must refuse
    pass


def _with(where: str, value: object) -> dict:
    dump = _dump([_sample(0), _sample(1)])
    sample = dump["samples"][1]
    if where == "top":
        dump.update(value)  # type: ignore[arg-type]
    else:
        sample[where] = value
    return dump


@pytest.mark.parametrize("content, error, names", [
    # objects weights_only loading refuses
    (_with("metadata", {"x": np.zeros(3)}), UnsupportedSchema, "weights_only"),
    (_with("metadata", {"x": _Pickled()}), UnsupportedSchema, "weights_only"),
    # objects it accepts but the sample codec does not hold
    (_with("metadata", {"seen": {1, 2}}), UnsupportedSchema, r"\['metadata'\]\['seen'\]"),
    (_with("metadata", collections.OrderedDict(a=1)), UnsupportedSchema,
     r"samples\[1\]\['metadata'\] is a OrderedDict"),
    (_with("reward", complex(1, 2)), UnsupportedSchema, r"samples\[1\]\['reward'\]"),
    (_with("prompt", torch.float32), UnsupportedSchema, r"samples\[1\]\['prompt'\]"),
    (_with("routes", torch.nn.Parameter(torch.zeros(7, 2))), UnsupportedSchema,
     r"samples\[1\]\['routes'\]"),
    (_with("routes", torch.zeros(7, 2).to_sparse()), UnsupportedSchema,
     r"samples\[1\]\['routes'\]"),
    (_with("routes", torch.zeros(7, 2, dtype=torch.complex64)), UnsupportedSchema,
     r"samples\[1\]\['routes'\]"),
    (_with("metadata", {frozenset(): 1}), UnsupportedSchema, "weights_only|key of type"),
    # plain values that do not make a sample
    (_with("routes", [1, 2]), CorruptData, r"samples\[1\]\['routes'\] is neither"),
    (_with("tokens", [1, "2"]), CorruptData, r"samples\[1\]\['tokens'\]"),
    (_with("tokens", torch.arange(8)), CorruptData, r"samples\[1\]\['tokens'\]"),
    (_with("reward", float("nan")), CorruptData, r"samples\[1\].*finite"),
    (_with("response_length", 99), CorruptData, r"samples\[1\].*response_length"),
    (_with("status", "unheard-of"), CorruptData, r"samples\[1\]"),
    (_with("versions", [[0, 9, 1]]), CorruptData, r"samples\[1\]"),
    ({**_dump([_sample(0)]), "samples": [{"prompt": 1}]}, CorruptData,
     r"samples\[0\] does not have a sample's keys"),
    ({**_dump([_sample(0)]), "samples": ["no"]}, UnsupportedSchema, r"samples\[0\] is a str"),
    # the file's own fields
    (_with("top", {"format": "vime.straw-debug"}), UnsupportedSchema, "format"),
    (_with("top", {"version": 2}), UnsupportedSchema, "version 2"),
    (_with("top", {"extra": 1}), CorruptData, "'extra'"),
    (_with("top", {"rollout_id": -1}), CorruptData, "'rollout_id'"),
    (_with("top", {"rollout_id": True}), CorruptData, "'rollout_id'"),
    (_with("top", {"evaluation": 1}), CorruptData, "'evaluation'"),
    (_with("top", {"samples": (1,)}), CorruptData, "'samples'"),
    ([1, 2], UnsupportedSchema, "holds a list"),
])
def test_a_dump_outside_the_sample_codec_is_a_clear_error_and_nothing_is_written(
        tmp_path, content, error, names):
    pt = tmp_path / "bad.pt"
    _save_pt(pt, content)
    before = _tree(tmp_path)
    with pytest.raises(error, match=names) as caught:
        RolloutArchive.import_pt(pt, tmp_path / "d" / "r.straw.json")
    assert str(pt) in str(caught.value) and "nothing was written" in str(caught.value)
    assert _tree(tmp_path) == before  # no index, no adjacent pool
    with pytest.raises(error):
        load_pt(pt)


def test_arch3_a_repeating_view_is_refused_before_it_is_materialised(tmp_path, monkeypatch):
    # issue 39 ARCH3: a stride-0 view of 2**40 elements was made contiguous (a 1 TiB
    # allocation) before any check; now refused from its shape, strides and storage
    huge = torch.zeros(1, dtype=torch.int32).as_strided((1 << 20, 1 << 20), (0, 0))
    pt = tmp_path / "repeating.pt"
    _save_pt(pt, _with("routes", huge))
    made = []
    real = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous",
                        lambda t, *a, **k: made.append(t.numel()) or real(t, *a, **k))
    with pytest.raises(CorruptData, match=r"routes'\] is a view of 1099511627776 elements"):
        load_pt(pt)
    assert all(n < 1 << 20 for n in made)  # nothing of the view was materialised


@pytest.mark.parametrize("cut", ["empty", "half", "garbage"])
def test_a_truncated_or_unreadable_dump_is_corrupt_data(tmp_path, cut):
    buf = io.BytesIO()
    torch.save(_dump([_sample(0)]), buf)
    data = {"empty": b"", "half": buf.getvalue()[: len(buf.getvalue()) // 2],
            "garbage": b"not a torch file"}[cut]
    pt = tmp_path / "bad.pt"
    pt.write_bytes(data)
    with pytest.raises(CorruptData, match="not a readable torch file") as caught:
        RolloutArchive.import_pt(pt, tmp_path / "r.straw.json")
    assert str(pt) in str(caught.value)
    assert _tree(tmp_path) == {"bad.pt"}


def test_without_torch_a_clear_import_error_names_the_extra(tmp_path, pool, monkeypatch):
    path = RolloutArchive.save(tmp_path / "r.straw.json", [_sample(0, routes=False)],
                               rollout_id=0, store=pool)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with RolloutArchive(path) as archive:
        with pytest.raises(ImportError, match=r"pip install straw-store\[torch\]"):
            archive.export_pt(tmp_path / "r.pt")
    with pytest.raises(ImportError, match=r"pip install straw-store\[torch\]"):
        load_pt(tmp_path / "r.pt")
    assert not (tmp_path / "r.pt").exists()


def test_export_of_collected_data_fails_before_writing(tmp_path, pool):
    samples = published_samples(pool, [_sample(i) for i in range(2)])
    path = RolloutArchive.save(tmp_path / "r.straw.json", samples, rollout_id=0, store=pool)
    pool.seal()
    pool.release_publications([s.routes.blob_set for s in samples])
    with RolloutArchive(path) as archive:
        archive.release()
        pool.collect_garbage()
        with pytest.raises(InvalidReference):
            archive.export_pt(tmp_path / "r.pt")
    assert not (tmp_path / "r.pt").exists()


class _FailingWrites(PosixFS):
    """A filesystem whose writes to ``.pt`` files fail after the first (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.pt_fds: set[int] = set()
        self.writes = 0

    def open(self, path: str, **kw: object) -> int:  # type: ignore[override]
        fd = super().open(path, **kw)  # type: ignore[arg-type]
        if path.endswith(".pt"):
            self.pt_fds.add(fd)
        return fd

    def writev(self, fd, buffers, offset):  # type: ignore[no-untyped-def]
        if fd in self.pt_fds:
            self.writes += 1
            if self.writes > 1:
                raise OSError(28, "No space left on device")
        return super().writev(fd, buffers, offset)


def test_a_failed_export_leaves_no_half_dump(tmp_path, pool):
    path = RolloutArchive.save(tmp_path / "r.straw.json", [_sample(i) for i in range(3)],
                               rollout_id=0, store=pool)
    fs = _FailingWrites()
    with RolloutArchive(path, fs=fs) as archive:
        with pytest.raises(OSError, match="No space"):
            archive.export_pt(tmp_path / "r.pt")
    assert fs.writes > 1 and not (tmp_path / "r.pt").exists()
