"""Shared fixtures and Hypothesis profiles ("ci" by default, "deep" for `just fuzz`)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("STRAW_HYPOTHESIS_PROFILE", "ci"))

# JuiceFS two-mount fixtures (`juicefs_mounts`, `juicefs_dirs`) and a small tmpfs for the
# full-disk cases (`small_tmpfs`) for every test module.
pytest_plugins = ["tests.juicefs_fixture", "tests.tmpfs_fixture"]
