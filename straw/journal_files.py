"""The old path of ``straw.durable.journal_files``: reading a queue journal's files."""

from __future__ import annotations

from .durable.journal_files import CLEAN_RUN, Reader, read_to_clean_end

__all__ = ["CLEAN_RUN", "Reader", "read_to_clean_end"]
