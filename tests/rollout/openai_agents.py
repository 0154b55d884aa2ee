"""Agents for the OpenAIAgent tests, written as an `openai`-client agent is, with a tiny JSON-over-HTTP client
in the client's place: it sends what openai.OpenAI(...).chat.completions.create(...) sends (POST
{base_url}/chat/completions, Bearer key, a JSON body of model, messages, tools, temperature, max_tokens)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
    for name in ("add", "mul")]
RUN = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b}
FIRST = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "(2+3)*2?"}]
released = threading.Event()  # set when the max-turns agent's last request was answered (410)


class HTTPError(Exception):
    def __init__(self, status: int, body: dict) -> None:
        super().__init__(f"{status}: {body.get('error', {}).get('message', '')}")
        self.status, self.body = status, body


def post(url: str, key: str, data: bytes, headers: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise HTTPError(e.code, json.loads(e.read() or b"{}")) from None


def create(client, messages, tools=TOOLS) -> dict:
    body = {"model": client.model, "messages": messages, "tools": tools, "temperature": 1.0, "max_tokens": 64}
    return post(client.base_url + "/chat/completions", client.api_key, json.dumps(body).encode())


def solve(client, task):
    """Calls tools until the model answers; reward 1 when the answer has 10."""
    messages = list(FIRST)
    while True:
        msg = create(client, messages)["choices"][0]["message"]
        messages.append(msg)
        if not msg.get("tool_calls"):
            return {"reward": float("10" in (msg["content"] or "")), "messages": float(len(messages))}
        for call in msg["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": str(RUN[call["function"]["name"]](**args))})


async def solve_async(client, task):
    return solve(client, task)


def rewrites_history(client, task):
    msg = create(client, list(FIRST))["choices"][0]["message"]
    edited = {**msg, "content": "I did not call a tool."}
    create(client, [*FIRST, edited, {"role": "user", "content": "go on"}])  # 400: the episode fails
    return 1.0


def pokes_the_server(client, task):
    """Bad requests first (each answered, none fatal), then the real conversation."""
    url = client.base_url + "/chat/completions"
    seen = {}
    for name, call in [
        ("wrong_key", lambda: post(url, "sk-nope", b"{}")),
        ("other_episode", lambda: post(url.replace("/e/", "/e/0"), client.api_key, b"{}")),
        ("no_path", lambda: post(client.base_url + "/embeddings", client.api_key, b"{}")),
        ("garbage", lambda: post(url, client.api_key, b"\x00{not json")),
        ("no_messages", lambda: post(url, client.api_key, b'{"model": "m"}')),
        ("too_big", lambda: post(url, client.api_key, b"{}", {"Content-Length": str(64 << 20)})),
    ]:
        try:
            call()
        except HTTPError as e:
            seen[f"status_{name}"] = float(e.status)
        except OSError:  # the server closed the connection
            seen[f"status_{name}"] = -1.0
    out = solve(client, task)
    return {**out, **seen}


def raises(client, task):
    if task.sample_index == 1:
        raise RuntimeError("agent crashed")
    return solve(client, task)


def hangs(client, task):
    if task.sample_index == 1:
        create(client, list(FIRST))
        time.sleep(30)
    return solve(client, task)


def returns_garbage(client, task):
    create(client, list(FIRST))
    return "ten"


def never_asks(client, task):
    return 1.0


def loops_forever(client, task):
    """Keeps calling tools; the episode is cut at max_turns and its waiting request gets 410."""
    messages = list(FIRST)
    try:
        while True:
            msg = create(client, messages)["choices"][0]["message"]
            messages += [msg, *({"role": "tool", "tool_call_id": c["id"], "content": "0"}
                                for c in msg.get("tool_calls") or [])]
            if not msg.get("tool_calls"):
                messages.append({"role": "user", "content": "again"})
    except HTTPError as e:
        if e.status == 410:
            released.set()
        raise
