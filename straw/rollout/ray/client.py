"""The job's controller actor as its callers reach it: ``RayController`` (what a node's
``GenerationClient`` calls, each call a blocking Ray call), ``controller_state`` (a
producer's recorded state, asked from inside an actor of the job), and ``ControllerLost``,
what a call raises once the actor died (there is no controller failover)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
import ray.exceptions

from straw import StrawError
from straw.protocol import AcquireResult, CommitReceipt, Lease


class ControllerLost(RuntimeError):
    """The job's controller actor died: the job fails (there is no failover)."""


def controller_lost(name: str, error: BaseException) -> ControllerLost:
    return ControllerLost(
        f"the rollout controller actor {name!r} died ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}); the job fails: there is no "
        "controller failover. Restart the job: a new controller recovers the queue "
        "(recover=True) and nothing accepted is lost")


class RayController:
    """The controller actor as a ``GenerationClient`` calls it: the same calls as
    ``RolloutController``'s worker side, each a blocking Ray call.  Errors the controller
    raises arrive as their own straw classes (Ray re-raises the cause's type); the actor's
    death is ``ControllerLost`` naming it."""

    def __init__(self, handle: Any, name: str) -> None:
        self.handle = handle
        self.name = name

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return ray.get(getattr(self.handle, method).remote(*args, **kwargs))
        except ray.exceptions.RayActorError as e:
            raise controller_lost(self.name, e) from e

    def take(self, worker_id: str, count: int, *, request_id: str | None = None
             ) -> AcquireResult:
        return self._call("take", worker_id, count, request_id=request_id)  # type: ignore[no-any-return]

    def heartbeat(self, leases: Sequence[Lease]) -> list[str]:
        return self._call("heartbeat", list(leases))  # type: ignore[no-any-return]

    def complete_many(self, items: Sequence[Mapping[str, Any]]
                      ) -> list[CommitReceipt | StrawError]:
        return self._call("complete_many", [dict(i) for i in items])  # type: ignore[no-any-return]

    def complete_and_take(self, items: Sequence[Mapping[str, Any]], worker_id: str,
                          count: int, *, request_id: str
                          ) -> tuple[list[CommitReceipt | StrawError], AcquireResult]:
        return self._call("complete_and_take", [dict(i) for i in items],  # type: ignore[no-any-return]
                          worker_id, count, request_id=request_id)

    def yield_groups(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        return self._call("yield_groups", [dict(u) for u in updates],  # type: ignore[no-any-return]
                          request_id=request_id)

    def save_progress(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        return self._call("save_progress", [dict(u) for u in updates],  # type: ignore[no-any-return]
                          request_id=request_id)

    def reject(self, lease: Lease, *, category: str, reason: str) -> str:
        return self._call("reject", lease, category=category, reason=reason)  # type: ignore[no-any-return]

    def release(self, leases: Sequence[Lease], *, request_id: str) -> list[str]:
        return self._call("release", list(leases), request_id=request_id)  # type: ignore[no-any-return]

    def task_status(self, task_id: str) -> dict[str, Any] | None:
        return self._call("task_status", task_id)  # type: ignore[no-any-return]

    @property
    def serving_version(self) -> int | str:
        return self._call("current_version")  # type: ignore[no-any-return]


_controllers: dict[str, Any] = {}


async def controller_state(name: str, producer_id: str) -> Any:
    """The queue's state of ``producer_id``, asked from inside an actor of the job (a
    generate function loading the weights a trainer recorded with ``record_state``) of
    the job's controller actor ``name`` (``RayRollout(name=...)``)."""
    handle = _controllers.get(name)
    if handle is None:
        handle = _controllers[name] = ray.get_actor(name)
    try:
        return await handle.producer_state.remote(producer_id)
    except ray.exceptions.RayActorError as e:
        raise controller_lost(name, e) from e


__all__ = ["RayController", "ControllerLost", "controller_lost", "controller_state"]
