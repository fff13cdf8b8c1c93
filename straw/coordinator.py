"""The coordinator's module path that straw-queue callers and vime import.

``straw.coordinator is straw.queue.coordinator`` (an alias, not a copy), so a name
patched through this path reaches the code that uses it.  The names are also listed here,
for type checkers.
"""

from __future__ import annotations

import sys

from .queue import coordinator as _coordinator
from .queue.coordinator import (
    DEFAULT_CONSUMER,
    NAMESPACE_FALSE,
    NAMESPACE_TRUE,
    Coordinator,
    StorageUnavailable,
    queue_dir,
    read_state,
    replay,
)

__all__ = ["Coordinator", "DEFAULT_CONSUMER", "NAMESPACE_FALSE", "NAMESPACE_TRUE",
           "StorageUnavailable", "queue_dir", "read_state", "replay"]

sys.modules[__name__] = _coordinator
