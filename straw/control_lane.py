"""The control lane on the control servers (``straw.rpc``, ``straw.rollout.remote``).

Control tasks (``TaskSpec(control=True)``: a batch builder's collections, whose commits
are the batch plans) belong to ``CONTROL_ROLES``, the roles of the processes that build
batches: the consumer (the trainer's token) and the operator.  A call of any other role
(a worker, a producer, a generation client) is refused when it reaches the lane
(``reaches``): ``control=True`` (acquire), a control task submitted, or the lease of a
control task passed (complete, fail, heartbeat, yield, release it).  A lease token is
derived from the lease's other fields (a checksum, not a secret), so it is this check, not
a hidden token, that keeps a worker from forging a batch plan.  Still, ``task_status``
shows a lease's ``token`` only to the operator, and to the consumer for a control task
(a builder that lost a reply resumes its collection lease from it): ``status_shown``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .protocol import Lease

CONTROL_ROLES = frozenset({"consumer", "operator"})


def reaches(coordinator: Any, args: Mapping[str, Any]) -> bool:
    """Whether a call with the (decoded) keyword arguments ``args`` reaches the control
    lane of ``coordinator``."""
    tasks = args.get("tasks")
    return args.get("control", False) is not False or any(
        getattr(t, "control", False) is not False
        for t in (tasks if isinstance(tasks, list) else ())) or any(
        _control_task(coordinator, t) for t in _lease_task_ids(args))


def status_shown(role: str, status: Any, owners: frozenset[str] = CONTROL_ROLES) -> Any:
    """A ``task_status`` reply as ``role`` may see it, ``owners`` being the roles of the
    control lane (module docstring)."""
    if not isinstance(status, Mapping) or role == "operator":
        return status
    lease = status.get("lease")
    if not isinstance(lease, Mapping) or "token" not in lease:
        return status
    if role in owners and _is_control(status):
        return status
    return {**status, "lease": {k: v for k, v in lease.items() if k != "token"}}


def _control_task(coordinator: Any, task_id: str) -> bool:
    """Whether ``task_id`` is a control task: a live task of a straw ``Coordinator`` (no
    lock taken, no history read), else what the coordinator's ``task_status`` says."""
    tasks = getattr(getattr(coordinator, "state", None), "tasks", None)
    loaded = getattr(tasks, "loaded_task", None)
    if loaded is not None:
        task = loaded(task_id)
        return task is not None and task.control is True
    status = getattr(coordinator, "task_status", lambda _: None)(task_id)
    return isinstance(status, Mapping) and _is_control(status)


def _is_control(status: Mapping[str, Any]) -> bool:
    spec = status.get("spec")
    return isinstance(spec, Mapping) and spec.get("control") is True


def _lease_task_ids(args: Mapping[str, Any]) -> list[str]:
    """The task ids of the leases among a call's arguments: ``lease``, ``leases``, and
    the ``lease`` of each dict of ``items``/``updates``."""
    out = []
    for key in ("lease", "leases", "items", "updates"):
        value = args.get(key)
        for v in value if isinstance(value, list) else [value]:
            lease = v.get("lease") if isinstance(v, Mapping) else v
            if isinstance(lease, Lease) and isinstance(lease.task_id, str):
                out.append(lease.task_id)
    return out
