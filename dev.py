#!/usr/bin/env python3
"""Bootstrap: `python3 dev.py demo` or `python3 dev.py test` (or any Justfile recipe).

Creates the project virtualenv `.venv` when missing, installs what the recipe needs into
it (`just` comes from PyPI as `rust-just`), and runs the recipe with that `just`.  Only
Python 3.10+ with venv and pip is required beforehand.  The installs are skipped when
`pyproject.toml` has not changed since the last run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venv")
BIN = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin")


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 10):
        print("straw needs Python 3.10 or newer", file=sys.stderr)
        return 2
    recipe = argv[:1] or ["demo"]
    # The demo needs the core library and Ray (it runs on a local Ray cluster; its policy
    # is NumPy, no torch); everything else gets the dev extras (tests, torch CPU build
    # pinned to 2.13.0, Ray, Hypothesis, CrossHair, linters).
    extra = "[ray]" if recipe[0] == "demo" else "[dev]"
    python = os.path.join(BIN, "python")
    if not os.path.exists(python):
        print(f"creating virtualenv {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        stamp_text = hashlib.sha256(f.read() + extra.encode()).hexdigest()
    stamp = os.path.join(VENV, f".straw-installed{extra or '[core]'}")
    current = open(stamp).read() if os.path.exists(stamp) else ""
    if current != stamp_text:
        print(f"installing straw{extra} and just into {VENV}", flush=True)
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        subprocess.check_call(pip + ["-e", f"{HERE}{extra}", "rust-just"])
        with open(stamp, "w") as f:
            f.write(stamp_text)
    just = os.path.join(BIN, "just")
    os.environ["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
    return subprocess.call([just, "--justfile", os.path.join(HERE, "Justfile"), *recipe,
                            *argv[1:]], cwd=HERE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
