"""Remote HTTP scorer: POST {"response", "target", "params"} as JSON, read a number or a dict back.

`HttpClient` is a minimal HTTP/1.1 client over asyncio streams with keep-alive connections pooled per
host; one client is shared by every http component of a worker. `HttpReward` retries connection
errors, timeouts, 429 and 5xx with exponential backoff; other 4xx answers fail the sample at once.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from urllib.parse import urlsplit

from asyncrl.records import RewardSpec
from asyncrl.reward.protocol import RewardValue

_MAX_BODY = 16 * 1024 * 1024


class HttpStatusError(RuntimeError):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
        self.status = status


class HttpClient:
    """Pooled keep-alive connections; `max_connections` bounds open connections across hosts."""

    def __init__(self, max_connections: int = 32) -> None:
        self.max_connections = max_connections
        self._idle: dict[tuple[str, str, int], list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._slots: asyncio.Semaphore | None = None

    async def post_json(self, url: str, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"http reward url={url!r}: expected http(s)://host[:port]/path")
        key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        body = json.dumps(payload).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                f"Content-Length: {len(body)}", "Connection: keep-alive"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        self._slots = self._slots or asyncio.Semaphore(self.max_connections)
        async with self._slots:
            return await self._exchange(key, request)

    async def _exchange(self, key: tuple[str, str, int], request: bytes) -> tuple[int, bytes]:
        idle = self._idle.setdefault(key, [])
        while idle:  # a pooled connection the server closed meanwhile fails before any answer: try the next
            reader, writer = idle.pop()
            try:
                return await self._roundtrip(key, reader, writer, request)
            except (ConnectionError, asyncio.IncompleteReadError):
                continue
        scheme, host, port = key
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl.create_default_context() if scheme == "https" else None)
        return await self._roundtrip(key, reader, writer, request)

    async def _roundtrip(self, key, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bytes]:
        keep = False
        try:
            writer.write(request)
            await writer.drain()
            status, headers = await _read_head(reader)
            body = await _read_body(reader, headers)
            keep = headers.get("connection", "").lower() != "close"
            return status, body
        finally:  # on any error or cancellation the connection state is unknown: close it
            if keep:
                self._idle[key].append((reader, writer))
            else:
                writer.close()

    async def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await reader.readuntil(b"\r\n")
    try:
        status = int(line.split()[1])
    except (IndexError, ValueError):
        raise ConnectionError(f"bad HTTP status line {line[:100]!r}") from None
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        return b"".join(chunks)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > _MAX_BODY:
            raise ConnectionError(f"HTTP body of {length} bytes is over the {_MAX_BODY} byte limit")
        return await reader.readexactly(length)
    headers["connection"] = "close"  # body runs until the server closes
    return await reader.read(_MAX_BODY)


class HttpReward:
    """options: url, timeout_s (per attempt), retries, backoff_s, headers."""

    def __init__(self, options: dict[str, Any], client: HttpClient, default_timeout_s: float) -> None:
        unknown = set(options) - {"url", "timeout_s", "retries", "backoff_s", "headers"}
        if unknown:
            raise ValueError(f"http reward options: unknown {sorted(unknown)}; allowed: url, timeout_s, retries, backoff_s, headers")
        self.url = str(options["url"])
        self.timeout_s = float(options.get("timeout_s", default_timeout_s))
        self.retries = int(options.get("retries", 2))
        self.backoff_s = float(options.get("backoff_s", 0.2))
        self.headers = {str(k): str(v) for k, v in dict(options.get("headers", {})).items()}
        if not urlsplit(self.url).hostname or self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError(f"http reward options {options}: need a http(s) url, timeout_s > 0, retries >= 0, backoff_s >= 0")
        self.client = client

    async def __call__(self, response: str, spec: RewardSpec) -> RewardValue:
        payload = {"response": response, "target": spec.target, "params": spec.params}
        for attempt in range(self.retries + 1):
            try:
                status, body = await asyncio.wait_for(self.client.post_json(self.url, payload, self.headers), self.timeout_s)
                if status == 200:
                    return json.loads(body)
                error: Exception = HttpStatusError(status, body)
                if status != 429 and status < 500:
                    raise error
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
                error = e
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        raise RuntimeError(f"http reward {self.url}: gave up after {self.retries + 1} attempts: {error!r}")

    async def close(self) -> None:
        pass
