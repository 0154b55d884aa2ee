"""The chat.completions request's messages as an episode reads them, and the model's tool calls as it answers them.

`parse_request` checks a request body and gives its messages in one normal form (role, text content, tool calls
with parsed arguments); `canon` is what two copies of a message must share to be the same message (the history
check of OpenAIAgent); `parse_tool_calls` turns the model's Hermes/Qwen `<tool_call>` text into OpenAI tool calls.
"""

from __future__ import annotations

import json
from typing import Any

from asyncrl.rollout.envs.tool_use import TOOL_CALL  # the Hermes/Qwen <tool_call> format, defined once there

ROLES = ("system", "developer", "user", "assistant", "tool")


class BadRequest(ValueError):
    """Answered with 400; the episode goes on (the agent may send a better request)."""


def parse_tool_calls(text: str, call_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The model's text -> (content, OpenAI tool_calls) for Hermes/Qwen <tool_call> JSON; text that does
    not parse stays content, with no calls."""
    calls = []
    for k, raw in enumerate(TOOL_CALL.findall(text)):
        try:
            call = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):  # the model's text: any of it, nesting bombs included
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        args = call.get("arguments", {})
        calls.append({"id": f"call_{call_id}_{k}", "type": "function", "function": {
            "name": call["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    if not calls:
        return text, []
    return TOOL_CALL.sub("", text).strip() or None, calls


def parse_request(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list | None]:
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be true or false")
    options = body.get("stream_options")
    if options is not None and (body.get("stream") is not True or not isinstance(options, dict)
                                or not isinstance(options.get("include_usage", False), bool)):
        raise BadRequest("'stream_options' is an object ({\"include_usage\": true|false}), allowed only with "
                         "stream=true")
    if body.get("n") not in (None, 1):
        raise BadRequest("n must be 1 (each sample of a group is an episode of its own)")
    messages, tools = body.get("messages"), body.get("tools") or None
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("'tools' must be a list of objects")
    out = [_message(m, i) for i, m in enumerate(messages)]
    if out[-1]["role"] == "assistant":
        raise BadRequest("the last message is the assistant's; continuing a partial assistant message is not "
                         "supported")
    return out, tools


def _message(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise BadRequest(f"messages[{i}] must be an object with a role in {list(ROLES)}")
    out: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"), i)}
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    calls = m.get("tool_calls")
    if calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  for c in calls):
            raise BadRequest(f"messages[{i}].tool_calls must be a list of {{id, type, function}} objects")
        out["tool_calls"] = [{"id": c.get("id", ""), "type": "function", "function": {
            "name": str(c["function"].get("name", "")), "arguments": _arguments(c["function"].get("arguments"))}}
            for c in calls]
    return out


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")


def _arguments(args: Any) -> Any:
    """A call's arguments as an object when they parse (what chat templates expect), else as given."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except (json.JSONDecodeError, RecursionError):  # what an agent sent: kept as its string
            return args
    return args


def canon(m: dict[str, Any]) -> tuple:
    """What two copies of a message must share to be the same message (not its JSON spelling)."""
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"]["arguments"]), sort_keys=True))
                  for c in m.get("tool_calls") or [])
    return m["role"], (m.get("content") or "").strip(), m.get("tool_call_id", ""), calls


def tools_key(tools: list | None) -> str:
    return json.dumps(tools or [], sort_keys=True)
