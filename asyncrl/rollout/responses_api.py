"""The Responses API (`POST {base_url}/responses`) as the chat conversation an episode already serves.

An agent written against `client.responses.create(...)` (the OpenAI Agents SDK's default) reaches the same
episode as one using chat.completions: each request becomes a chat request (`to_chat`), checked and rendered by
OpenAIAgent exactly as a chat request is, and the model's turn goes back as a Response (`response`).

    request                                            chat
    instructions                                       a system message before the input
    input: "text"                                      [{"role": "user", "content": "text"}]
    {"role": r, "content": "..." | [text parts]}       {"role": r, "content": joined text}
    {"type": "function_call", call_id, name, args}     a tool call of the assistant message before it (or of a
                                                       new one): the model's turn as it was returned
    {"type": "function_call_output", call_id, output}  {"role": "tool", "tool_call_id": call_id, "content": output}
    tools: [{"type": "function", name, parameters}]    [{"type": "function", "function": {name, parameters}}]
    previous_response_id (this episode's last)         the conversation so far, then the input's new items

    model turn -> output: [{"type": "message", content: [{"type": "output_text", text}]} (when there is text),
                           {"type": "function_call", call_id, name, arguments} per tool call]

With `"stream": true` the Response goes out as the API's server-sent events (`events`), all at once when the turn
is whole: response.created and .in_progress, per output item its .added, text or arguments delta and .done events,
then response.completed (or .incomplete) with the whole Response.

Not served (400, the episode goes on): input items other than messages, calls and call outputs (images, files,
reasoning), tools other than functions, a `previous_response_id` that is not this episode's last response.
"""

from __future__ import annotations

import json
import time
from typing import Any


class ResponsesError(ValueError):
    """The request cannot be served as asked (answered 400; the episode goes on)."""


def to_chat(body: dict[str, Any], last_id: str, so_far: list[dict[str, Any]], instructions: str | None
            ) -> tuple[dict[str, Any], str | None]:
    """A Responses request -> (a chat request body, its instructions). `last_id`: the episode's last response id
    ("" before the first); `so_far`: the conversation after that response (chat messages); `instructions`: the
    first request's (a chained request may repeat them, not change them)."""
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise ResponsesError("'stream' must be true or false")
    given = body.get("instructions")
    if given is not None and not isinstance(given, str):
        raise ResponsesError("'instructions' must be a string")
    items = _input(body.get("input"))
    previous = body.get("previous_response_id")
    if previous is None:
        head = [{"role": "system", "content": given}] if given else []
        messages = head + items
    elif previous != last_id or not last_id:
        raise ResponsesError(f"previous_response_id {str(previous)[:60]!r} is not this episode's last response "
                             f"({last_id or 'none yet'}); send the conversation whole or chain from the last one")
    elif given not in (None, instructions):
        raise ResponsesError("a chained request's instructions differ from the episode's first; keep them")
    else:
        messages, given = [*so_far, *items], instructions
    return {"model": body.get("model"), "messages": messages, "tools": _tools(body.get("tools"))}, given


def response(rid: str, model: str, content: str | None, calls: list[dict[str, Any]], finish: str,
             usage: tuple[int, int], request: dict[str, Any]) -> dict[str, Any]:
    """The model's turn as a Response: `calls` are chat tool calls (id, function name and arguments);
    `finish` "length" marks it incomplete (max_output_tokens); usage: (input tokens, output tokens)."""
    output: list[dict[str, Any]] = []
    if content:
        output.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": content, "annotations": []}]})
    for k, call in enumerate(calls):
        output.append({"type": "function_call", "id": f"fc_{rid}_{k}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    cut = finish == "length"
    return {
        "id": f"resp_{rid}", "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": request.get("instructions"), "model": model, "output": output,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": request.get("tools") or [],
        "previous_response_id": request.get("previous_response_id"), "store": False,
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {},
        "usage": {"input_tokens": usage[0], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": usage[1], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage[0] + usage[1]},
    }


def _input(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ResponsesError("'input' must be a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ResponsesError(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _text(item.get("content"), i)})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", i), "type": "function",
                    "function": {"name": _string(item, "name", i), "arguments": _string(item, "arguments", i)}}
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", i),
                        "content": output if isinstance(output, str) else _text(output, i)})
        else:
            raise ResponsesError(f"input[{i}] is a {str(kind)[:40]!r} item; only messages, function_call and "
                                 "function_call_output are served")
    return out


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ResponsesError(f"input[{i}].content must be a string or a list of text parts (input_text / output_text)")


def _string(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ResponsesError(f"input[{i}].{key} must be a string")
    return value


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                              and isinstance(t.get("name"), str) for t in tools):
        raise ResponsesError("'tools' must be a list of {\"type\": \"function\", \"name\": ..., \"parameters\": ...} "
                             "objects; other tool types are not served")
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in tools]


def streamed(body: dict[str, Any]) -> bool:
    """Whether a /responses request asks for events (a JSON true only)."""
    return body.get("stream") is True


def events(resp: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished Response as the event sequence a streamed request gets (module docstring), numbered."""
    start = {**resp, "status": "in_progress", "output": [], "incomplete_details": None}
    out: list[dict[str, Any]] = [{"type": "response.created", "response": start},
                                 {"type": "response.in_progress", "response": start}]
    for i, item in enumerate(resp["output"]):
        out += _item_events(i, item)
    out.append({"type": f"response.{'incomplete' if resp['status'] == 'incomplete' else 'completed'}",
                "response": resp})
    return [{**e, "sequence_number": n} for n, e in enumerate(out)]


def _item_events(i: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": i}
    if item["type"] == "message":
        (part,) = item["content"]
        text = part["text"]
        return [{"type": "response.output_item.added", "output_index": i,
                 "item": {**item, "status": "in_progress", "content": []}},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **at, "content_index": 0, "delta": text, "logprobs": []},
                {"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
                {"type": "response.output_item.done", "output_index": i, "item": item}]
    return [{"type": "response.output_item.added", "output_index": i,
             "item": {**item, "status": "in_progress", "arguments": ""}},
            {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": i, "item": item}]


def event_stream(evs: list[dict[str, Any]]) -> bytes:
    """Server-sent events, each named by its type (the Responses stream has no [DONE] line)."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in evs).encode()
