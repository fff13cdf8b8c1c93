"""straw.codec: nested samples round trip through msgpack + tensor records; shared tensors
are stored once; every rejection names what went wrong."""

from __future__ import annotations

import collections
import dataclasses
import math

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import straw.codec as C
import straw.sample_codec.registry
from straw import Record, SharedFilesystemStore, UnsupportedSchema
from straw.codec import MAX_DEPTH, Registry, decode_sample, encode_sample
from straw.tensor import TensorRef, publish_tensors

_counter = [0]


def sid() -> str:
    _counter[0] += 1
    return f"c{_counter[0]}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with SharedFilesystemStore(str(tmp_path_factory.mktemp("pool")), "c") as s:
        yield s


def same(a, b) -> bool:
    """Structural equality that also compares types, NaN and tensors."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                      math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and same(v, b[k]) for k, v in a.items())
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


keys = st.recursive(
    st.one_of(st.integers(-2**70, 2**70), st.text(max_size=5), st.binary(max_size=5),
              st.booleans(), st.none(), st.floats(allow_nan=False)),
    lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-2**80, 2**80), st.floats(), st.text(max_size=10),
    st.binary(max_size=10), st.binary(max_size=4).map(bytearray),
    st.sampled_from([np.float32(1.5), np.int64(-3), np.bool_(True), np.float16(math.inf)]),
    st.builds(lambda n, d: np.arange(n).astype(d), st.integers(0, 5),
              st.sampled_from(["int32", "float64", "bool", "uint8"])),
    st.builds(lambda n: torch.arange(n, dtype=torch.float32).to(torch.bfloat16),
              st.integers(0, 4)),
)
samples = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=25)


@given(sample=samples)
def test_round_trip_nested_samples(store, sample):
    ref = encode_sample(store, sample, submission_id=sid())
    assert same(sample, decode_sample(store, ref))


@dataclasses.dataclass
class Step:
    obs: np.ndarray
    reward: float
    info: dict = dataclasses.field(default_factory=dict)
    derived: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass(frozen=True)
class Key:
    a: int
    b: tuple


C.register_dataclass(Step)  # the codec builds only registered dataclasses
C.register_dataclass(Key)


def test_dataclasses_and_frozen_dataclass_keys(store):
    step = Step(np.arange(3.0), -0.5, {"k": [1, (2, 3)]})
    step.derived = 9
    sample = {Key(1, (2,)): step, "list": [Key(3, ())]}
    out = decode_sample(store, encode_sample(store, sample, submission_id=sid()))
    got = out[Key(1, (2,))]
    assert isinstance(got, Step) and got.derived == 9 and got.reward == -0.5
    assert np.array_equal(got.obs, step.obs) and got.info == {"k": [1, (2, 3)]}
    assert out["list"] == [Key(3, ())]


def test_dataclass_not_registered_or_changed_is_unsupported(store):
    ref = encode_sample(store, Key(1, ()), submission_id=sid())

    @dataclasses.dataclass(frozen=True)
    class Other:
        a: int

    changed = Registry()
    changed.register_dataclass(Other, name=f"{__name__}:Key")  # Key, moved and changed
    with pytest.raises(UnsupportedSchema, match="fields"):
        decode_sample(store, ref, registry=changed)
    with pytest.raises(UnsupportedSchema, match="not registered"):
        decode_sample(store, ref, registry=Registry())
    with pytest.raises(TypeError, match="register_dataclass"):
        encode_sample(store, Key(1, ()), submission_id=sid(), registry=Registry())


def test_shared_tensor_stored_once_and_decoded_as_one_object(store):
    t = torch.randn(4, 3)
    a = np.arange(5)
    sample = {"x": t, "y": [t, {"z": t}], "a": (a, a), "other": torch.randn(2)}
    ref = encode_sample(store, sample, submission_id=sid())
    manifest = store.checked_manifest(ref)
    assert [r.codec for r in manifest.records] == ["sample.v1", "tensor.v1", "tensor.v1",
                                                   "tensor.v1"]
    out = decode_sample(store, ref)
    assert out["x"] is out["y"][0] is out["y"][1]["z"] and torch.equal(out["x"], t)
    assert out["a"][0] is out["a"][1]
    assert isinstance(out["other"], torch.Tensor) and isinstance(out["a"][0], np.ndarray)


def test_lazy_tensors_and_tensor_refs(store):
    big, small = torch.randn(64, 64), torch.ones(2)
    ref = encode_sample(store, {"big": big, "small": small}, submission_id=sid())
    out = decode_sample(store, ref, lazy_tensors_over=1024)
    assert isinstance(out["big"], TensorRef) and torch.equal(out["big"][3:5], big[3:5])
    assert isinstance(out["small"], torch.Tensor)
    (published,) = publish_tensors(store, {"route": np.zeros((8, 48, 8), np.int32)},
                                   submission_id=sid())
    ref2 = encode_sample(store, {"route": published}, submission_id=sid())
    assert store.checked_manifest(ref2).dependencies == (published.publication,)
    assert len(store.checked_manifest(ref2).records) == 1  # no bytes copied
    back = decode_sample(store, ref2)["route"]
    assert back == published and back.load().shape == (8, 48, 8)


def test_non_finite_floats_big_ints_and_key_types(store):
    sample = {1: math.nan, -2: math.inf, 2.5: -math.inf, (1, "a", (b"x", None)): -0.0,
              b"k": 2**100, (True, False): -(2**90), None: [np.float64(math.nan)]}
    out = decode_sample(store, encode_sample(store, sample, submission_id=sid()))
    assert same(sample, out)


def test_deeply_nested_samples(store):
    sample: object = "leaf"
    for i in range(MAX_DEPTH - 1):
        sample = [sample] if i % 3 == 0 else ({"k": sample} if i % 3 == 1 else (sample, i))
    sample = [sample]  # MAX_DEPTH containers: the limit
    assert same(sample, decode_sample(store, encode_sample(store, sample, submission_id=sid())))
    with pytest.raises(ValueError, match="deeper"):
        encode_sample(store, [sample], submission_id=sid())


class Pt:
    def __init__(self, x, y):
        self.x, self.y = x, y


def test_registry_versions_and_unknown_tags(store):
    v1 = Registry()
    v1.register(Pt, "pt", 1, lambda p: [p.x, p.y], lambda v: Pt(*v))
    ref1 = encode_sample(store, {"p": Pt(1, np.arange(2))}, submission_id=sid(), registry=v1)
    got = decode_sample(store, ref1, registry=v1)["p"]
    assert isinstance(got, Pt) and got.x == 1 and np.array_equal(got.y, [0, 1])

    v2 = Registry()
    v2.register(Pt, "pt", 2, lambda p: {"x": p.x, "y": p.y}, lambda v: Pt(v["x"], v["y"]))
    with pytest.raises(UnsupportedSchema, match="version 1"):
        decode_sample(store, ref1, registry=v2)
    v2.register(Pt, "pt", 1, lambda p: [p.x, p.y], lambda v: Pt(*v))
    assert decode_sample(store, ref1, registry=v2)["p"].x == 1  # old data stays readable
    ref2 = encode_sample(store, Pt(5, 6), submission_id=sid(), registry=v2)  # highest version
    body = msgpack.unpackb(next(store.read(ref2)).payload, raw=False)
    assert body[1:3] == ["pt", 2]
    with pytest.raises(UnsupportedSchema, match="'pt'"):
        decode_sample(store, ref2, registry=Registry())
    with pytest.raises(ValueError, match="already registered"):
        v2.register(Pt, "pt", 2, str, str)
    with pytest.raises(ValueError):
        v2.register(Pt, "other", 3, str, str)
    with pytest.raises(ValueError):
        v2.register(Pt, "pt", 0, str, str)
    with pytest.raises(TypeError):
        v2.register(Pt(1, 2), "pt", 5, str, str)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        v2.register(Pt, "", 5, str, str)
    with pytest.raises(TypeError):
        v2.register(Pt, "pt", 5, None, str)  # type: ignore[arg-type]


def test_a_registration_after_an_encode_is_used_by_the_next_encode(store):
    # the registry remembers each class's encoder: a registration must reach it
    r = Registry()
    with pytest.raises(TypeError, match="cannot encode"):
        encode_sample(store, [Pt(1, 2)], submission_id=sid(), registry=r)
    r.register(Pt, "pt-late", 1, lambda p: [p.x, p.y], lambda v: Pt(*v))
    ref = encode_sample(store, [Pt(1, 2)], submission_id=sid(), registry=r)
    assert decode_sample(store, ref, registry=r)[0].y == 2
    r.register(Pt, "pt-late", 2, lambda p: {"x": p.x, "y": p.y}, lambda v: Pt(v["x"], v["y"]))
    ref = encode_sample(store, [Pt(3, 4)], submission_id=sid(), registry=r)
    body = msgpack.unpackb(next(store.read(ref)).payload, raw=False)
    assert body[0][1:3] == ["pt-late", 2]


def test_default_registry(store, monkeypatch):
    monkeypatch.setattr(straw.sample_codec.registry, "DEFAULT_REGISTRY", Registry())
    C.register_type(Pt, "pt-default", 1, lambda p: (p.x, p.y), lambda v: Pt(*v))
    ref = encode_sample(store, [Pt(1, 2)], submission_id=sid())
    assert decode_sample(store, ref)[0].y == 2


class Unknown:
    pass


@pytest.mark.parametrize("sample, path", [
    ({"obs": [0, 1, 2, Step(np.zeros(1), 0.0, {"foo": Unknown()})]}, r"sample\['obs'\]\[3\]\.info\['foo'\]"),
    ({"s": {1, 2}}, r"sample\['s'\]"),
    ([collections.OrderedDict()], r"sample\[0\]"),
    ({"n": np.complex64(1)}, r"sample\['n'\]"),
    ({"t": torch.zeros(2, dtype=torch.complex64)}, r"sample\['t'\]"),
    ({"a": np.array([object()])}, r"sample\['a'\]"),
    ({frozenset(): 1}, r"sample\.keys\(\)"),
    ((msgpack.ExtType(1, b""),), r"sample\[0\]"),
    (Step, r"sample"),
])
def test_unknown_types_raise_type_error_naming_the_path(store, sample, path):
    with pytest.raises(TypeError, match=path):
        encode_sample(store, sample, submission_id=sid())


def test_cycles_raise_value_error(store):
    a: list = []
    a.append({"again": a})
    with pytest.raises(ValueError, match=r"sample\[0\]\['again'\] refers back to sample"):
        encode_sample(store, a, submission_id=sid())
    d: dict = {}
    d["self"] = (d,)
    with pytest.raises(ValueError, match="cycle"):
        encode_sample(store, d, submission_id=sid())
    step = Step(np.zeros(1), 0.0)
    step.info["me"] = step
    with pytest.raises(ValueError, match="cycle"):
        encode_sample(store, step, submission_id=sid())
    shared = [1]
    out = decode_sample(store, encode_sample(store, [shared, shared], submission_id=sid()))
    assert out == [[1], [1]]  # sharing without a cycle is fine


def _raw(store, body: bytes, meta=None):
    return store.publish([Record("sample", body, "sample.v1", meta or {"format": 1})],
                         submission_id=sid())


def test_decode_rejections(store):
    bad_ext = msgpack.packb(msgpack.ExtType(99, b""))
    with pytest.raises(UnsupportedSchema, match="ext type 99"):
        decode_sample(store, _raw(store, bad_ext))
    bad_marker = msgpack.packb([msgpack.ExtType(9, b""), 1])
    with pytest.raises(UnsupportedSchema, match="marker"):
        decode_sample(store, _raw(store, msgpack.packb([msgpack.ExtType(1, b"x")])))
    with pytest.raises(UnsupportedSchema):
        decode_sample(store, _raw(store, bad_marker))
    with pytest.raises(UnsupportedSchema, match="tensor record 5"):
        decode_sample(store, _raw(store, msgpack.packb(msgpack.ExtType(16, b"\x05\0\0\0"))))
    with pytest.raises(UnsupportedSchema, match="format"):
        decode_sample(store, _raw(store, msgpack.packb(1), {"format": 2}))
    with pytest.raises(UnsupportedSchema, match="not a sample.v1"):
        decode_sample(store, store.publish([Record("x", b"1")], submission_id=sid()))
    with pytest.raises(UnsupportedSchema):
        decode_sample(store, _raw(store, msgpack.packb(msgpack.ExtType(18, msgpack.packb(
            ["complex64", b"\0" * 8])))))
    with pytest.raises(UnsupportedSchema):
        decode_sample(store, _raw(store, msgpack.packb([msgpack.ExtType(2, b""), "nomodule",
                                                        {}])))


def test_pil_images_as_png(store):
    pil = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
    img = pil.new("RGB", (5, 3), (10, 20, 30))
    img.putpixel((1, 1), (255, 0, 7))
    gray = pil.new("L", (2, 2), 128)
    out = decode_sample(store, encode_sample(store, {"img": img, "g": [gray]},
                                             submission_id=sid()))
    assert out["img"].mode == "RGB" and out["img"].size == (5, 3)
    assert out["img"].tobytes() == img.tobytes() and out["g"][0].tobytes() == gray.tobytes()
    with pytest.raises(TypeError, match="PNG"):
        encode_sample(store, {"c": pil.new("CMYK", (1, 1))}, submission_id=sid())
