"""The http kind against a local asyncio HTTP/1.1 server (loopback only): keep-alive reuse, retries after
500/429, timeouts, client errors, headers, the connection limit, oversized answers."""

import asyncio
import json

import pytest

from asyncrl.records import ScoreStatus
from asyncrl.reward import http
from asyncrl.reward.http import HttpClient, HttpReward
from asyncrl.reward.scorer import Scorer
from reward_helpers import config, item, spec


class Server:
    """Answers POST /score with {"reward": len(response)}; `script` overrides the next answers."""

    def __init__(self) -> None:
        self.script: list[str] = []  # "500" | "429" | "400" | "hang" | "slow" | "chunked" | "close"
        self.requests = 0
        self.connections = 0
        self.busy = self.max_busy = 0  # requests being answered now / at most at once
        self.heads: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/score"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
                body = json.loads(await reader.readexactly(length))
                self.requests += 1
                action = self.script.pop(0) if self.script else "ok"
                self.busy += 1
                self.max_busy = max(self.max_busy, self.busy)
                if action == "hang":
                    await asyncio.sleep(30)
                if action == "slow":
                    await asyncio.sleep(0.1)
                self.busy -= 1
                out = json.dumps({"reward": len(body["response"]), "chars": len(body["response"] + body["target"])}).encode()
                if action == "500":
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops")
                elif action == "chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 + f"{len(out):x}\r\n".encode() + out + b"\r\n0\r\n\r\n")
                elif action == "429":
                    writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 4\r\n\r\nslow")
                elif action == "400":
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\n\r\nbad")
                else:
                    close = b"Connection: close\r\n" if action == "close" else b""
                    writer.write(b"HTTP/1.1 200 OK\r\n" + close + f"Content-Length: {len(out)}\r\n\r\n".encode() + out)
                await writer.drain()
                if action == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        await asyncio.sleep(0)  # let the handlers see the closed connections


def run(script: list[str], texts: list[str], **options):
    async def go():
        server = Server()
        url = await server.start()
        server.script = list(script)
        opts = {"url": url, "retries": 2, "backoff_s": 0.01, **options}
        scorer = Scorer(config({"kind": "http", "name": "rm", "options": opts}, timeout_s=5.0))
        try:
            out = [await scorer.score(item(t, spec("T"))) for t in texts]
            return out, server
        finally:
            await scorer.close()
            await server.stop()
    return asyncio.run(go())


def test_scores_and_reuses_one_connection():
    out, server = run([], ["a", "bb", "ccc"])
    assert [s.reward for s in out] == [1.0, 2.0, 3.0]
    assert out[0].components == {"rm": 1.0, "rm/chars": 2.0}
    assert server.connections == 1 and server.requests == 3


def test_retries_after_a_500_and_reads_chunked_and_closing_answers():
    out, server = run(["500", "chunked", "close"], ["abcd", "xy"])
    assert [s.status for s in out] == [ScoreStatus.OK, ScoreStatus.OK]
    assert [s.reward for s in out] == [4.0, 2.0]
    assert server.requests == 3  # 500, then the chunked answer; then a closing one


def test_gives_up_after_retries_on_timeouts():
    out, server = run(["hang", "hang"], ["abc"], timeout_s=0.2, retries=1)
    assert out[0].status is ScoreStatus.FAILED
    assert "gave up after 2 attempts" in out[0].reason and "TimeoutError" in out[0].reason


def test_a_timeout_then_success_on_a_fresh_connection():
    out, server = run(["hang"], ["abc"], timeout_s=0.2)
    assert out[0].reward == 3.0 and server.connections == 2


def test_client_errors_are_not_retried():
    out, server = run(["400"], ["abc"])
    assert out[0].status is ScoreStatus.FAILED and "HTTP 400" in out[0].reason and server.requests == 1


def test_unreachable_server_fails_the_sample():
    async def go():
        scorer = Scorer(config({"kind": "http", "options": {"url": "http://127.0.0.1:9/x", "retries": 1, "backoff_s": 0.01}}))
        try:
            return await scorer.score(item("a", spec()))
        finally:
            await scorer.close()
    out = asyncio.run(go())
    assert out.status is ScoreStatus.FAILED and "gave up" in out.reason


def test_429_is_retried_and_headers_reach_the_server():
    out, server = run(["429"], ["abc"], headers={"Authorization": "Bearer t0k"})
    assert out[0].reward == 3.0 and server.requests == 2
    assert all(b"authorization: bearer t0k" in h.lower() for h in server.heads)


def test_connections_are_bounded_by_the_client_limit():
    async def go():
        server = Server()
        url = await server.start()
        server.script = ["slow"] * 6
        client = HttpClient(max_connections=2)
        reward = HttpReward({"url": url}, client, default_timeout_s=5.0)
        try:
            return await asyncio.gather(*(reward(t, spec("T")) for t in ["a", "bb", "ccc", "d", "ee", "fff"])), server
        finally:
            await client.close()
            await server.stop()
    out, server = asyncio.run(go())
    assert [v["reward"] for v in out] == [1, 2, 3, 1, 2, 3]
    assert server.connections == 2 and server.max_busy == 2 and server.requests == 6


def test_an_oversized_answer_fails_the_sample_without_retries(monkeypatch):
    monkeypatch.setattr(http, "MAX_BODY", 8)
    out, server = run([], ["abc"])
    assert out[0].status is ScoreStatus.FAILED and "more than 8 bytes" in out[0].reason and server.requests == 1


def test_a_url_that_is_not_http_is_refused_at_build():
    with pytest.raises(ValueError, match=r"reward component 'rm': http reward url='ftp://h/x'"):
        Scorer(config({"kind": "http", "name": "rm", "options": {"url": "ftp://h/x"}}))
