"""The pytest fixtures over ``fault_injection.juicefs``: two real clients of one JuiceFS
volume (``juicefs_mounts``, module scope) and a fresh directory of it per test
(``juicefs_dirs``).  What they mount, and with which options, is documented there."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from fault_injection.juicefs import (  # noqa: F401  (the names tests import from here)
    JuiceFSMounts,
    JuiceFSUnavailable,
    mount_pair,
    session_count,
    sweep_stale_mounts,
    unavailable_reason,
)


def _unavailable(reason: str) -> None:
    message = f"JuiceFS unavailable: {reason}"
    if os.environ.get("STRAW_REQUIRE_JUICEFS") == "1":
        pytest.fail(message + " (STRAW_REQUIRE_JUICEFS=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def juicefs_mounts(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[JuiceFSMounts]:
    """Two mounted clients (``.a``, ``.b``) of one fresh JuiceFS volume (``.volume_dir``).

    Options of ``mount_pair`` may be given by indirect parametrisation, e.g.
    ``@pytest.mark.parametrize("juicefs_mounts", [{"trash_days": 1}], indirect=True)``."""
    options = getattr(request, "param", None) or {}
    try:
        with mount_pair(tmp_path_factory.mktemp("juicefs"), **options) as mounts:
            yield mounts
    except JuiceFSUnavailable as exc:
        _unavailable(str(exc))


@pytest.fixture
def juicefs_dirs(juicefs_mounts: JuiceFSMounts, request: pytest.FixtureRequest) -> JuiceFSMounts:
    """A fresh empty directory of the shared volume, as seen through client A and client B."""
    base = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)[:80]
    name, n = base, 0
    while os.path.lexists(os.path.join(juicefs_mounts.a, name)):
        n += 1
        name = f"{base}-{n}"
    os.mkdir(os.path.join(juicefs_mounts.a, name))
    a, b = juicefs_mounts.pair(name)
    return dataclasses.replace(juicefs_mounts, a=a, b=b)
