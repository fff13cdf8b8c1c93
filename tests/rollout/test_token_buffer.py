"""Token ids decoded from a stored int buffer (``token_ids_from_buffer``): ``Sample``
takes them without checking every id again (they are ints in range by construction),
and the decoded sample is the same as one built from a plain tuple."""

from __future__ import annotations

import array
import dataclasses

import pytest

from straw.rollout import Sample, Status
from straw.rollout.codec import group_from_records, group_records
from straw.rollout.samples import BufferIds, token_ids_from_buffer

from .pool import make_group


@pytest.mark.parametrize("width,code", [(4, "i"), (8, "q")])
def test_buffer_ids_make_the_same_sample_as_a_tuple(width, code):
    ids = [0, 1, -5, 2**31 - 1] if width == 4 else [0, -(2**63), 2**63 - 1]
    buf = array.array(code, ids).tobytes()  # (little-endian on the platforms we run)
    got = token_ids_from_buffer(buf, width)
    assert type(got) is BufferIds and list(got) == ids
    s = Sample("p", tokens=got, response_length=1, status=Status.COMPLETED, reward=1.0)
    assert type(s.tokens) is tuple and s == Sample("p", tokens=tuple(ids), response_length=1,
                                                   status=Status.COMPLETED, reward=1.0)
    # a replace (fields copied, checked again) keeps them a plain tuple
    assert type(dataclasses.replace(s, reward=2.0).tokens) is tuple


@pytest.mark.parametrize("data,width", [(b"\0" * 6, 4), (b"\0" * 8, 2), (b"\0" * 4, 8)])
def test_a_buffer_of_another_width_or_length_is_refused(data, width):
    with pytest.raises(ValueError, match="4 or 8 bytes per id"):
        token_ids_from_buffer(data, width)


def test_other_token_values_are_still_checked_id_by_id():
    with pytest.raises(TypeError, match=r"tokens\[1\]"):
        Sample("p", tokens=(1, 2.0))
    with pytest.raises(ValueError, match="64-bit"):
        Sample("p", tokens=(1, 2**63))
    with pytest.raises(TypeError, match=r"tokens\[0\]"):
        Sample("p", tokens=(True,))  # a bool is not a token id


def test_a_decoded_group_equals_the_group_it_stores():
    g = make_group(3, n=3, response=[2, 7, 4])
    back = group_from_records(group_records(g)[0])
    assert back == g
    assert all(type(s.tokens) is tuple for s in back.samples)


@pytest.mark.parametrize("ids,dtype", [((), "int32"), ((1, 2, 3), "int32"),
                                       ((-(2**31), 2**31 - 1), "int32"),
                                       ((0, 2**31), "int64"), ((-(2**31) - 1, 5), "int64"),
                                       ((2**63 - 1,), "int64")])
def test_default_conversion_gives_int32_ids_when_they_fit_else_int64(ids, dtype):
    from straw.rollout.builder import default_convert

    s = Sample("p", tokens=ids, status=Status.COMPLETED, reward=1.0)
    got = default_convert(s, 1.0)["tokens"]
    assert got.dtype.name == dtype and got.tolist() == list(ids) and got.flags.writeable


def test_a_decoded_sample_converts_from_its_decoded_array_and_pickles_without_it():
    import pickle

    import numpy as np

    from straw.rollout.builder import default_convert

    g = make_group(3, n=2, response=[2, 5])
    back = group_from_records(group_records(g)[0])
    s = back.samples[1]
    assert s.int32_ids() is not None and s.int32_ids().tolist() == list(s.tokens)
    got = default_convert(s, 1.0)["tokens"]
    # the same ids and dtype as a sample built from a tuple, in an array of its own
    assert got.dtype == np.int32 and got.tolist() == list(s.tokens) and got.flags.writeable
    assert not np.shares_memory(got, s.int32_ids())
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and copy.int32_ids() is None  # the fields only
    # a sample made from it by replace (its tokens checked again) carries no array
    assert dataclasses.replace(s, tokens=(9, 9, 9), response_length=1).int32_ids() is None
    assert Sample("p", tokens=(1, 2)).int32_ids() is None
