"""The streamed form of a chat completion (asyncrl/rollout/chat_chunks.py): the deltas join back into the
message, usage comes last only when asked, and the events end with [DONE]."""

import json

import pytest

from asyncrl.rollout.chat_chunks import chunks, event_stream, stream_options

CALLS = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
         {"id": "c2", "type": "function", "function": {"name": "mul", "arguments": '{"a": 5, "b": 2}'}}]


def completion(content, calls=None, finish="stop"):
    message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    return {"id": "chatcmpl-x-1", "object": "chat.completion", "created": 123, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}}


def joined(events):
    message, calls, finish = {"content": None}, {}, None
    for e in events:
        for choice in e["choices"]:
            delta = choice["delta"]
            message["role"] = delta.get("role", message.get("role"))
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for call in delta.get("tool_calls", []):
                calls[call["index"]] = {k: v for k, v in call.items() if k != "index"}
            finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


@pytest.mark.parametrize("content, calls, finish", [("It is 10.", None, "stop"), ("Now double it.", CALLS, "tool_calls"),
                                                    (None, CALLS[:1], "tool_calls"), ("cut off", None, "length")])
@pytest.mark.parametrize("usage", [False, True])
def test_the_deltas_join_back_into_the_message(content, calls, finish, usage):
    full = completion(content, calls, finish)
    events = chunks(full, include_usage=usage)
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == full["id"] and e["created"] == 123
               and e["model"] == "m" for e in events)
    message, got_finish = joined(events)
    assert message == full["choices"][0]["message"] and got_finish == finish
    if usage:
        assert events[-1]["choices"] == [] and events[-1]["usage"] == full["usage"]
        assert all(e["usage"] is None for e in events[:-1])
    else:
        assert all("usage" not in e for e in events) and events[-1]["choices"][0]["finish_reason"] == finish


def test_server_sent_events_end_with_done():
    data = event_stream(chunks(completion("hi"), include_usage=False)).decode()
    blocks = data.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    assert all(b.startswith("data: {") for b in blocks[:-2]) and json.loads(blocks[0][len("data: "):])["choices"]


@pytest.mark.parametrize("body, want", [
    ({"stream": True}, (True, False)), ({"stream": True, "stream_options": {"include_usage": True}}, (True, True)),
    ({}, (False, False)), ({"stream": "true"}, (False, False)), ({"stream": 1}, (False, False)),
    ({"stream": True, "stream_options": ["include_usage"]}, (True, False)),
])
def test_only_a_json_true_streams(body, want):
    assert stream_options(body) == want
