"""The rollout layer's options, with the seed's defaults (issue 14, item 6).

One frozen value shared by the controller, the generation clients and the batch builder,
so a job states each option once.  The defaults are the ones the user documentation
gives (``seed-000-vime-straw.txt``, "Packed storage" and "Online GC"):

=====================  =======  ==============================================
option                 default  purpose
=====================  =======  ==============================================
``segment_mib``        256      pack rotation target (MiB) of every store
``io_concurrency``     4        bound on concurrent serialization and filesystem
                                I/O submissions (the batch builder serializes and
                                publishes this many rank shards at a time)
``lease_seconds``      300      worker lease; a client's heartbeat renews it
``online_gc``          False    background collection after acknowledgements
=====================  =======  ==============================================

The rest have no seed default and are ours: ``n_samples_per_prompt`` (1), the refill
bounds of the data source (8..64 groups, ``data_source.MIN_REFILL``/``MAX_REFILL``),
``max_attempts`` (3, the queue's default: how many failures, lease expiries included, a
prompt task may spend before it fails for good; a release spends none) and the optional
staleness bound (off).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .data_source import MAX_REFILL, MIN_REFILL
from .scheduling import StalenessBound

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    segment_mib: int = 256
    io_concurrency: int = 4
    lease_seconds: float = 300.0
    online_gc: bool = False
    n_samples_per_prompt: int = 1
    min_refill: int = MIN_REFILL
    max_refill: int = MAX_REFILL
    max_attempts: int = 3
    staleness_bound: StalenessBound | None = None

    def __post_init__(self) -> None:
        for name in ("segment_mib", "io_concurrency", "n_samples_per_prompt", "min_refill",
                     "max_refill", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutConfig.{name} must be an int >= 1, got {value!r}")
        if self.min_refill > self.max_refill:
            raise ValueError(f"RolloutConfig.min_refill ({self.min_refill}) is larger than "
                             f"max_refill ({self.max_refill}); lower min_refill or raise "
                             f"max_refill")
        lease = self.lease_seconds
        if (isinstance(lease, bool) or not isinstance(lease, (int, float))
                or not math.isfinite(lease) or lease <= 0):
            raise ValueError(f"RolloutConfig.lease_seconds must be a finite number > 0, "
                             f"got {lease!r}")
        if not isinstance(self.online_gc, bool):
            raise ValueError(f"RolloutConfig.online_gc must be a bool, got {self.online_gc!r}")
        if self.staleness_bound is not None and not isinstance(self.staleness_bound,
                                                               StalenessBound):
            raise ValueError(f"RolloutConfig.staleness_bound must be a StalenessBound or None, "
                             f"got {type(self.staleness_bound).__name__}")

    @property
    def segment_target_bytes(self) -> int:
        """The store's ``segment_target_bytes`` for this job's pack rotation target."""
        return self.segment_mib * MIB

    @property
    def heartbeat_seconds(self) -> float:
        """How often a client renews its leases: a third of the lease, at least 0.1 s, so
        two renewals can be lost before a healthy worker's lease expires."""
        return max(0.1, self.lease_seconds / 3)

    def store_options(self) -> dict[str, Any]:
        """Keyword arguments for ``SharedFilesystemStore`` that this configuration fixes."""
        return {"segment_target_bytes": self.segment_target_bytes, "online_gc": self.online_gc}
