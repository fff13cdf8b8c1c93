"""The controller served to generation processes: ``straw.rpc``'s wire format (JSON over
HTTP, a job-scoped token) with the controller's calls beside the coordinator's.

The coordinator is one process (the controller's); generation clients in other processes
reach it here.  Only control messages travel: leases, references, receipts; clients read
inputs and publish groups in the pool themselves.

* ``RolloutServer(controller, address, token=...)``: a ``straw.rpc.ControlServer`` whose
  dispatch adds ``CONTROLLER_METHODS`` (served by the controller) to the coordinator's
  allow-list; ``start(controller, address, token=...)`` serves it on a thread.
* ``RemoteController(url, token=...)``: what a ``GenerationClient`` in another process
  takes instead of the controller; the same calls, results decoded into our types, errors
  raised as the same straw error classes (``straw.rpc.QueueClient``).  A lost reply is a
  ``ConnectionError``: every call the client makes is safe to retry (its request ids are
  derived from the attempt, D7).
* a trainer in another process gives its ``BatchBuilder`` the served coordinator as
  ``straw.rpc.RemoteCoordinator(url, token=trainer_token)`` (the builder's calls are the
  coordinator's consumer calls, which this server serves to the trainer's token); a
  restarted trainer opens it with ``BatchBuilder(..., takeover=True)``, fencing its dead
  predecessor's consumer.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from straw import errors
from straw.protocol import AcquireResult, Assignment, CommitReceipt, Lease, TaskSpec
from straw.rpc import METHODS, ROLE_METHODS, ControlServer, QueueClient, from_wire, to_wire

from .controller import RolloutController

# the controller's calls a generation client makes (the coordinator's own stay served)
CONTROLLER_METHODS = frozenset({
    "take", "heartbeat", "complete_many", "complete_and_take", "yield_groups",
    "save_progress", "reject", "release", "current_version", "task_status",
})


# who may call what here (least privilege): generation clients only the
# controller's calls; the trainer (a BatchBuilder through RemoteCoordinator) the
# coordinator's consumer calls; the operator everything.  The control lane stays the
# trainer's and the operator's (``straw.rpc.CONTROL_ROLES``): a generation client's
# calls never reach a control task, and its ``task_status`` shows no lease token.
ROLLOUT_ROLES: dict[str, frozenset[str]] = {
    "generation": CONTROLLER_METHODS,
    "consumer": ROLE_METHODS["consumer"],
    "operator": METHODS | CONTROLLER_METHODS,
}


class RolloutServer(ControlServer):
    """Serves ``controller`` (its calls) and its coordinator (``straw.rpc.METHODS``).
    ``token`` is the generation clients' (the controller's calls only: a worker cannot
    submit, drain, cancel or retire); ``trainer_token`` the trainer's (the coordinator's
    consumer calls, ``straw.rpc.ROLE_METHODS["consumer"]``); ``operator_token`` may call
    everything.  ``limits``: ``straw.http_guard``'s bounds."""

    role_methods = ROLLOUT_ROLES

    def __init__(self, controller: RolloutController, address: tuple[str, int], *,
                 token: str, trainer_token: str | None = None,
                 operator_token: str | None = None, **limits: Any) -> None:
        if not isinstance(controller, RolloutController):
            raise TypeError(f"controller must be a RolloutController, got "
                            f"{type(controller).__name__}")
        tokens = {"generation": token, "consumer": trainer_token, "operator": operator_token}
        super().__init__(controller.coordinator, address,
                         tokens={r: t for r, t in tokens.items() if t is not None}, **limits)
        self.controller = controller

    def dispatch(self, request: Any, role: str = "operator") -> Any:
        method = request.get("method") if isinstance(request, Mapping) else None
        if method not in CONTROLLER_METHODS:
            return super().dispatch(request, role)  # the coordinator's (permitted there)
        self.permit(method, role)
        raw = request.get("args", {})
        if not isinstance(raw, Mapping):
            raise ValueError('an RPC request is {"method": name, "args": {keyword: value}}')
        args = {k: from_wire(k, v) for k, v in raw.items()}
        self.permit_lane(method, role, args)
        out = self.shown(method, role, getattr(self.controller, method)(**args))
        if method == "complete_many":
            out = _outcomes_to_wire(out)
        elif method == "complete_and_take":
            out = {"outcomes": _outcomes_to_wire(out[0]), "take": out[1]}
        return to_wire(out)


def _outcomes_to_wire(outcomes: Sequence[Any]) -> list[Any]:
    """Completion outcomes as they travel: per-item errors as ``{"error", "message"}``."""
    return [{"error": type(o).__name__, "message": str(o)}
            if isinstance(o, BaseException) else o for o in outcomes]


def start(controller: RolloutController, address: tuple[str, int], *, token: str,
          **kw: Any) -> RolloutServer:
    """Serve ``controller`` on a background thread; returns the server (``.url``,
    ``.close()``); ``kw``: ``RolloutServer``'s other keywords."""
    server = RolloutServer(controller, address, token=token, **kw)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                     name=f"straw.rollout {server.url}", daemon=True).start()
    return server


def _error(value: Mapping[str, Any]) -> errors.StrawError:
    name, message = str(value.get("error")), str(value.get("message"))
    cls = getattr(errors, name, None) if name in errors.__all__ else None
    if isinstance(cls, type) and issubclass(cls, errors.StrawError):
        return cls(message)
    return errors.StrawError(f"{name}: {message}")


def _acquired(got: Mapping[str, Any]) -> AcquireResult:
    return AcquireResult(got["status"], tuple(
        Assignment(TaskSpec.from_dict(a["task"]), Lease.from_dict(a["lease"]))
        for a in got["assignments"]))


def _outcomes(got: Sequence[Mapping[str, Any]]) -> list[CommitReceipt | errors.StrawError]:
    return [_error(o) if "error" in o else CommitReceipt.from_dict(o) for o in got]


class RemoteController:
    """A served controller, as a generation client calls it (module docstring)."""

    def __init__(self, address: str, *, token: str, timeout: float = 60) -> None:
        self.client = QueueClient(address, token=token, timeout=timeout)

    def take(self, worker_id: str, count: int, *, request_id: str | None = None
             ) -> AcquireResult:
        return _acquired(self.client.call("take", worker_id=worker_id, count=count,
                                          request_id=request_id))

    def heartbeat(self, leases: Sequence[Lease]) -> list[str]:
        return list(self.client.call("heartbeat", leases=list(leases)))

    def complete_many(self, items: Sequence[Mapping[str, Any]]
                      ) -> list[CommitReceipt | errors.StrawError]:
        return _outcomes(self.client.call("complete_many", items=list(items)))

    def complete_and_take(self, items: Sequence[Mapping[str, Any]], worker_id: str,
                          count: int, *, request_id: str
                          ) -> tuple[list[CommitReceipt | errors.StrawError], AcquireResult]:
        got = self.client.call("complete_and_take", items=list(items), worker_id=worker_id,
                               count=count, request_id=request_id)
        return _outcomes(got["outcomes"]), _acquired(got["take"])

    def yield_groups(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        return str(self.client.call("yield_groups", updates=list(updates),
                                    request_id=request_id))

    def save_progress(self, updates: Sequence[Mapping[str, Any]], *, request_id: str) -> str:
        return str(self.client.call("save_progress", updates=list(updates),
                                    request_id=request_id))

    def reject(self, lease: Lease, *, category: str, reason: str) -> str:
        return str(self.client.call("reject", lease=lease, category=category, reason=reason))

    def release(self, leases: Sequence[Lease], *, request_id: str) -> list[str]:
        return list(self.client.call("release", leases=list(leases), request_id=request_id))

    def task_status(self, task_id: str) -> dict[str, Any] | None:
        out = self.client.call("task_status", task_id=task_id)
        return None if out is None else dict(out)

    @property
    def serving_version(self) -> int | str:
        return self.client.call("current_version")  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RemoteController({self.client.address!r})"


__all__ = ["CONTROLLER_METHODS", "RolloutServer", "RemoteController", "start"]
