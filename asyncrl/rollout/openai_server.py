"""`ChatServer`: the OpenAI-compatible HTTP endpoint on loopback through which agents reach their episodes.

    agent thread ──POST /e/<episode>/v1/chat/completions──► handler thread ──Session.submit──► event queue
                   (or /v1/responses)
      (openai client, Bearer <episode key>)                    │ waits on the reply future      │
         ▲                                                     │                                ▼
         └──────────────── ChatCompletion JSON ◄───────────────┘ ◄── Session.answer ◄── the episode (OpenAIAgent
                                                                                         on the env loop)

One server per generator process (`shared()`), bound to 127.0.0.1 on a port the OS picks, started by the
first episode that asks for it; its threads are daemons and it lives as long as the process. Each episode
opens a `Session`: its own base URL (the episode id in the path) and its own random bearer key, checked in
constant time; a closed session's URL answers 401 like a wrong key.

Threads: the server thread accepts connections (at most MAX_CONNECTIONS at once; more are closed at once),
one daemon thread per connection reads requests (each read bounded by READ_TIMEOUT_S) and, for a chat
request, waits on its session's reply future (at most `reply_timeout_s`). The episode side consumes the
session's events on the env loop and answers. Nothing a client sends raises out of a handler: a bad request
gets a JSON error (401 key, 404 path, 400 body, 413 size, 409 busy, 410 episode over, 504 no answer in
time), counted in `counts`; error replies carry `x-should-retry: false` so the openai client does not retry.
A request with `"stream": true` gets its reply as server-sent events (chat_chunks.py; responses_api.py for
/responses), all at once when the model's turn is done; errors stay JSON, as the API sends them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from asyncrl.rollout import chat_chunks, responses_api

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20  # a chat request's JSON at most
READ_TIMEOUT_S = 30.0  # one socket read (a request's head or body, or an idle keep-alive connection)
MAX_CONNECTIONS = 512
ROUTES = {("POST", "chat/completions"), ("POST", "responses"), ("GET", "models")}
Reply = tuple[int, dict[str, Any]]  # (HTTP status, JSON body)


def error(status: int, message: str, kind: str) -> Reply:
    return status, {"error": {"message": message, "type": kind, "code": status}}


class Session:
    """One episode's end of the endpoint: the agent's requests in, the model's replies out.

    Events for the episode (`next_event`): ("request", (route, body)), route "chat/completions" or "responses";
    ("returned", value), ("raised", detail).
    At most one request is in flight; the episode answers it (`answer`) once the model's turn is done.
    """

    def __init__(self, server: ChatServer, sid: str, loop: asyncio.AbstractEventLoop) -> None:
        self.server, self.sid, self.loop = server, sid, loop
        self.key = "sk-asyncrl-" + secrets.token_urlsafe(32)
        self.base_url = f"http://127.0.0.1:{server.port}/e/{sid}/v1"
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.reply: concurrent.futures.Future[Reply] | None = None
        self.closed = ""  # why the episode ended ("" while open)
        self.lock = threading.Lock()

    # ---- handler and agent threads

    def submit(self, route: str, body: dict[str, Any]) -> concurrent.futures.Future[Reply]:
        fut: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        with self.lock:
            if self.closed:
                fut.set_result(error(410, f"this episode is over ({self.closed})", "episode_over"))
            elif self.reply is not None:
                fut.set_result(error(409, "a request of this episode is already waiting for the model; send "
                                          "one chat request at a time", "busy"))
            else:
                self.reply = fut
                self._push(("request", (route, body)))
        return fut

    def ended(self, kind: str, value: Any) -> None:
        """The agent function returned ("returned", value) or raised ("raised", detail)."""
        with self.lock:
            if not self.closed:
                self._push((kind, value))

    def _push(self, event: tuple[str, Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the env loop is closed: the generator is shutting down
            self.closed = self.closed or "shutdown"

    # ---- the episode (env loop)

    async def next_event(self) -> tuple[str, Any]:
        return await self.events.get()

    def answer(self, reply: Reply) -> None:
        with self.lock:
            fut, self.reply = self.reply, None
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def close(self, why: str) -> None:
        """End the episode's side: its URL stops answering, a waiting request gets 410. Idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = why
            fut, self.reply = self.reply, None
        if fut is not None and not fut.done():
            fut.set_result(error(410, f"this episode is over ({why})", "episode_over"))
        self.server.forget(self.sid)


class ChatServer:
    def __init__(self, reply_timeout_s: float = 600.0, host: str = "127.0.0.1") -> None:
        self.reply_timeout_s = reply_timeout_s
        self.sessions: dict[str, Session] = {}
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.httpd = _Server((host, 0), _Handler)
        self.httpd.chat = self
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="openai-server", daemon=True)
        self.thread.start()

    def open(self, loop: asyncio.AbstractEventLoop) -> Session:
        with self.lock:
            session = Session(self, secrets.token_hex(8), loop)
            self.sessions[session.sid] = session
        return session

    def forget(self, sid: str) -> None:
        with self.lock:
            self.sessions.pop(sid, None)

    def close(self) -> None:
        for session in list(self.sessions.values()):
            session.close("shutdown")
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- called by handler threads

    def authorize(self, sid: str, header: str) -> Session | None:
        with self.lock:
            session = self.sessions.get(sid)
        scheme, _, given = header.partition(" ")
        want = session.key if session is not None else "sk-asyncrl-" + "x" * 43  # same work for unknown ids
        ok = hmac.compare_digest(given.strip().encode(), want.encode()) and scheme.lower() == "bearer"
        return session if ok and session is not None else None

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS  # the listen backlog (socketserver's 5 resets a burst of agents)
    chat: ChatServer

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.chat.count("connections_refused")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:  # a connection's error, not the server's
        self.chat.count("connection_errors")
        log.debug("openai endpoint: connection error", exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client (httpx) expects
    timeout = READ_TIMEOUT_S
    server: _Server

    def do_POST(self) -> None:
        self._serve("POST")

    def do_GET(self) -> None:
        self._serve("GET")

    def _serve(self, method: str) -> None:
        chat = self.server.chat
        chat.count("requests")
        self.stream: Callable[[dict[str, Any]], bytes] | None = None  # a streamed request's framing of its reply
        try:
            reply = self._route(chat, method)
        except Exception as e:  # noqa: BLE001 - a handler never takes the server down
            log.warning("openai endpoint: %s %s failed: %s", method, self.path[:80], e)
            reply = error(500, f"internal error: {type(e).__name__}", "internal")
        if reply[0] >= 400:
            chat.count(f"http_{reply[0]}")
        if reply[0] == 200 and self.stream is not None:
            chat.count("streamed")
            self._send_events(self.stream(reply[1]))
        else:
            self._send(reply)

    def _route(self, chat: ChatServer, method: str) -> Reply:
        parts = self.path.split("?", 1)[0].strip("/").split("/", 3)  # e, episode id, v1, route
        if len(parts) != 4 or parts[0] != "e" or parts[2] != "v1" or (method, parts[3]) not in ROUTES:
            self.close_connection = True  # its body (if any) is left unread
            return error(404, f"no {method} {self.path[:80]!r} here; POST {{base_url}}/chat/completions or "
                              "{base_url}/responses", "not_found")
        session = chat.authorize(parts[1], self.headers.get("Authorization", ""))
        if session is None:
            self.close_connection = True
            return error(401, "missing or wrong API key for this episode (or the episode is over)", "unauthorized")
        if method == "GET":
            return 200, {"object": "list", "data": [{"id": "asyncrl", "object": "model", "owned_by": "asyncrl"}]}
        body = self._body()
        if isinstance(body, tuple):
            return body
        self.stream = _stream_framing(parts[3], body)
        try:
            return session.submit(parts[3], body).result(timeout=chat.reply_timeout_s)
        except concurrent.futures.TimeoutError:
            session.close(f"no reply within {chat.reply_timeout_s:g} s")
            return error(504, f"the model did not answer within {chat.reply_timeout_s:g} s", "timeout")

    def _body(self) -> dict[str, Any] | Reply:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            return error(400, "chunked bodies are not accepted; send Content-Length", "invalid_request_error")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            return error(400, "a Content-Length header is needed", "invalid_request_error")
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            return error(413, f"body of {length} bytes; at most {MAX_BODY_BYTES}", "invalid_request_error")
        raw = self.rfile.read(length)  # bounded by the socket timeout
        if len(raw) < length:
            self.close_connection = True
            return error(400, "the body ended before Content-Length bytes", "invalid_request_error")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return error(400, f"the body is not JSON ({str(e)[:120]})", "invalid_request_error")
        except RecursionError:  # a nesting bomb: within MAX_BODY_BYTES, deeper than the parser goes
            return error(400, "the body's JSON nests too deep", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error")
        return body

    def _send(self, reply: Reply) -> None:
        status, payload = reply
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status >= 400:
            self.send_header("x-should-retry", "false")
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))  # the whole turn at once: no chunked framing needed
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # counted instead; a per-request log line would flood the generator's log


def _stream_framing(route: str, body: dict[str, Any]) -> Callable[[dict[str, Any]], bytes] | None:
    """How a request that asked for a stream gets its reply as server-sent events (None: plain JSON)."""
    if route == "responses":
        return (lambda r: responses_api.event_stream(responses_api.events(r))) if responses_api.streamed(body) else None
    streamed, usage = chat_chunks.stream_options(body)
    return (lambda r: chat_chunks.event_stream(chat_chunks.chunks(r, usage))) if streamed else None


_SHARED: ChatServer | None = None
_SHARED_LOCK = threading.Lock()


def shared_counts() -> dict[str, int]:
    """This process's server's counters (requests, http_401, connections_refused, ...); {} if none was started."""
    with _SHARED_LOCK:
        server = _SHARED
    if server is None:
        return {}
    with server.lock:
        return dict(server.counts)


def shared() -> ChatServer:
    """This process's server, started on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ChatServer()
            log.info("openai-compatible endpoint on 127.0.0.1:%d", _SHARED.port)
        return _SHARED
