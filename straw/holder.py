"""Role locks' old path: ``straw.pool.role_lock``."""

from .clock import Clock
from .fs import Filesystem
from .pool.pack import storage_error
from .pool.role_lock import COLLECTING, describe, if_dead, release, take

__all__ = [
    "Clock", "COLLECTING", "describe", "Filesystem", "if_dead", "release", "storage_error",
    "take",
]
