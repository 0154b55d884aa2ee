"""Blocking JSON-over-HTTP client for an SGLang server (stdlib `http.client`, one connection per call).

Thread-safe: every call opens its own connection, so the adapter's worker threads and its control
calls never share a socket. Every call has a timeout; every failure becomes an `SGLangError` that
names the server, the endpoint and what to check.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class SGLangError(RuntimeError):
    """Any failure talking to SGLang."""


class SGLangConnectionError(SGLangError):
    """The server could not be reached, dropped the connection, or did not answer in time."""


class SGLangHTTPError(SGLangError):
    """The server answered with an error status, or with `success: false`."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"SGLang {url} -> HTTP {status}: {message}")
        self.url = url
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        if not self.body:
            return None
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def error_message(response: Response) -> str:
    """The human-readable message of an SGLang error body, whichever of its shapes it has.

    Shapes: `{"error": {"message": m}}` (generic 400), `{"error": "m"}` (the /generate contract),
    `{"success": false, "message": m}` (control endpoints), `{"detail": ...}` (FastAPI 404/422),
    and text/plain (/flush_cache).
    """
    try:
        body = response.json()
    except ValueError:
        return response.text().strip() or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        if err is not None:
            return str(err)
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return response.text().strip() or "(empty body)"


class SGLangHTTP:
    def __init__(self, base_url: str, api_key: str = "") -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"SGLang base_url={base_url!r}: expected http://host:port (or https://...)")
        self.base_url = base_url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def request(self, method: str, path: str, payload: Any = None, *, timeout_s: float) -> Response:
        """One HTTP exchange; raises SGLangConnectionError when no response arrives within timeout_s
        (the limit applies to connecting and to each wait for data)."""
        url = self.base_url + path
        headers = dict(self._headers)
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout_s)
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return Response(resp.status, resp.getheader("Content-Type", ""), data)
        except TimeoutError as e:
            raise SGLangConnectionError(f"SGLang {url}: no answer within {timeout_s:g} s ({e})") from e
        except (OSError, http.client.HTTPException) as e:
            raise SGLangConnectionError(
                f"SGLang {url}: {type(e).__name__}: {e}. Is the server running and is base_url right?"
            ) from e
        finally:
            conn.close()

    def call(
        self, path: str, payload: Any = None, *, timeout_s: float, method: str = "POST", allow: tuple[int, ...] = ()
    ) -> Response:
        """`request`, raising SGLangHTTPError for a status >= 400 not in `allow` and for `success: false`."""
        resp = self.request(method, path, payload, timeout_s=timeout_s)
        if resp.status in allow:
            return resp
        if resp.status >= 400:
            raise SGLangHTTPError(self.base_url + path, resp.status, error_message(resp))
        if "json" in resp.content_type:
            body = resp.json()
            if isinstance(body, dict) and body.get("success") is False:
                raise SGLangHTTPError(self.base_url + path, resp.status, str(body.get("message", body)))
        return resp
