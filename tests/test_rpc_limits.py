"""What a stranger or a heavy caller can make the control server hold is bounded
(``straw.http_guard``; issue 39, RPC1 and RPC3)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time

import pytest

from straw import Coordinator, SharedFilesystemStore, TaskSpec, rpc


@pytest.fixture
def coordinator(tmp_path):
    store = SharedFilesystemStore(tmp_path / "pool", "run")
    coord = Coordinator(store)
    coord.submit_tasks("seed", [TaskSpec(f"t{i}") for i in range(3)])
    yield coord
    coord.close()
    store.close()


def _serve(coordinator, **limits):
    token = secrets.token_hex(16)
    return rpc.start(coordinator, ("127.0.0.1", 0), token=token, **limits), token


def _connect(server) -> socket.socket:
    return socket.create_connection(server.address, timeout=5)


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_rpc1_idle_strangers_cannot_pin_the_server(coordinator):
    # issue 39 RPC1: ~1,100 idle connections without a token pinned every thread and
    # exhausted descriptors; now they hold at most max_connections slots, for at most
    # request_seconds, and the job's own calls go on
    server, token = _serve(coordinator, max_connections=8, request_seconds=1.0)
    threads_before = threading.active_count()
    fds_before = len(os.listdir("/proc/self/fd"))
    idle = [_connect(server) for _ in range(200)]
    try:
        time.sleep(0.3)
        assert server.connections <= 8
        assert threading.active_count() <= threads_before + 8
        busy = sum(_closed_by_server(s, 0.05) for s in idle)
        assert busy >= 150  # refused at once (503, closed), not queued
        # the idle ones that got a slot are cut once their time to a request is over
        time.sleep(1.5)
        assert server.connections == 0
        client = rpc.QueueClient(server.url, token=token, timeout=10)
        got = client.call("acquire", worker_id="w", max_tasks=1)
        assert got["status"] == "acquired"
    finally:
        for s in idle:
            s.close()
        server.close()
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2


def test_rpc1_a_slow_trickle_is_cut_at_its_deadline(coordinator):
    server, _ = _serve(coordinator, request_seconds=1.0)
    sock = _connect(server)
    started = time.monotonic()
    try:
        sock.sendall(b"POST / HTTP/1.0\r\n")
        cut = False
        while time.monotonic() - started < 5 and not cut:
            try:
                sock.sendall(b"X-Slow: 1\r\n")  # a header line every 0.2 s, never the end
            except OSError:
                cut = True
                break
            cut = _closed_by_server(sock, 0.2)
        assert cut and time.monotonic() - started < 3
    finally:
        sock.close()
        server.close()


def test_a_stranger_is_refused_before_its_body_is_read(coordinator):
    server, _ = _serve(coordinator)
    sock = _connect(server)
    try:
        sock.sendall(b"POST / HTTP/1.0\r\nContent-Length: 60000000\r\n\r\n")
        reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.0 403")
    finally:
        sock.close()
        server.close()


def test_rpc3_request_memory_is_bounded_across_callers(coordinator):
    # issue 39 RPC3: each request near the size limit cost ~0.5 GB and concurrent ones
    # multiplied it; the bodies held at once are bounded, the rest wait, then 503
    server, token = _serve(coordinator, max_inflight_bytes=1 << 20, budget_wait=0.5)
    holder = _connect(server)
    try:
        head = (f"POST / HTTP/1.0\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Length: {1 << 20}\r\n\r\n").encode()
        holder.sendall(head + b"{")  # holds the whole budget while its body trickles
        time.sleep(0.2)
        assert server.budget.held == 1 << 20
        client = rpc.QueueClient(server.url, token=token, timeout=10)
        started = time.monotonic()
        with pytest.raises(rpc.errors.StorageUnavailable, match="request memory"):
            client.call("metrics")
        assert time.monotonic() - started < 3
    finally:
        holder.close()
    deadline = time.monotonic() + 5
    while server.budget.held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.budget.held == 0  # given back when the peer went away
    assert json.dumps(client.call("task_status", task_id="t0"))
    server.close()
