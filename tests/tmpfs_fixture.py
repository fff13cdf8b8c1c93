"""A small tmpfs for the full-disk tests: ``small_tmpfs`` (a pytest fixture) mounts a fresh
tmpfs of a few MiB in a temp directory and yields its path; it is unmounted afterwards.

A full disk is only honest on a real filesystem that really fills up (ENOSPC from the
kernel, with whatever the kernel already allocated), so these tests mount one.  Mounting
needs root (CI runs as root).  Where it is impossible the fixture skips with the reason;
``STRAW_REQUIRE_TMPFS=1`` (or ``STRAW_REQUIRE_JUICEFS=1``, which CI sets) turns that skip
into a failure, so that CI can never silently skip the disk-full cases.

Size: ``@pytest.mark.parametrize("small_tmpfs", [8 << 20], indirect=True)`` picks another
size (default 4 MiB).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

DEFAULT_SIZE = 4 << 20


def _required() -> bool:
    return os.environ.get("STRAW_REQUIRE_TMPFS") == "1" or \
        os.environ.get("STRAW_REQUIRE_JUICEFS") == "1"


def mount_tmpfs(size: int) -> tuple[str | None, str]:
    """Mount a tmpfs of ``size`` bytes; returns (mountpoint, "") or (None, reason)."""
    if os.geteuid() != 0:
        return None, "mounting a tmpfs needs root"
    if shutil.which("mount") is None:
        return None, "no mount command"
    where = tempfile.mkdtemp(prefix="straw-tmpfs-")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           where], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        os.rmdir(where)
        return None, f"mount -t tmpfs failed: {proc.stderr.strip() or proc.returncode}"
    return where, ""


def unmount_tmpfs(where: str) -> None:
    subprocess.run(["umount", "-l", where], capture_output=True, timeout=30)
    try:
        os.rmdir(where)
    except OSError:
        pass


@pytest.fixture
def small_tmpfs(request: pytest.FixtureRequest) -> Iterator[str]:
    size = getattr(request, "param", DEFAULT_SIZE)
    where, reason = mount_tmpfs(size)
    if where is None:
        if _required():
            pytest.fail(f"small_tmpfs: {reason} (STRAW_REQUIRE_TMPFS/JUICEFS=1 forbids a skip)")
        pytest.skip(f"small_tmpfs: {reason}")
    try:
        yield where
    finally:
        unmount_tmpfs(where)


def free_bytes(path: str) -> int:
    """Bytes free on the filesystem of ``path`` (for assertions that space was freed)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
