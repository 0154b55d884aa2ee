"""/responses as chat (asyncrl/rollout/responses_api.py): input items become the chat messages OpenAIAgent checks,
a Response's output items come back as the assistant message it answered, and what is not served is one reason."""

import pytest

from asyncrl.rollout.chat_messages import canon, parse_request
from asyncrl.rollout.responses_api import ResponsesError, event_stream, events, response, to_chat

TOOL = {"type": "function", "name": "add", "description": "add", "parameters": {"type": "object"}}
CALL = {"id": "call_e_1_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


def test_a_first_request_is_instructions_then_the_input():
    chat, instructions = to_chat({"model": "m", "instructions": "Be brief.", "input": "2+3?", "tools": [TOOL]},
                                 "", [], None)
    assert instructions == "Be brief."
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "add", "description": "add",
                                                                "parameters": {"type": "object"}}}]
    parse_request(chat)  # a valid chat request


@pytest.mark.parametrize("content", ["Let me add.", None])
def test_output_items_sent_back_are_the_answered_message(content):
    answered = {"role": "assistant", "content": content, "tool_calls": [CALL]}
    resp = response("e_1", "m", content, [CALL], "tool_calls", (10, 4), {"tools": [TOOL]})
    assert resp["status"] == "completed" and resp["usage"]["total_tokens"] == 14
    assert [i["type"] for i in resp["output"]] == (["message"] if content else []) + ["function_call"]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "2+3?"}]}, *resp["output"],
             {"type": "function_call_output", "call_id": CALL["id"], "output": "5"}]
    chat, _ = to_chat({"input": items, "tools": [TOOL]}, "", [], None)
    messages, _ = parse_request(chat)
    assert canon(messages[1]) == canon(answered)
    assert messages[2] == {"role": "tool", "content": "5", "tool_call_id": CALL["id"]}


def test_a_chained_request_continues_the_conversation():
    so_far = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
              {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    new = [{"type": "function_call_output", "call_id": CALL["id"], "output": "5"}]
    chat, instructions = to_chat({"previous_response_id": "resp_e_1", "input": new, "instructions": "Be brief."},
                                 "resp_e_1", so_far, "Be brief.")
    assert chat["messages"] == [*so_far, {"role": "tool", "tool_call_id": CALL["id"], "content": "5"}]
    assert instructions == "Be brief."
    with pytest.raises(ResponsesError, match="not this episode's last response"):
        to_chat({"previous_response_id": "resp_e_0", "input": new}, "resp_e_1", so_far, None)
    with pytest.raises(ResponsesError, match="instructions differ"):
        to_chat({"previous_response_id": "resp_e_1", "input": new, "instructions": "Be long."}, "resp_e_1",
                so_far, "Be brief.")


def test_a_cut_turn_is_incomplete():
    resp = response("e_2", "m", "12", [], "length", (3, 8), {})
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["output"][0]["content"][0] == {"type": "output_text", "text": "12", "annotations": []}


@pytest.mark.parametrize("body, words", [
    ({"input": "hi", "stream": "yes"}, "'stream' must be true or false"),
    ({"input": 3}, "'input' must be a string"),
    ({"input": [{"type": "reasoning"}]}, "'reasoning' item"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "list of text parts"),
    ({"input": [{"type": "function_call", "name": "add"}]}, r"input\[0\].call_id must be a string"),
    ({"input": "hi", "tools": [{"type": "file_search"}]}, "other tool types are not served"),
    ({"input": "hi", "instructions": 7}, "'instructions' must be a string"),
    ({"input": "hi", "previous_response_id": "resp_x"}, "none yet"),
])
def test_what_is_not_served_is_one_reason(body, words):
    with pytest.raises(ResponsesError, match=words):
        to_chat(body, "", [], None)


@pytest.mark.parametrize("content, finish", [("Let me add.", "tool_calls"), (None, "tool_calls"), ("12", "length")])
def test_a_streamed_response_is_the_events_the_api_sends(content, finish):
    calls = [] if finish == "length" else [CALL]
    resp = response("e_3", "m", content, calls, finish, (3, 8), {})
    evs = events(resp)
    kinds = [e["type"] for e in evs]
    assert kinds[:2] == ["response.created", "response.in_progress"] and evs[0]["response"]["output"] == []
    assert kinds[-1] == ("response.incomplete" if finish == "length" else "response.completed")
    assert evs[-1]["response"] == resp and [e["sequence_number"] for e in evs] == list(range(len(evs)))
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    assert done == resp["output"] and kinds.count("response.output_item.added") == len(done)
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == (content or "")
    assert [e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"] == \
        [c["function"]["arguments"] for c in calls]
    data = event_stream(evs).decode()
    assert data.count("event: ") == len(evs) and data.startswith("event: response.created\ndata: {")
