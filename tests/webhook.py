"""A webhook receiver for alert tests: a tiny HTTP server on 127.0.0.1 (a free port) that records every request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """One request the receiver got."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """The running receiver: its port, and what it got so far."""

    def __init__(self, server: ThreadingHTTPServer, received: list[Received], status: list[int]) -> None:
        self._server = server
        self.received = received
        self._status = status

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def answer_with(self, status: int) -> None:
        """Answer every later request with this HTTP status."""
        self._status[0] = status

    def wait_for(self, count: int = 1, timeout: float = 10.0) -> list[Received]:
        """The requests, once at least ``count`` arrived (fewer after ``timeout``: the test's assertion says so)."""
        end = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < end:
            time.sleep(0.02)
        return list(self.received)

    def connection(self, **extra: Any) -> str:
        """An Airflow connection of type http pointing at this receiver, as AIRFLOW_CONN_<ID> JSON."""
        conn: dict[str, Any] = {"conn_type": "http", "host": "127.0.0.1", "port": self.port, "schema": "http"}
        conn.update(extra)
        return json.dumps(conn)


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    """Serve on 127.0.0.1 (a free port) in a thread until the block ends."""
    received: list[Received] = []
    status = [200]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(status[0])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Receiver(server, received, status)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
