"""Hold owners' old path: ``straw.pool.hold_owners``."""

from .catalog import Catalog
from .clock import Clock
from .errors import StrawError
from .fs import Filesystem
from .pool.hold_owners import (
    HOLD_PREFIX,
    hold_owner,
    holds_of,
    release_all,
    release_holds_of_dead_writers,
    writer_of,
    writer_prefix,
)

__all__ = [
    "Catalog", "Clock", "Filesystem", "hold_owner", "HOLD_PREFIX", "holds_of",
    "release_all", "release_holds_of_dead_writers", "StrawError", "writer_of",
    "writer_prefix",
]
