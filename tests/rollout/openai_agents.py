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
    return _conversation(lambda messages: create(client, messages)["choices"][0]["message"])


def _conversation(ask) -> dict:
    """The chat agents' loop: `ask(messages)` -> the model's message; tools run until it answers."""
    messages = list(FIRST)
    while True:
        msg = ask(messages)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return {"reward": float("10" in (msg["content"] or "")), "messages": float(len(messages))}
        for call in msg["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": str(RUN[call["function"]["name"]](**args))})


async def solve_async(client, task):
    return solve(client, task)


def create_streamed(client, messages, tools=TOOLS) -> tuple[dict, list[dict]]:
    """create() with stream=True, read as the openai client reads a stream (server-sent events until [DONE]);
    -> (the message joined from the deltas, every chunk)."""
    body = {"model": client.model, "messages": messages, "tools": tools, "max_tokens": 64, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(client.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {client.api_key}",
                                                         "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        events = [line[len("data: "):] for line in r.read().decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    got = [json.loads(e) for e in events[:-1]]
    message: dict = {"role": None, "content": None}
    calls: dict[int, dict] = {}
    for chunk in got:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            message["role"] = delta.get("role", message["role"])
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                calls.setdefault(call["index"], {}).update({k: v for k, v in call.items() if k != "index"})
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, got


def solve_streaming(client, task):
    """solve(), every request streamed: the conversation and the trained tokens are the same."""
    def ask(messages):
        msg, got = create_streamed(client, messages)
        assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] > 0  # include_usage's chunk
        return msg

    return _conversation(ask)


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
        ("nesting_bomb", lambda: post(url, client.api_key, b"[" * 200_000 + b"]" * 200_000)),
        ("no_messages", lambda: post(url, client.api_key, b'{"model": "m"}')),
        ("too_big", lambda: post(url, client.api_key, b"{}", {"Content-Length": str(64 << 20)})),
        ("stream_not_bool", lambda: post(url, client.api_key, json.dumps(
            {"messages": FIRST, "stream": "yes"}).encode())),
        ("stream_options_alone", lambda: post(url, client.api_key, json.dumps(
            {"messages": FIRST, "stream_options": {"include_usage": True}}).encode())),
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


def respond(client, body: dict) -> dict:
    """client.responses.create(...): POST {base_url}/responses."""
    return post(client.base_url + "/responses", client.api_key, json.dumps({"model": client.model, **body}).encode())


RESPONSE_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                   "parameters": t["function"]["parameters"]} for t in TOOLS]


def _answers(output: list[dict]) -> tuple[str, list[dict]]:
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    return text, [item for item in output if item["type"] == "function_call"]


def solve_responses(client, task):
    """solve() through /responses, the whole input sent back each turn (the output items appended as given)."""
    items: list = [{"role": "user", "content": FIRST[1]["content"]}]
    while True:
        resp = respond(client, {"instructions": FIRST[0]["content"], "input": items, "tools": RESPONSE_TOOLS})
        assert resp["object"] == "response" and resp["status"] == "completed"
        text, calls = _answers(resp["output"])
        items += resp["output"]
        if not calls:
            return {"reward": float("10" in text), "items": float(len(items))}  # user, call, output, text + call,
            # output, text: 7
        items += _call_outputs(calls)


def respond_streamed(client, body: dict) -> dict:
    """responses.create(stream=True): reads the server-sent events; -> the Response of response.completed, after
    checking that the deltas join into its text and arguments."""
    req = urllib.request.Request(client.base_url + "/responses", method="POST",
                                 data=json.dumps({"model": client.model, "stream": True, **body}).encode(),
                                 headers={"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        blocks = [b.split("\n") for b in r.read().decode().split("\n\n") if b]
    evs = [json.loads(data[len("data: "):]) for name, data in blocks]
    assert [name[len("event: "):] for name, _ in blocks] == [e["type"] for e in evs]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    final = evs[-1]["response"]
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    args = [e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"]
    assert (evs[0]["type"], evs[-1]["type"]) == ("response.created", "response.completed")
    assert (text, args) == (_answers(final["output"])[0], [c["arguments"] for c in _answers(final["output"])[1]])
    return final


def solve_responses_streamed(client, task):
    """solve_responses_chained(), every request streamed."""
    return _chained(lambda body: respond_streamed(client, body))


def solve_responses_chained(client, task):
    """solve() through /responses, each later request naming the last response and sending only the new items."""
    return _chained(lambda body: respond(client, body))


def _chained(send) -> dict:
    body = {"instructions": FIRST[0]["content"], "input": FIRST[1]["content"], "tools": RESPONSE_TOOLS}
    while True:
        resp = send(body)
        text, calls = _answers(resp["output"])
        if not calls:
            return {"reward": float("10" in text), "last_response_turn": float(resp["id"].rsplit("_", 1)[1])}
        body = {"previous_response_id": resp["id"], "input": _call_outputs(calls), "tools": RESPONSE_TOOLS}


def _call_outputs(calls: list[dict]) -> list[dict]:
    """What the agent's tools answer to the model's function_call items."""
    return [{"type": "function_call_output", "call_id": c["call_id"],
             "output": str(RUN[c["name"]](**json.loads(c["arguments"])))} for c in calls]


def pokes_responses(client, task):
    """Bad /responses requests first (each a 400, none fatal), then the real conversation."""
    seen = {}
    for name, body in [
        ("stream", {"input": "hi", "stream": "yes"}),
        ("image", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
        ("reasoning_item", {"input": [{"type": "reasoning", "summary": []}]}),
        ("web_search", {"input": "hi", "tools": [{"type": "web_search"}]}),
        ("unknown_previous", {"input": "hi", "previous_response_id": "resp_nope"}),
        ("empty_input", {"input": []}),
    ]:
        try:
            respond(client, body)
        except HTTPError as e:
            seen[f"status_{name}"] = float(e.status)
    return {**solve_responses_chained(client, task), **seen}
