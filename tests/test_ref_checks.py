"""A reference's structural check is decided once per object and its dict form of
``to_dict``'s exact shape is parsed on a short path (issue 15's restore parses and
retains 10,000): neither changes what is accepted or refused.  A failed check is never
remembered, the remembered pass is no field (equality, hashing, repr and ``asdict`` are
those of the fields), and an edited copy is checked afresh."""

from __future__ import annotations

import dataclasses

import pytest

from straw import InvalidReference, Record, SharedFilesystemStore
from straw.errors import UnsupportedSchema
from straw.refs import RecordSetRef
from tests.refedit import edited


@pytest.fixture
def ref(tmp_path) -> RecordSetRef:
    with SharedFilesystemStore(str(tmp_path), "run", writer_id="w") as store:
        return store.publish([Record("r", b"x")], submission_id="one")


def test_the_short_path_parses_what_the_general_path_parses(ref):
    d = ref.to_dict()
    parsed = RecordSetRef.from_dict(d)
    assert parsed == ref and hash(parsed) == hash(ref) and repr(parsed) == repr(ref)
    # the same dict as another Mapping type takes the general path: the same reference
    general = RecordSetRef.from_dict(_Frozen(d))
    assert general == parsed
    # a segment without its optional keys (straw-queue writes them all; defaults apply)
    seg = {k: v for k, v in d["manifest"]["segment"].items() if k != "checksum_algorithm"}
    short = RecordSetRef.from_dict({**d, "manifest": {**d["manifest"], "segment": seg}})
    assert short == ref


@pytest.mark.parametrize("level", ["top", "manifest", "segment"])
def test_an_unknown_key_at_any_level_is_refused_as_before(ref, level):
    d = ref.to_dict()
    if level == "top":
        d["extra"] = 1
    else:
        target = d["manifest"] if level == "manifest" else d["manifest"]["segment"]
        target["extra"] = 1
    with pytest.raises(InvalidReference, match="unknown extra"):
        RecordSetRef.from_dict(d)


@pytest.mark.parametrize("change, error", [
    ({"checksum": "A" * 32}, InvalidReference),
    ({"digest": "not hex"}, InvalidReference),
    ({"tokens": -1}, InvalidReference),
    ({"records": True}, InvalidReference),
    ({"path": "../escape.pack"}, InvalidReference),
])
def test_a_failed_check_is_not_remembered(ref, change, error):
    bad = edited(ref, **change)
    for _ in range(2):  # refused every time, parsed or constructed
        with pytest.raises(error):
            bad.check()
        with pytest.raises(error):
            RecordSetRef.from_dict(bad.to_dict())


def test_a_remembered_pass_is_no_field_and_an_edited_copy_is_checked_again(ref):
    fresh = RecordSetRef.from_dict(ref.to_dict())
    ref.check()
    assert fresh == ref and hash(fresh) == hash(ref) and repr(fresh) == repr(ref)
    assert "_checked" not in dataclasses.asdict(ref)
    assert [f.name for f in dataclasses.fields(ref)] == \
        ["manifest", "digest", "records", "payload_bytes", "tokens"]
    with pytest.raises(InvalidReference, match="digest"):
        dataclasses.replace(ref, digest="x").check()
    with pytest.raises(UnsupportedSchema):
        edited(ref, version=3).check()


class _Frozen(dict):  # type: ignore[type-arg]
    """A Mapping that is not exactly a dict (the short path takes only dicts)."""
