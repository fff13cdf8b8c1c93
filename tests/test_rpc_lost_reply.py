"""A reply cut off mid-way (the coordinator process died while answering) is a lost reply:
``QueueClient.call`` raises ``ConnectionError``, which callers retry with the same
idempotency id (found by the rollout fuzz scenario: ``http.client.IncompleteRead`` is not an
``OSError`` and escaped as itself)."""

from __future__ import annotations

import socket
import threading

import pytest

from straw.rpc import QueueClient


def _serve_once(reply: bytes) -> tuple[str, threading.Thread]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request
            conn.sendall(reply)  # then the process "dies": the connection closes
        listener.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", t


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"result\"",  # body cut short
    b"HTTP/1.1 20",  # status line cut short
    b"",  # nothing at all
], ids=["truncated-body", "truncated-status", "no-reply"])
def test_a_reply_cut_off_is_a_connection_error(reply: bytes) -> None:
    url, t = _serve_once(reply)
    with pytest.raises(ConnectionError, match="retry with the same idempotency id"):
        QueueClient(url, token="t", timeout=10).call("task_status", task_id="x")
    t.join(10)
