"""Storage profiles and the deployment declaration (straw.backend): strict validation, and
the live check that fails the store's start, with both values, before anything is written."""

from __future__ import annotations

import os

import pytest

from straw import DeploymentMismatch, SharedFilesystemStore
from straw.backend import (
    FilesystemBackend,
    compare,
    juicefs_settings,
    mount_of,
    parse_mountinfo,
    validate_declaration,
    version_matches,
)
from straw.fs import PosixFS

GOOD = {"direct_mount": True, "writeback": False, "open_cache": 0, "readdir_cache": False,
        "client_version": "1.4.2", "durability_description": "sqlite on a replicated disk"}


def _with(**changes):
    d = dict(GOOD)
    for k, v in changes.items():
        if v is KeyError:
            del d[k]
        else:
            d[k] = v
    return d


@pytest.mark.parametrize("declaration, error, words", [
    # every problem of a field is a ValueError, as in straw-queue (whose callers catch it)
    (_with(writeback="false"), ValueError, ["'writeback'", "bool", "'false'"]),
    (_with(direct_mount=1), ValueError, ["'direct_mount'", "bool"]),
    (_with(open_cache=False), ValueError, ["'open_cache'", "seconds"]),
    (_with(open_cache=-1), ValueError, ["'open_cache'"]),
    (_with(client_version=142), ValueError, ["'client_version'", "str"]),
    (_with(durability_description=""), ValueError, ["'durability_description'"]),
    (_with(readdir_cache=KeyError), ValueError, ["'readdir_cache'", "missing"]),
    (_with(writeback=True), ValueError, ["'writeback'", "False", "Remount"]),
    (_with(open_cache=1), ValueError, ["'open_cache'", "close-to-open"]),
    (["direct_mount"], TypeError, ["mapping"]),
    (None, ValueError, ["needs a declaration"]),
])
def test_declaration_validated_strictly_naming_the_field(declaration, error, words):
    with pytest.raises(error) as exc:
        FilesystemBackend("/tmp/x", profile="juicefs", declaration=declaration)
    for w in words:
        assert w in str(exc.value)


def test_declaration_profile_errors():
    with pytest.raises(ValueError, match="'nfs' is unknown"):
        FilesystemBackend("/tmp/x", profile="nfs")
    with pytest.raises(ValueError, match="takes no declaration"):
        FilesystemBackend("/tmp/x", profile="local", declaration=GOOD)
    assert validate_declaration("juicefs", GOOD) == GOOD
    # fields straw does not know are kept (straw-queue accepts them) and reported unchecked
    backend = FilesystemBackend("/tmp/x", profile="juicefs", declaration=_with(extra=True))
    assert backend.declaration == _with(extra=True)
    assert backend.diagnostics()["unchecked_fields"] == ["extra"]


def test_compare_names_declared_and_live_values():
    live = {"direct_mount": True, "writeback": True, "open_cache": 1.0,
            "readdir_cache": False, "client_version": "1.4.2+2026-10-26.pypi"}
    problems = compare(GOOD, live)
    assert problems == ["writeback: declared False, mount reports True",
                        "open_cache: declared 0, mount reports 1.0"]
    assert compare(GOOD, {**live, "writeback": False, "open_cache": 0.0}) == []
    assert "client_version: declared '1.4.2', mount reports None" in compare(GOOD, {})


def test_version_matching():
    assert version_matches("1.4.2", "1.4.2+2026-10-26.pypi")
    assert version_matches("1.4", "1.4.2+x")
    assert not version_matches("1.4.2", "1.4.20")
    assert not version_matches("1.3", "1.4.2")


def test_juicefs_settings_read_from_config_keys():
    config = {"Meta": {"OpenCache": 0}, "Chunk": {"Writeback": False}, "ReaddirCache": False,
              "FuseOpts": {"DirectMount": True}, "Version": "1.4.2+b", "AttrTimeout": 10**9,
              "EntryTimeout": 10**9, "DirEntryTimeout": 10**9, "NegEntryTimeout": 0}
    s = juicefs_settings(config)
    assert s["open_cache"] == 0.0 and s["writeback"] is False and s["direct_mount"] is True
    assert s["readdir_cache"] is False and s["client_version"] == "1.4.2+b"
    assert s["attr_cache"] == 1.0 and s["negative_entry_cache"] == 0.0


def test_parse_mountinfo_unescapes_mount_points():
    text = ("45 27 0:40 / /mnt/with\\040space rw,relatime - fuse.juicefs JuiceFS:v rw,a=1\n"
            "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    ms = parse_mountinfo(text)
    assert ms[0].point == "/mnt/with space" and ms[0].fstype == "fuse.juicefs"
    assert ms[0].options == "rw,a=1" and ms[1].point == "/"


def test_store_refuses_juicefs_declaration_on_a_local_disk(tmp_path):
    root = tmp_path / "pool"
    backend = FilesystemBackend(root, profile="juicefs", declaration=GOOD)
    fstype = mount_of(PosixFS(), str(tmp_path)).fstype
    with pytest.raises(DeploymentMismatch) as exc:
        SharedFilesystemStore(root, "run", backend=backend)
    assert "fuse.juicefs" in str(exc.value) and repr(fstype) in str(exc.value)
    assert not root.exists()  # nothing written


def test_store_backend_checks(tmp_path):
    with pytest.raises(ValueError, match="differs from the store root"):
        SharedFilesystemStore(tmp_path / "a", "run", backend=FilesystemBackend(tmp_path / "b"))
    with pytest.raises(TypeError, match="FilesystemBackend"):
        SharedFilesystemStore(tmp_path / "a", "run", backend="juicefs")  # type: ignore[arg-type]
    assert not (tmp_path / "a").exists()
    with SharedFilesystemStore(tmp_path / "a", "run",
                               backend=FilesystemBackend(tmp_path / "a")) as store:
        assert store.backend.diagnostics()["profile"] == "local"


@pytest.mark.juicefs
def test_juicefs_declaration_checked_against_the_live_mount(juicefs_dirs):
    root = os.path.join(juicefs_dirs.a, "pool")
    backend = FilesystemBackend(root, profile="juicefs", declaration=GOOD)
    with SharedFilesystemStore(root, "run", backend=backend) as store:
        diag = store.backend.diagnostics()
        assert diag["mount_verified"] and diag["live"]["writeback"] is False
    other = os.path.join(juicefs_dirs.a, "pool2")
    wrong = FilesystemBackend(other, profile="juicefs",
                              declaration=_with(client_version="1.1.0"))
    with pytest.raises(DeploymentMismatch) as exc:
        SharedFilesystemStore(other, "run", backend=wrong)
    assert "client_version: declared '1.1.0', mount reports '1.4" in str(exc.value)
    assert not os.path.exists(other)
