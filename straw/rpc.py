"""Serving a ``Coordinator`` to worker processes: JSON over HTTP with a shared token
(straw-queue 0.1.6's ``straw.rpc``: ``serve``, ``QueueClient``, ``METHODS``).

Only control messages travel here: leases, task specs, references, receipts.  Payload
bytes never do; workers read and write them in the pool themselves (a ``bytes`` value in
a request or a result is refused).

Wire format (the same as straw-queue's, so either side may be straw-queue's):

* request: ``POST`` with ``Authorization: Bearer <token>`` and the body
  ``{"method": name, "args": {keyword: value}}``; dataclasses travel as their
  ``dataclasses.asdict`` dicts;
* reply: ``200 {"result": value}`` (a dataclass result as its asdict dict: a worker
  rebuilds ``Lease(**assignment["lease"])``, ``RecordSetRef.from_dict(...)``), or
  ``409 {"error": class name, "message": text}`` for an error of the call, which the
  client raises again as the same straw error class.  A wrong token is ``403``.

The server decodes arguments back into our types *by keyword*: ``lease``/``leases`` into
``Lease``, ``tasks`` into ``TaskSpec``, every ``*_ref`` into ``RecordSetRef``, a consumer
recursively inside lists of dicts (``updates``); a consumer ``token`` is a plain str.
It calls only methods of the allow-list ``METHODS`` that the coordinator has, by name,
with the keywords given: whatever the coordinator's exact signatures, a wrong keyword is
the coordinator's own ``TypeError``, carried back.

Requests are served on threads (``ThreadingHTTPServer``): the coordinator is thread-safe
and concurrent completions share one journal fsync (group commit).  Uses only the
standard library.
"""

from __future__ import annotations

import dataclasses
import hmac
import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

from . import control_lane, errors
from .control_lane import CONTROL_ROLES
from .http_guard import SOCKET_TIMEOUT, GuardedHTTPServer
from .pool.refs import RecordSetRef
from .protocol import AcquireResult, Assignment, CommitPage, CommitReceipt, Lease, TaskSpec
from .queue.coordinator import DEFAULT_CONSUMER
from .reporting import canonical_json

# The coordinator methods a worker or a producer may call remotely: straw-queue's list,
# plus our worker-side additions.  Lifecycle (close, takeover) and maintenance
# (collect_garbage, snapshot) stay with the process that owns the coordinator.
METHODS = frozenset({
    "submit_tasks", "acquire", "heartbeat", "release_tasks", "complete_task", "fail_task",
    "cancel_task", "seal_input", "lookup_submission", "read_commits", "task_status",
    "metrics", "drain", "open_consumer", "close_consumer", "save_consumer_state",
    "load_consumer_state", "plan_batch", "batch_ready", "get_batch", "register_checkpoint",
    "producer_state", "yield_task", "save_task_progress", "save_task_progress_many",
    # ours
    "yield_tasks", "pending_tasks", "outstanding_reads", "release_task_reads",
    "retire_worker", "complete_and_acquire",
})

# Least privilege: what each role's token may call (one token for all would let any
# worker submit a forged producer state, drain the queue, cancel or retire others).
# ``token=`` (straw-queue's one shared token) is the operator's: every method, as there.
# The control lane (control tasks: a batch builder's collections, its batch plans) is
# ``CONTROL_ROLES``' alone: another role may not acquire with ``control=True``, submit a
# control task or pass a control task's lease, and its ``task_status`` shows no lease
# token (``straw.control_lane``: the rule and why).
ROLE_METHODS: dict[str, frozenset[str]] = {
    "worker": frozenset({
        "acquire", "heartbeat", "release_tasks", "complete_task", "complete_and_acquire",
        "fail_task", "yield_task", "yield_tasks", "save_task_progress",
        "save_task_progress_many", "release_task_reads", "lookup_submission", "task_status"}),
    "producer": frozenset({
        "submit_tasks", "seal_input", "producer_state", "pending_tasks",
        "lookup_submission", "task_status", "metrics"}),
    "consumer": frozenset({
        "read_commits", "open_consumer", "close_consumer", "save_consumer_state",
        "load_consumer_state", "plan_batch", "batch_ready", "get_batch",
        "register_checkpoint", "outstanding_reads", "lookup_submission", "task_status",
        "metrics",
        # a BatchBuilder's collection tasks (its own control tasks)
        "submit_tasks", "acquire", "complete_task"}),
    "operator": METHODS,
}

MAX_REQUEST_BYTES = 64 << 20  # control messages only; 100k task specs fit
# request bodies held at once (each becomes several times its size in objects): one
# request of the largest size, or many small ones (straw.http_guard)
MAX_INFLIGHT_BYTES = MAX_REQUEST_BYTES


class RemoteValueError(errors.StrawError, ValueError):
    """The coordinator refused an argument (``ValueError`` there).  Both a ``ValueError``
    and a straw error here: straw-queue's client raised its ``QueueError`` for these."""


class RemoteTypeError(errors.StrawError, TypeError):
    """The coordinator refused an argument's type or keyword (``TypeError`` there)."""


class RemoteKeyError(errors.StrawError, KeyError):
    """The coordinator did not find a key (``KeyError`` there)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


_BUILTIN = {"ValueError": RemoteValueError, "TypeError": RemoteTypeError,
            "KeyError": RemoteKeyError}


# --- values on the wire ---------------------------------------------------------------
# class -> its dataclass field names, or None when it is not a dataclass: a reply holds
# hundreds of dataclasses (leases, task specs, references), looked up once per class
_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _fields(cls: type) -> tuple[str, ...] | None:
    try:
        return _FIELDS[cls]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(cls)) \
            if dataclasses.is_dataclass(cls) else None
        _FIELDS[cls] = names
        return names


def to_wire(value: Any) -> Any:
    """A JSON-able copy of ``value``: dataclasses as their asdict dicts, tuples as lists.
    Payload bytes are refused (``TypeError``): they never travel over the control
    channel."""
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return value
    names = _fields(t)
    if names is not None:
        return {n: to_wire(getattr(value, n)) for n in names}
    if isinstance(value, Mapping):
        return {str(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_wire(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError("payload bytes do not travel over straw.rpc: publish them to the "
                        "pool and pass the RecordSetRef")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _build(cls: Any, value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        return value  # already decoded, or None: the coordinator checks it
    from_dict = getattr(cls, "from_dict", None)
    if from_dict is not None:
        return from_dict(value)
    try:
        return cls(**{k: from_wire(k, v) for k, v in value.items()})
    except TypeError as e:
        raise TypeError(f"argument {where} is not a {cls.__name__} dict: {e}") from None


def from_wire(key: str, value: Any) -> Any:
    """Decode the value of keyword ``key`` into our types (see the module docstring)."""
    if key == "lease":
        return _build(Lease, value, key)
    if key in ("leases", "tasks") and isinstance(value, list):
        cls = Lease if key == "leases" else TaskSpec
        return [_build(cls, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if key.endswith("_ref"):
        return _build(RecordSetRef, value, key)
    if isinstance(value, list):
        return [{k: from_wire(k, v) for k, v in item.items()} if isinstance(item, Mapping)
                else item for item in value]
    return value


# --- the server -------------------------------------------------------------------------
class ControlServer(GuardedHTTPServer):
    """An HTTP server of one coordinator.  ``address`` is where it is bound (the port
    chosen when 0 was asked), ``url`` what a ``QueueClient`` connects to.  What a peer can
    make it hold is bounded (``straw.http_guard``: connections, time to a request, request
    memory); ``limits`` overrides those bounds (its keywords).

    Tokens: ``token`` is straw-queue's one shared token, the operator's (every method of
    ``METHODS``); ``tokens`` maps roles of ``role_methods`` (``worker``, ``producer``,
    ``consumer``, ``operator``) to tokens of their own, each allowed its role's methods
    only (another method is ``PermissionError``, nothing called).  Give each process the
    token of what it does.  The control lane is ``control_roles``' only (the comment of
    ``ROLE_METHODS``): ``permit_lane`` checks a call's arguments, ``shown`` its reply."""

    role_methods: Mapping[str, frozenset[str]] = ROLE_METHODS
    control_roles: frozenset[str] = CONTROL_ROLES

    def __init__(self, coordinator: Any, address: tuple[str, int], *,
                 token: str | None = None, tokens: Mapping[str, str] | None = None,
                 **limits: Any) -> None:
        self._tokens = _role_tokens(token, tokens, self.role_methods)
        self.coordinator = coordinator
        limits.setdefault("max_inflight_bytes", MAX_INFLIGHT_BYTES)
        super().__init__(address, _Handler, **limits)

    def authenticate(self, header: bytes) -> str | None:
        """The role whose token ``header`` (``Authorization``) carries, or None.  Every
        token is compared, in constant time each, whichever matches."""
        role = None
        for expected, name in self._tokens:
            if hmac.compare_digest(header, expected):
                role = name
        return role

    def permit(self, method: str, role: str) -> None:
        """``PermissionError`` unless ``role`` may call ``method``."""
        if method not in self.role_methods[role]:
            raise PermissionError(f"the {role} token may not call {method!r} (it may call "
                                  f"{', '.join(sorted(self.role_methods[role]))}): use the "
                                  "token of the role that does")

    @property
    def address(self) -> tuple[str, int]:
        return self.server_address[0], self.server_address[1]  # type: ignore[return-value]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}"

    def dispatch(self, request: Any, role: str = "operator") -> Any:
        if not isinstance(request, Mapping) or not isinstance(request.get("method"), str) \
                or not isinstance(request.get("args", {}), Mapping):
            raise ValueError('an RPC request is {"method": name, "args": {keyword: value}}')
        method = request["method"]
        if method in METHODS:
            self.permit(method, role)
        target = getattr(self.coordinator, method, None) if method in METHODS else None
        if target is None:
            served = sorted(m for m in METHODS if hasattr(self.coordinator, m))
            raise ValueError(f"unknown control operation {method!r}; the coordinator serves "
                             f"{', '.join(served)}")
        args = {k: from_wire(k, v) for k, v in request.get("args", {}).items()}
        self.permit_lane(method, role, args)
        return to_wire(self.shown(method, role, target(**args)))

    def permit_lane(self, method: str, role: str, args: Mapping[str, Any]) -> None:
        """``PermissionError`` if the call (its decoded ``args``) reaches the control lane
        and ``role`` is not one of ``control_roles`` (``straw.control_lane``)."""
        if role not in self.control_roles and control_lane.reaches(self.coordinator, args):
            raise PermissionError(
                f"the {role} token may not call {method!r} on the control lane (control "
                "tasks are the batch builder's): use the consumer (trainer) or operator "
                "token, or leave control tasks alone")

    def shown(self, method: str, role: str, value: Any) -> Any:
        """``value``, the reply of ``method``, as ``role`` may see it (a ``task_status``
        lease's token hidden: ``straw.control_lane``)."""
        if method != "task_status":
            return value
        return control_lane.status_shown(role, value, self.control_roles)

    def close(self) -> None:
        """Stop serving (from another thread than ``serve_forever``'s) and free the port."""
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ControlServer
    timeout = SOCKET_TIMEOUT  # set on the socket before the request line is read

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        role = self.server.authenticate(self.headers.get("Authorization", "").encode())
        if role is None:
            self._reply(403, {"error": "PermissionError",
                              "message": "the coordinator refused the RPC token"})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 < length <= MAX_REQUEST_BYTES:
            self._reply(413 if length > 0 else 400, {
                "error": "ValueError",
                "message": f"an RPC request needs a Content-Length of 1..{MAX_REQUEST_BYTES}"})
            return
        if not self.server.budget.take(length, self.server.budget_wait):
            self._reply(503, {"error": "StorageUnavailable", "message": (
                f"the coordinator holds its request memory ({self.server.budget.limit} "
                "bytes) for other requests; retry")})
            return
        try:
            raw = self.rfile.read(length)
            if len(raw) < length:
                return  # the peer went away (or its time ran out) mid-body: nothing to do
            self.server.request_read(self.connection)
            try:
                request = json.loads(raw)
                del raw
                body, status = {"result": self.server.dispatch(request, role)}, 200
            except PermissionError as e:  # the role may not call it: nothing was called
                body, status = {"error": "PermissionError", "message": str(e)}, 403
            except (errors.StrawError, ValueError, TypeError, KeyError) as e:
                body, status = {"error": type(e).__name__, "message": _message(e)}, 409
            except Exception as e:  # a bug in the call: report it, keep serving
                body, status = {"error": type(e).__name__, "message": _message(e)}, 500
        finally:
            self.server.budget.give(length)
        self._reply(status, body)

    def _reply(self, status: int, body: Any) -> None:
        try:
            data = canonical_json(body)
        except (TypeError, ValueError) as e:
            status, data = 500, canonical_json({"error": "TypeError", "message": str(e)})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller can find a durable result again by its idempotency id

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # a request log per call would flood the coordinator's output


def _role_tokens(token: str | None, tokens: Mapping[str, str] | None,
                 roles: Mapping[str, frozenset[str]]) -> list[tuple[bytes, str]]:
    """``[(b"Bearer <token>", role)]``: ``token`` is the operator's; every token is a
    non-empty str of its own."""
    named = dict(tokens or {})
    if token is not None:
        if "operator" in named:
            raise ValueError("give the operator's token once: token= or tokens['operator']")
        named["operator"] = token
    if not named:
        raise ValueError("straw.rpc needs a job-scoped token (a non-empty str, e.g. "
                         "secrets.token_hex(32)) shared with the workers")
    for role, value in named.items():
        if role not in roles:
            raise ValueError(f"unknown role {role!r}: the roles are {', '.join(roles)}")
        if not isinstance(value, str) or not value:
            raise ValueError(f"the {role} token must be a non-empty str (e.g. "
                             "secrets.token_hex(32))")
    if len(set(named.values())) != len(named):
        raise ValueError("each role needs a token of its own (two roles share one)")
    return [(f"Bearer {value}".encode(), role) for role, value in named.items()]


def _message(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


def start(coordinator: Any, address: tuple[str, int], *, token: str | None = None,
          tokens: Mapping[str, str] | None = None, **limits: Any) -> ControlServer:
    """Serve ``coordinator`` on a background thread; returns the server (``.url``,
    ``.address``, ``.close()``).  An addition to straw-queue's ``serve``; ``token`` and
    ``tokens`` as ``ControlServer``'s; ``limits``: the bounds of ``straw.http_guard``
    (``max_connections``, ``request_seconds``, ``max_inflight_bytes``, ``budget_wait``)."""
    server = ControlServer(coordinator, address, token=token, tokens=tokens, **limits)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                     name=f"straw.rpc {server.url}", daemon=True).start()
    return server


def serve(coordinator: Any, address: tuple[str, int], *, token: str,
          ready: Callable[[tuple[str, int]], Any] | None = None) -> None:
    """Serve ``coordinator`` at ``address`` (``(host, port)``; port 0 picks one) until the
    process ends; ``ready(bound_address)`` is called once it accepts connections."""
    with ControlServer(coordinator, address, token=token) as server:
        if ready is not None:
            ready(server.address)
        server.serve_forever(poll_interval=0.2)


# --- the client -------------------------------------------------------------------------
class QueueClient:
    """Calls a served coordinator: ``client.call("acquire", worker_id="w", max_tasks=1)``
    returns the JSON result (dataclasses as dicts, as straw-queue's client returns them);
    an error of the call is raised again as the same straw error class.  Safe to share
    between threads (one connection per call)."""

    def __init__(self, address: str, *, token: str, timeout: float = 30,
                 metadata_bytes: int = 256 * 1024) -> None:
        url = urllib.parse.urlsplit(address)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"address {address!r} must be an http://host:port URL (the "
                             "served coordinator's address)")
        if not isinstance(token, str) or not token:
            raise ValueError("token must be the non-empty str the coordinator serves with")
        self.address, self.token, self.timeout = address, token, timeout
        self.metadata_bytes = metadata_bytes  # accepted for straw-queue; not a limit here
        self._host, self._port = url.hostname, url.port or 80
        self._path = url.path or "/"

    def call(self, method: str, **args: Any) -> Any:
        data = canonical_json({"method": method, "args": to_wire(args)})
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.request("POST", self._path, body=data, headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            response = conn.getresponse()
            status, content = response.status, response.read()
        except (OSError, http.client.HTTPException) as e:
            # a ConnectionError (an OSError, as straw-queue's client raised URLError); a
            # reply cut off mid-way (IncompleteRead, BadStatusLine: the server died while
            # answering) is a lost reply too, not another kind of error
            raise ConnectionError(
                f"straw.rpc: no reply from the coordinator at {self.address} to {method} "
                f"({e}); if the call mutates, retry with the same idempotency id") from e
        finally:
            conn.close()
        try:
            value = json.loads(content)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise errors.StrawError(f"straw.rpc: the server at {self.address} sent HTTP "
                                    f"{status} without a straw reply to {method}")
        if status == 200 and "result" in value:
            return value["result"]
        raise _error(str(value.get("error")), str(value.get("message")), status, self.address)

    def __repr__(self) -> str:
        return f"QueueClient({self.address!r})"


def _error(name: str, message: str, status: int, address: str) -> BaseException:
    if status == 403:
        if message.startswith("the ") and " token may not call " in message:
            return PermissionError(f"the coordinator at {address}: {message}")
        return PermissionError(f"the coordinator at {address} refused the token: use the "
                               "token it was served with")
    cls = getattr(errors, name, None) if name in errors.__all__ else None
    if isinstance(cls, type) and issubclass(cls, errors.StrawError):
        return cls(message)
    if name in _BUILTIN:
        return _BUILTIN[name](message)
    return errors.StrawError(f"the coordinator at {address} failed with {name}: {message}")


# --- a typed remote coordinator ----------------------------------------------------------
def _receipt(value: Any) -> CommitReceipt | None:
    return None if value is None else CommitReceipt.from_dict(value)


class RemoteCoordinator:
    """A served coordinator as a library client calls it: the consumer's and a control
    task's calls (what a batch builder in a trainer process makes), with our types.

    ``RemoteCoordinator(url, token=...)`` stands in for the ``Coordinator`` object: the
    same method names and keywords, results decoded (``AcquireResult``,
    ``CommitReceipt``, ``CommitPage``; views stay the coordinator's dicts), errors raised
    as the same straw error classes (``QueueClient``).  ``consumer_id`` is the queue's
    designated consumer (``Coordinator(consumer_id=...)``; ``"training"`` unless the
    controller chose another).

    Retry-safe: a lost reply (``ConnectionError``: no reply, or one cut off) of a call
    that is safe to repeat is retried here, ``retries`` times, waiting ``retry_wait``
    seconds doubled each time (a restarting coordinator answers again in a moment).
    Safe to repeat: every read, and every call that carries its idempotency id
    (``submit_tasks``' request id, ``complete_task``'s submission id, a consumer save's
    request id; ``plan_batch`` and ``batch_ready`` with the same content answer the
    first reply), ``close_consumer`` (a retry that finds the consumer closed: it was
    this call) and ``open_consumer(..., takeover=True)`` (a retry fences the token whose
    reply was lost).  Not repeated: ``acquire`` and ``heartbeat`` (a lost ``acquire``
    granted leases nobody holds: they expire, or ``task_status`` names them) and a plain
    ``open_consumer`` (a retry would find the consumer held by the lost reply's token:
    open it with ``takeover=True``); their ``ConnectionError`` reaches the caller.

    Lifecycle and maintenance calls (``close``, ``collect_garbage``, ``snapshot``) are
    not served (``METHODS``): they stay with the controller's process.  Holds no
    connection between calls: safe to share between threads and across ``fork``."""

    def __init__(self, address: str, *, token: str, consumer_id: str = DEFAULT_CONSUMER,
                 timeout: float = 30, retries: int = 5, retry_wait: float = 0.2) -> None:
        if not isinstance(consumer_id, str) or not consumer_id:
            raise ValueError(f"consumer_id must be a non-empty str, got {consumer_id!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if not isinstance(retry_wait, (int, float)) or retry_wait < 0:
            raise ValueError(f"retry_wait must be a number of seconds >= 0, got "
                             f"{retry_wait!r}")
        self.client = QueueClient(address, token=token, timeout=timeout)
        self.consumer_id = consumer_id
        self.retries, self.retry_wait = retries, float(retry_wait)

    def _call(self, method: str, *, retry: bool, **args: Any) -> Any:
        """One call; a lost reply retried when ``retry`` (the call is safe to repeat)."""
        for attempt in range(self.retries + 1 if retry else 1):
            try:
                return self.client.call(method, **args)
            except ConnectionError:
                if not retry or attempt == self.retries:
                    raise
            time.sleep(self.retry_wait * 2 ** attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    # producers and control tasks
    def submit_tasks(self, request_id: str, tasks: Any, **kw: Any) -> Any:
        return self._call("submit_tasks", retry=True, request_id=request_id,
                          tasks=list(tasks), **kw)

    def producer_state(self, producer_id: str) -> Any:
        return self._call("producer_state", retry=True, producer_id=producer_id)

    def acquire(self, worker_id: str, max_tasks: int = 1, **kw: Any) -> AcquireResult:
        got = self._call("acquire", retry=False, worker_id=worker_id, max_tasks=max_tasks,
                         **kw)
        return AcquireResult(got["status"], tuple(
            Assignment(TaskSpec.from_dict(a["task"]), Lease.from_dict(a["lease"]))
            for a in got["assignments"]))

    def heartbeat(self, leases: Any) -> list[str]:
        return list(self._call("heartbeat", retry=False, leases=list(leases)))

    def complete_task(self, lease: Lease, *, submission_id: str, result_ref: RecordSetRef,
                      **kw: Any) -> CommitReceipt:
        got = self._call("complete_task", retry=True, lease=lease,
                         submission_id=submission_id, result_ref=result_ref, **kw)
        return CommitReceipt.from_dict(got)

    # reads
    def read_commits(self, cursor: int = 0, limit: int = 100) -> CommitPage:
        got = self._call("read_commits", retry=True, cursor=cursor, limit=limit)
        return CommitPage(tuple(CommitReceipt.from_dict(c) for c in got["commits"]),
                          int(got["cursor"]), bool(got["end_of_input"]))

    def lookup_submission(self, submission_id: str) -> CommitReceipt | None:
        return _receipt(self._call("lookup_submission", retry=True,
                                   submission_id=submission_id))

    def task_status(self, task_id: str) -> dict[str, Any] | None:
        return self._call("task_status", retry=True, task_id=task_id)  # type: ignore[no-any-return]

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        return self._call("get_batch", retry=True, batch_id=batch_id)  # type: ignore[no-any-return]

    def load_consumer_state(self, consumer_id: str) -> dict[str, Any] | None:
        return self._call("load_consumer_state", retry=True,  # type: ignore[no-any-return]
                          consumer_id=consumer_id)

    def metrics(self) -> dict[str, Any]:
        return self._call("metrics", retry=True)  # type: ignore[no-any-return]

    # the consumer
    def open_consumer(self, consumer_id: str, *, exclusive_owner: str,
                      takeover: bool = False) -> str:
        args: dict[str, Any] = {"consumer_id": consumer_id, "exclusive_owner": exclusive_owner}
        if takeover:  # straw-queue's coordinator has no takeover keyword: sent when used
            args["takeover"] = True
        return str(self._call("open_consumer", retry=bool(takeover), **args))

    def close_consumer(self, consumer_id: str, token: str) -> None:
        try:
            self.client.call("close_consumer", consumer_id=consumer_id, token=token)
            return
        except ConnectionError:
            if not self.retries:
                raise
        try:  # the reply was lost: a retry that finds the token stale was this close
            self._call("close_consumer", retry=True, consumer_id=consumer_id, token=token)
        except errors.StaleAttempt:
            pass

    def save_consumer_state(self, consumer_id: str, **kw: Any) -> dict[str, Any]:
        return self._call("save_consumer_state", retry=True,  # type: ignore[no-any-return]
                          consumer_id=consumer_id, **kw)

    def plan_batch(self, consumer_id: str, **kw: Any) -> dict[str, Any]:
        return self._call("plan_batch", retry=True, consumer_id=consumer_id, **kw)  # type: ignore[no-any-return]

    def batch_ready(self, consumer_id: str, **kw: Any) -> dict[str, Any]:
        return self._call("batch_ready", retry=True, consumer_id=consumer_id, **kw)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RemoteCoordinator({self.client.address!r}, consumer_id={self.consumer_id!r})"


__all__ = ["CONTROL_ROLES", "ControlServer", "METHODS", "QueueClient", "RemoteCoordinator",
           "RemoteKeyError", "RemoteTypeError", "RemoteValueError", "from_wire", "serve",
           "start", "to_wire"]
