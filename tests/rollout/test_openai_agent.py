"""OpenAIAgent through MultiTurn and the GeneratorWorker: agents speaking the OpenAI chat API over HTTP to a
scripted engine, with a byte-level tokenizer and a Qwen-style template (tools, <tool_call>, tool turns)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import numpy as np
import pytest
from rollout_fakes import byte_tokenizer

from asyncrl import records as R
from asyncrl.engine.protocol import EngineLimits, EngineStats, GenerationOutput
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout import openai_server
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.envs.openai_agent import OpenAIAgent, parse_tool_calls
from asyncrl.rollout.multi_turn import MultiTurn
from tests.doubles.worker_fakes import FakeHub
from tests.rollout import openai_agents as A

QWENISH = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ m.content }}\n</tool_response>"  # HF trims a newline after a tag
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SCRIPT = {  # the engine's reply at each turn
    1: '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    2: 'Now double it.<tool_call>\n{"name": "mul", "arguments": {"a": 5, "b": 2}}\n</tool_call>',
}
FINAL = "It is 10."


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(QWENISH)


class ScriptedEngine:
    """Turn k of every episode answers SCRIPT[k] (FINAL after) and the stop token; outputs are kept."""

    def __init__(self, tok) -> None:
        self.tok, self.weight_version = tok, 0
        self.pending, self.requests, self.outputs = [], [], []

    def add(self, request):
        self.requests.append(request)
        self.pending += [(request, i) for i in range(request.n)]

    def has_work(self):
        return bool(self.pending)

    def limits(self):
        return EngineLimits(vocab_size=len(self.tok), max_model_len=None)

    def step(self):
        out = []
        for request, i in self.pending:
            turn = int(re.search(r"#t(\d+)", request.request_id).group(1))
            ids = self.tok.encode(SCRIPT.get(turn, FINAL), add_special_tokens=False) + [self.tok.eos_token_id]
            ids = ids[: request.sampling.max_new_tokens]
            out.append(GenerationOutput(
                request_id=request.request_id, sample_index=i, token_ids=np.asarray(ids, np.int32),
                logprobs=np.full(len(ids), -0.5, np.float32), versions=np.full(len(ids), self.weight_version, np.int32),
                finish_reason=R.FinishReason.STOP if ids[-1] == self.tok.eos_token_id else R.FinishReason.LENGTH))
        self.pending = []
        self.outputs += out
        return out

    def abort(self, ids=None):
        self.pending = [p for p in self.pending if ids is not None and p[0].request_id not in set(ids)]
        return []

    def stats(self):
        return EngineStats(running=len(self.pending), waiting=0, tokens_generated=0, weight_version=0)


def prompt_ids(tok) -> np.ndarray:
    """The task's prompt: the start of what the agent sends (tools and system message)."""
    text = tok.apply_chat_template(A.FIRST[:1], tools=A.TOOLS, tokenize=False, add_generation_prompt=False)
    return np.asarray(tok.encode(text, add_special_tokens=False), np.int32)


def run(tok, agent, n=2, timeout=5.0, **cfg):
    engine = ScriptedEngine(tok)
    hub = FakeHub([R.Prompt(prompt_id="p0", n=n, token_ids=prompt_ids(tok),
                            sampling=R.SamplingParams(max_new_tokens=cfg.pop("max_new_tokens", 128)))])
    rollout = MultiTurn(RolloutConfig(environment="asyncrl.rollout.envs.openai_agent:OpenAIAgent",
                                      options={"agent": f"tests.rollout.openai_agents:{agent}"},
                                      step_timeout_s=timeout, **cfg), OpenAIAgent, tok, len(tok))
    worker = GeneratorWorker(name="g", engine=engine, hub=hub, tokenizer=tok, max_running=64, rollout=rollout)
    deadline = time.monotonic() + 15
    while sum(len(b.samples) for b in hub.sent) < n and time.monotonic() < deadline:
        worker.run_once()
    rollout.close()
    samples = sorted((s for b in hub.sent for s in b.samples), key=lambda s: s.sample_index)
    return samples, engine, rollout


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def tool_turn(result):
    return f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("agent", ["solve", "solve_async", "solve_streaming", "solve_responses",
                                   "solve_responses_chained", "solve_responses_streamed"])
def test_two_tool_turns_are_token_exact(tok, agent):
    samples, engine, rollout = run(tok, agent)
    assert len(samples) == 2
    first = tok.apply_chat_template(A.FIRST, tools=A.TOOLS, tokenize=False, add_generation_prompt=True)
    start = ids(tok, first)[len(prompt_ids(tok)):]  # the agent's conversation after the task's prompt
    assert tok.decode(start, skip_special_tokens=False) == "<|im_start|>user\n(2+3)*2?<|im_end|>\n<|im_start|>assistant\n"
    for s in samples:
        outs = [o for o in engine.outputs if (o.request_id == "p0#t1" and o.sample_index == s.sample_index)
                or o.request_id.endswith(f"s{s.sample_index}")]
        assert len(outs) == 3
        env = [start, ids(tok, tool_turn(5)), ids(tok, tool_turn(10))]
        want = np.concatenate([env[0], outs[0].token_ids, env[1], outs[1].token_ids, env[2], outs[2].token_ids])
        assert np.array_equal(s.response_token_ids, want.astype(np.int32))  # bit for bit
        mask = np.concatenate([np.zeros(len(env[0])), np.ones(len(outs[0].token_ids)), np.zeros(len(env[1])),
                               np.ones(len(outs[1].token_ids)), np.zeros(len(env[2])), np.ones(len(outs[2].token_ids))])
        assert np.array_equal(s.loss_mask, mask.astype(np.int32))
        assert not s.logprobs[s.loss_mask == 0].any() and (s.logprobs[s.loss_mask == 1] == -0.5).all()
        last = next(r for r in engine.requests if r.request_id == outs[2].request_id)
        assert np.array_equal(last.prompt_token_ids, np.concatenate([s.prompt_token_ids, want[: -len(outs[2].token_ids)]]))
        assert s.env_reward == 1.0 and s.finish_reason == R.FinishReason.STOP and s.env_error == ""
        assert s.rollout["turns"] == 3 and s.rollout["tool_calls"] == 2 and s.rollout["openai_requests"] == 3
        if agent.startswith("solve_responses"):  # what the agent held: input items, or the chain's last turn
            assert s.rollout.get("items", 7) == 7 and s.rollout.get("last_response_turn", 3) == 3
        else:
            assert s.rollout["messages"] == 7  # system, user, (assistant, tool) x 2, assistant
    assert rollout.stats()["episodes_done"] == 2


def test_many_agents_at_once(tok):
    samples, _, rollout = run(tok, "solve", n=64)  # one burst of 64 connections (the listen backlog)
    assert len(samples) == 64 and all(s.env_reward == 1.0 for s in samples), {s.env_error for s in samples}


def test_a_rewritten_history_fails_the_episode(tok):
    samples, _, rollout = run(tok, "rewrites_history")
    assert all(s.finish_reason == R.FinishReason.ENV_ERROR and s.env_error.startswith("history_mismatch:")
               for s in samples)
    assert "message 2 (assistant)" in samples[0].env_error
    assert rollout.stats()["episode_failed_history_mismatch"] == 2


def test_bad_requests_are_answered_and_the_episode_goes_on(tok):
    before = dict(openai_server.shared().counts)
    samples, _, rollout = run(tok, "pokes_the_server", n=1)
    (s,) = samples
    assert s.env_reward == 1.0 and s.env_error == ""
    assert s.rollout["status_wrong_key"] == 401 and s.rollout["status_other_episode"] == 401
    assert s.rollout["status_no_path"] == 404 and s.rollout["status_garbage"] == 400
    assert s.rollout["status_nesting_bomb"] == 400  # refused by the server, never reaching the episode
    assert s.rollout["status_no_messages"] == 400 and s.rollout["status_too_big"] in (413, -1)
    assert s.rollout["status_stream_not_bool"] == 400 and s.rollout["status_stream_options_alone"] == 400
    assert s.rollout["openai_bad_requests"] == 3  # the JSON without messages and the two stream mistakes
    counts = openai_server.shared().counts
    assert counts["http_401"] - before.get("http_401", 0) == 2 and counts["http_400"] - before.get("http_400", 0) == 5
    stats = rollout.stats()  # what the generator's heartbeat carries: the endpoint's refusals too
    assert stats["openai_http_401"] == counts["http_401"] and stats["openai_http_404"] == counts["http_404"]
    assert stats["openai_requests"] == counts["requests"] > 0


@pytest.mark.parametrize("agent, reason", [("raises", "raised"), ("hangs", "timeout")])
def test_an_agent_that_fails_fails_only_its_episode(tok, agent, reason):
    samples, _, rollout = run(tok, agent, timeout=0.5)
    ok, bad = samples
    assert ok.env_reward == 1.0 and ok.env_error == ""
    assert bad.finish_reason == R.FinishReason.ENV_ERROR and bad.env_error.startswith(reason + ":")
    assert rollout.stats()[f"episode_failed_{reason}"] == 1


@pytest.mark.parametrize("agent, why", [("returns_garbage", "return a finite float reward"),
                                        ("never_asks", "before its first chat.completions request")])
def test_an_agent_returning_nonsense_fails_invalid(tok, agent, why):
    samples, _, _ = run(tok, agent, n=1)
    assert samples[0].env_error.startswith("invalid:") and why in samples[0].env_error


def test_an_episode_cut_at_max_turns_releases_its_agent(tok):
    A.released.clear()
    samples, _, _ = run(tok, "loops_forever", n=1, max_turns=2)
    assert samples[0].finish_reason == R.FinishReason.LENGTH and samples[0].rollout["turns"] == 2
    assert A.released.wait(5)  # its waiting request was answered 410 once the episode was forgotten


def test_a_closed_episode_answers_401(tok):
    server, loop = openai_server.ChatServer(), asyncio.new_event_loop()
    try:
        session = server.open(loop)
        session.close("done")
        with pytest.raises(A.HTTPError) as e:
            A.post(session.base_url + "/chat/completions", session.key, b"{}")
        assert e.value.status == 401
    finally:
        server.close()
        loop.close()


def test_parse_tool_calls():
    content, calls = parse_tool_calls('Let me add.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "x")
    assert content == "Let me add." and calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1} and calls[0]["id"] == "call_x_0"
    assert parse_tool_calls("<tool_call>{oops</tool_call>", "x") == ("<tool_call>{oops</tool_call>", [])
    assert parse_tool_calls("plain", "x") == ("plain", [])
    bomb = "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>"  # a policy can write this
    assert parse_tool_calls(bomb, "x") == (bomb, [])
    from asyncrl.rollout.chat_messages import canon
    deep = "[" * 5000 + "]" * 5000
    message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": deep}}]}
    assert canon(message)[3] == (("f", json.dumps(deep)),)  # arguments that do not parse are compared as given


def test_bad_responses_requests_are_answered_and_the_episode_goes_on(tok):
    samples, _, rollout = run(tok, "pokes_responses", n=1)
    (s,) = samples
    assert s.env_reward == 1.0 and s.env_error == "" and s.rollout["last_response_turn"] == 3
    for name in ("stream", "image", "reasoning_item", "web_search", "unknown_previous", "empty_input"):
        assert s.rollout[f"status_{name}"] == 400, name
    assert s.rollout["openai_bad_requests"] == 6
