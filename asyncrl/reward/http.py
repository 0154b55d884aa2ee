"""Remote HTTP scorer: POST {"response", "target", "params"} as JSON, read a number or a dict back.

    HttpReward (one per http component) ──post_json──► HttpClient (one per worker: one httpx pool,
                                                       at most `max_connections` open, keep-alive)

`HttpReward` bounds each attempt by `timeout_s` (connecting, waiting for a pooled connection, sending and
reading together) and retries connection errors, timeouts, 429 and 5xx up to `retries` times, waiting
`backoff_s`, doubled per retry; any other non-200 answer fails the sample at once. After the last
attempt the sample fails with "gave up after N attempts" and the last error.

The transport is httpx, not aiohttp: its dependencies are pure Python (h11, httpcore, anyio; aiohttp
brings several compiled packages), it is already in the GPU image, and per-request timeouts, a bounded
connection pool and streamed bodies are built in, so this file only holds the reward's policy. The
client ignores proxy variables and .netrc (`trust_env=False`: reward servers are reached directly, as
before) and verifies https against the system's trust store.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from urllib.parse import urlsplit

import httpx

from asyncrl.records import RewardSpec
from asyncrl.reward.protocol import RewardValue

MAX_BODY = 16 * 1024 * 1024  # an answer larger than this fails the sample (a score is a few bytes)


class HttpStatusError(RuntimeError):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
        self.status = status


class HttpClient:
    """One keep-alive connection pool shared by the http components of a worker; at most
    `max_connections` connections are open at once (further requests wait for one)."""

    def __init__(self, max_connections: int = 32) -> None:
        self.max_connections = max_connections
        self._client: httpx.AsyncClient | None = None  # made on first use: workers without http need none

    async def post_json(self, url: str, payload: Any, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
        """(status, body) of one POST; raises httpx.TransportError (connection, timeout) or ValueError."""
        async with self._pool().stream("POST", url, json=payload, headers=headers,
                                       timeout=httpx.Timeout(timeout_s)) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY:
                    raise ValueError(f"HTTP answer of more than {MAX_BODY} bytes from {url}: not a score")
            return response.status_code, bytes(body)

    def _pool(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            self._client = httpx.AsyncClient(limits=limits, trust_env=False, verify=ssl.create_default_context())
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


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
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"http reward url={self.url!r}: expected http(s)://host[:port]/path")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError(f"http reward options {options}: need timeout_s > 0, retries >= 0, backoff_s >= 0")
        self.client = client

    async def __call__(self, response: str, spec: RewardSpec) -> RewardValue:
        payload = {"response": response, "target": spec.target, "params": spec.params}
        for attempt in range(self.retries + 1):
            try:
                return await self._post(payload)
            except HttpStatusError as e:
                if e.status != 429 and e.status < 500:
                    raise  # the server refuses this request: asking again will not change that
                error: Exception = e
            except (TimeoutError, httpx.TimeoutException):
                error = TimeoutError(f"no answer within timeout_s={self.timeout_s:g} s")
            except httpx.TransportError as e:  # refused, reset, closed mid-answer, malformed HTTP
                error = e
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        raise RuntimeError(f"http reward {self.url}: gave up after {self.retries + 1} attempts: {error!r}")

    async def _post(self, payload: dict[str, Any]) -> RewardValue:
        """One attempt, bounded by timeout_s as a whole: the parsed answer of a 200, else HttpStatusError."""
        status, body = await asyncio.wait_for(
            self.client.post_json(self.url, payload, self.headers, self.timeout_s), self.timeout_s)
        if status != 200:
            raise HttpStatusError(status, body)
        return json.loads(body)

    async def close(self) -> None:
        pass
