"""RolloutConfig: the seed's defaults and clear errors for bad options (issue 14, item 6)."""

import pytest

from straw.rollout.config import RolloutConfig
from straw.rollout.scheduling import StalenessBound, StalenessPolicy


def test_defaults_are_the_seeds():
    c = RolloutConfig()
    assert (c.segment_mib, c.io_concurrency, c.lease_seconds, c.online_gc) == (256, 4, 300.0, False)
    assert c.segment_target_bytes == 256 << 20
    assert c.heartbeat_seconds == 100.0
    assert c.store_options() == {"segment_target_bytes": 256 << 20, "online_gc": False}
    assert c.staleness_bound is None


def test_heartbeat_has_a_floor():
    assert RolloutConfig(lease_seconds=0.09).heartbeat_seconds == 0.1


@pytest.mark.parametrize("kwargs, fragment", [
    ({"segment_mib": 0}, "segment_mib"),
    ({"io_concurrency": True}, "io_concurrency"),
    ({"n_samples_per_prompt": 0}, "n_samples_per_prompt"),
    ({"lease_seconds": float("nan")}, "lease_seconds"),
    ({"lease_seconds": 0}, "lease_seconds"),
    ({"online_gc": 1}, "online_gc"),
    ({"min_refill": 65}, "min_refill"),
    ({"staleness_bound": 3}, "staleness_bound"),
])
def test_bad_options_name_the_option(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        RolloutConfig(**kwargs)


def test_a_staleness_bound_is_kept():
    bound = StalenessBound(2, StalenessPolicy.REJECT)
    assert RolloutConfig(staleness_bound=bound).staleness_bound is bound
