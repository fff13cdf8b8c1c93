"""The batch builder's old module path: its names, re-exported from their homes in
``straw.rollout.batches`` (the package's docstring describes the builder)."""

from __future__ import annotations

from .batches import BatchBuilder as BatchBuilder
from .batches.convert import ConvertHook as ConvertHook
from .batches.convert import RewardHook as RewardHook
from .batches.convert import default_convert as default_convert
from .batches.entries import STORED_VERSION as STORED_VERSION
from .batches.entries import Accepted as Accepted
from .batches.entries import backlog_columns as backlog_columns
from .batches.entries import backlog_of_columns as backlog_of_columns
from .batches.groups import DECODED_TOKENS_KEPT as DECODED_TOKENS_KEPT
from .batches.groups import lazy_group as lazy_group
from .batches.groups import read_accepted as read_accepted
from .batches.records import BUILDER_WORKER as BUILDER_WORKER
from .batches.records import COLLECTION_PREFIX as COLLECTION_PREFIX
from .batches.records import COLLECTION_SCHEMA as COLLECTION_SCHEMA
from .batches.records import PLAN_SCHEMA as PLAN_SCHEMA
from .batches.records import READY_SCHEMA as READY_SCHEMA
from .batches.state import FINISHED_KEPT as FINISHED_KEPT
from .batches.state import STATE_VERSION as STATE_VERSION
from .batches.state import empty_state as empty_state
from .batches.state import read_stored_state as read_stored_state

__all__ = ["BatchBuilder", "Accepted", "default_convert", "read_accepted", "lazy_group",
           "read_stored_state", "STORED_VERSION", "backlog_columns", "backlog_of_columns",
           "COLLECTION_PREFIX",
           "BUILDER_WORKER", "PLAN_SCHEMA", "READY_SCHEMA", "COLLECTION_SCHEMA"]
