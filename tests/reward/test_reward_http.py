"""The http kind against a local asyncio HTTP/1.1 server: keep-alive reuse, retry after a 500, timeouts."""

import asyncio
import json

from asyncrl.records import ScoreStatus
from asyncrl.reward.scorer import Scorer
from reward_helpers import config, sample, spec


class Server:
    """Answers POST /score with {"reward": len(response)}; `script` overrides the next answers."""

    def __init__(self) -> None:
        self.script: list[str] = []  # "500" | "hang" | "chunked" | "close"
        self.requests = 0
        self.connections = 0
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
                length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
                body = json.loads(await reader.readexactly(length))
                self.requests += 1
                action = self.script.pop(0) if self.script else "ok"
                if action == "hang":
                    await asyncio.sleep(30)
                out = json.dumps({"reward": len(body["response"]), "chars": len(body["response"] + body["target"])}).encode()
                if action == "500":
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops")
                elif action == "chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 + f"{len(out):x}\r\n".encode() + out + b"\r\n0\r\n\r\n")
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
            out = [await scorer.score(sample(t), spec("T")) for t in texts]
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
            return await scorer.score(sample("a"), spec())
        finally:
            await scorer.close()
    out = asyncio.run(go())
    assert out.status is ScoreStatus.FAILED and "gave up" in out.reason
