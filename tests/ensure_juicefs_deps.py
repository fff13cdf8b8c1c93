"""Make the JuiceFS tests runnable here, or say why they will skip. Never fails the run.

Run before pytest (``python tests/ensure_juicefs_deps.py``). When ``fusermount3`` is missing
and we are root on Linux with apt-get, it runs ``apt-get update`` once and
``apt-get install -y fuse3``; otherwise it prints what is missing. It also unmounts
JuiceFS test mounts left in the temp dir by a killed run (daemon gone, or owner process gone).
With everything present it spawns nothing and returns in well under a second.
Exit status is always 0: problems are warnings, and the tests skip with the exact reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

APT_TIMEOUT = 600.0
PREFIX = "ensure_juicefs_deps:"


def say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def apt(*args: str) -> bool:
    argv = ["apt-get", *args]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=APT_TIMEOUT,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"WARNING: {' '.join(argv)} did not complete: {exc}")
        return False
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        say(f"WARNING: {' '.join(argv)} failed (rc={result.returncode}): " + " | ".join(tail))
        return False
    return True


def ensure_fusermount() -> str | None:
    """Install fuse3 if we can; return a warning if fusermount3 is still missing."""
    if shutil.which("fusermount3"):
        return None
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform}): no FUSE"
    if os.geteuid() != 0:
        return "fusermount3 missing and not root: install the fuse3 package (apt-get install fuse3)"
    if not shutil.which("apt-get"):
        return (
            "fusermount3 missing and no apt-get: install fuse3 with this system's package manager"
        )
    say("fusermount3 missing: apt-get update && apt-get install -y fuse3")
    if not apt("update"):
        return "apt-get update failed; fuse3 not installed"
    if not apt("install", "-y", "--no-install-recommends", "fuse3"):
        return "apt-get install fuse3 failed"
    if not shutil.which("fusermount3"):
        return "fuse3 installed but fusermount3 is still not on PATH"
    say("installed fuse3")
    return None


def main() -> int:
    try:
        repo = Path(__file__).resolve().parent.parent
        sys.path.insert(0, str(repo))
        warning = ensure_fusermount()
        if warning:
            say(f"WARNING: {warning}")
        try:
            from fault_injection.juicefs import sweep_stale_mounts, unavailable_reason
        except Exception as exc:  # pytest not installed, syntax error, ...
            say(f"WARNING: cannot import fault_injection.juicefs ({exc}); JuiceFS tests may skip")
            return 0
        reason = unavailable_reason()
        if reason:
            say(f"JuiceFS tests will skip: {reason}")
        elif warning:
            say("JuiceFS tests will still try to mount (as root, without fusermount3)")
        else:
            say("JuiceFS test dependencies present")
        for mountpoint in sweep_stale_mounts():
            say(f"unmounted a stale JuiceFS test mount at {mountpoint}")
    except Exception as exc:  # never fail the run
        say(f"WARNING: unexpected error, JuiceFS tests may skip: {exc!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
