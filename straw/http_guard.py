"""What a stranger can make straw's HTTP control servers hold: bounded.

``GuardedHTTPServer`` is the ``ThreadingHTTPServer`` base of ``straw.rpc.ControlServer``
(and so of the rollout layer's server).  Each connection carries one request (HTTP/1.0).
Its limits, each an assertion about what one peer can cost the process that owns the
coordinator:

* **Connections**: at most ``max_connections`` are served at once (one thread each); a
  connection past that is answered ``503`` and closed at once, so no stranger can pin every
  thread or exhaust the descriptors the coordinator's own journal needs.
* **Time to a request**: a connection must deliver its whole request (line, headers and
  body) within ``request_seconds`` of being accepted, however slowly it trickles bytes
  (each ``recv`` also times out after ``SOCKET_TIMEOUT``).  A reaper thread shuts down the
  socket of one past its deadline, which ends its handler.  Once the request is read the
  call itself runs without this deadline (the coordinator's work).
* **Request memory**: the bodies being read or served at once hold at most
  ``max_inflight_bytes`` between them (``ByteBudget``); a request that does not fit waits
  up to ``budget_wait`` seconds, then is answered ``503``.  A body becomes Python objects
  several times its size, so this bounds the server's memory, not only its buffers.

The handler authenticates from the request head before it reads a body
(``straw.rpc._Handler``); a connection that never authenticates costs one slot for at most
``request_seconds``.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

SOCKET_TIMEOUT = 10.0  # one recv or send: a stalled peer must not hold a thread forever
MAX_CONNECTIONS = 64
REQUEST_SECONDS = 30.0
BUDGET_WAIT = 10.0
_BUSY_BODY = (b'{"error":"StorageUnavailable","message":"the server serves as many '
              b'connections as it may; retry"}')
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_BUSY_BODY)) + _BUSY_BODY


class ByteBudget:
    """A counter of bytes held, at most ``limit``: ``take`` waits (bounded) for room."""

    def __init__(self, limit: int) -> None:
        assert limit > 0
        self.limit = limit
        self.held = 0
        self._cond = threading.Condition()

    def take(self, n: int, timeout: float) -> bool:
        """Hold ``n`` bytes (``n <= limit``); False if there was no room within
        ``timeout`` seconds."""
        assert 0 < n <= self.limit
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.held + n > self.limit:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    if self.held + n > self.limit:
                        return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.held -= n
            assert self.held >= 0
            self._cond.notify_all()


class GuardedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server whose connections, request time and request memory are
    bounded (module docstring)."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: Any, *,
                 max_connections: int = MAX_CONNECTIONS,
                 request_seconds: float = REQUEST_SECONDS,
                 max_inflight_bytes: int, budget_wait: float = BUDGET_WAIT) -> None:
        assert max_connections > 0 and request_seconds > 0 and budget_wait >= 0
        self.request_seconds = request_seconds
        self.budget_wait = budget_wait
        self.budget = ByteBudget(max_inflight_bytes)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._served: set[Any] = set()  # accepted connections holding a slot
        self._deadlines: dict[Any, float] = {}  # of those, the ones still reading
        self._stop = threading.Event()
        super().__init__(address, handler)
        threading.Thread(target=self._reap, name=f"straw http reaper {address}",
                         daemon=True).start()

    # --- connections ----------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            super().shutdown_request(request)  # holds no slot: not ours to release
            return
        with self._lock:
            self._served.add(request)
            self._deadlines[request] = time.monotonic() + self.request_seconds
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.shutdown_request(request)
            raise

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            held = request in self._served
            self._served.discard(request)
            self._deadlines.pop(request, None)
        try:
            super().shutdown_request(request)
        finally:
            if held:
                self._slots.release()

    def request_read(self, request: Any) -> None:
        """The handler read its whole request: its time limit ends here."""
        with self._lock:
            self._deadlines.pop(request, None)

    def _reap(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                late = [r for r, d in self._deadlines.items() if d <= now]
                for r in late:
                    del self._deadlines[r]
            for r in late:
                try:
                    r.shutdown(socket.SHUT_RDWR)  # its handler's recv returns: it ends
                except OSError:
                    pass

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()

    @property
    def connections(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._served)


__all__ = ["ByteBudget", "GuardedHTTPServer", "SOCKET_TIMEOUT"]
