"""HTTP transport of the SGLang double: one handler thread per connection, JSON / text bodies."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Crashed(Exception):
    """The fake server process is gone: connections are dropped without an answer."""


def encode(status: int, payload: Any) -> tuple[int, str, bytes]:
    if isinstance(payload, bytes):
        return status, "text/plain; charset=utf-8", payload
    if isinstance(payload, str):
        return status, "text/plain; charset=utf-8", payload.encode()
    return status, "application/json", json.dumps(payload).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        double = self.server.double  # type: ignore[attr-defined]  # an SGLangDouble
        try:
            status, ctype, data = double.handle(
                method, url.path, parse_qs(url.query), self.headers.get("Authorization"), raw
            )
        except Crashed:
            self.close_connection = True  # no answer: the client sees the connection drop
            return
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
