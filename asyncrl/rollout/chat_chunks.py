"""A chat completion as the OpenAI API streams it (`stream: true`): chunks framed as server-sent events.

The endpoint answers a streamed request only once the model's turn is whole (the episode takes the engine's
finished turn), so the stream carries the same completion in a few chunks, all sent at once:

    {"delta": {"role": "assistant", "content": ""}}       the role
    {"delta": {"content": "<the text>"}}                   the text, when there is any
    {"delta": {"tool_calls": [{index, id, type, function: {name, arguments}}]}}   one chunk per tool call
    {"delta": {}, "finish_reason": "stop" | "tool_calls" | "length"}
    {"choices": [], "usage": {...}}                        with stream_options.include_usage only
    data: [DONE]

Every chunk carries the completion's id, created and model, and object "chat.completion.chunk"; with
include_usage every chunk but the last has "usage": null, as the API sends them. A client that joins the deltas
(content concatenated, tool calls by index) gets back the non-streamed message.
"""

from __future__ import annotations

import json
from typing import Any


def stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(streamed, include_usage) of a request body; anything but a JSON true is false (the episode's own parse
    answers a malformed `stream` with 400 before any reply is framed)."""
    options = body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    return body.get("stream") is True, usage


def chunks(completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The chunks of a non-streamed ChatCompletion (one choice), in the order they are sent."""
    (choice,) = completion["choices"]
    message = choice["message"]
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    if include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        out.append(chunk({"content": message["content"]}))
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**head, "choices": [], "usage": completion["usage"]})
    return out


def event_stream(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events: each chunk as a `data:` line, then the `[DONE]` sentinel."""
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + "data: [DONE]\n\n").encode()
