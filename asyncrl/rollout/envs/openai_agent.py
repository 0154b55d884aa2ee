"""`OpenAIAgent`: an unmodified agent written against the `openai` client plays the episode.

    [generator.rollout]
    environment = "asyncrl.rollout.envs.openai_agent:OpenAIAgent"
    options = { agent = "my_pkg.agents:solve" }        # solve(client: ClientConfig, task: Task) -> float | dict

    reset ─► agent thread: solve(client, task) ─POST chat/completions #1─► its messages, rendered ─► first turn
    step(model turn) ─► ChatCompletion to the agent (content / Hermes tool calls parsed) ─► waits for the agent:
        next request: the earlier messages must be the episode's; only the new ones are rendered ─► next turn
        solve returned r ─► done, reward r          solve raised / bad history ─► this episode fails

The agent gets its own base URL and key (`ClientConfig`, asyncrl/rollout/openai_server.py) and talks to the
model through chat.completions (or the Responses API, read as chat: asyncrl/rollout/responses_api.py) for as many
turns as it likes. The episode is token-exact: what the model
sampled is kept as sampled (never decoded and encoded again); each later request adds only its new messages,
rendered as the chat template's difference after a model turn (as asyncrl/rollout/chat.py does for one
message), so the agent must send back the conversation it was given (the assistant messages as returned,
then new tool/user messages): a request whose earlier messages differ fails the episode ("history_mismatch").
The first request's rendering follows the leased prompt; when it starts with the prompt's ids (the agent
sent the task's own conversation) only the rest is appended. Sampling (temperature, max tokens) is the
run's, whatever the request asks; every request waits for one engine turn, so turns count to max_turns.

Timing: reset waits for the agent's first request, each step for its next request or its return, both
bounded by generator.rollout.step_timeout_s (a timeout fails the episode; a hung agent thread is abandoned,
as env_loop.py says of hung environments). A failure is returned as an env_loop `Failure`, which MultiTurn
treats as it treats a raised error, so the stats key is its own reason: `episode_failed_history_mismatch`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncrl.rollout import openai_server, responses_api
from asyncrl.rollout.chat_messages import BadRequest, canon, parse_request, parse_tool_calls, tools_key
from asyncrl.rollout.env_loop import Failure
from asyncrl.rollout.environment import Action, Observation, Step, Task

_MARK = "\u2063ASYNCRL\u2063"  # never in a real conversation
_STANDIN = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What the agent needs to build its client: openai.OpenAI(base_url=c.base_url, api_key=c.api_key)."""

    base_url: str  # http://127.0.0.1:<port>/e/<episode>/v1
    api_key: str  # this episode's bearer key
    model: str = "asyncrl"  # any name is accepted


class EpisodeError(ValueError):
    """Answered with 400, and the episode fails with `reason`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class OpenAIAgent:
    @staticmethod
    def shared_stats() -> dict[str, float]:
        """The endpoint's own counters, as `openai_<name>` (requests, http_400/401/404/409/410/413,
        streamed, connections_refused, connection_errors): what MultiTurn adds to the generator's heartbeat."""
        return {f"openai_{k}": float(v) for k, v in openai_server.shared_counts().items()}

    def __init__(self, agent: str, tokenizer: Any = None, chat_template: str = "") -> None:
        """`agent`: "module:function"; `chat_template`: a Jinja template for tokenizers without one.
        `tokenizer` is the generator's (MultiTurn passes it)."""
        if tokenizer is None:
            raise ValueError("OpenAIAgent needs the generator's tokenizer (MultiTurn passes it as `tokenizer`)")
        self.agent = _load_agent(agent)
        self.chat = _Chat(tokenizer, chat_template or None)
        self.session: openai_server.Session | None = None
        self.messages: list[dict[str, Any]] = []  # the conversation so far, as given and answered
        self.api = "chat/completions"  # the route of the request being answered
        self.request: dict[str, Any] = {}  # its body (a Response echoes some of it)
        self.response_id = ""  # the last Response's id: what a chained /responses request names
        self.instructions: str | None = None  # the first /responses request's
        self.tools_key = ""
        self.prompt_ids = np.zeros(0, np.int64)  # [prompt_len]: the leased prompt
        self.prompt_len = self.length = 0  # prompt tokens; tokens after the prompt so far
        self.last_turn: Action | None = None
        self.model = "asyncrl"  # the name the agent asked for, echoed back
        self.info = {"openai_requests": 0.0, "openai_bad_requests": 0.0}

    # ------------------------------------------------------------------ Environment

    async def reset(self, task: Task) -> Observation | Failure:
        self.session = openai_server.shared().open(asyncio.get_running_loop())
        weakref.finalize(self, self.session.close, "the episode ended")  # e.g. cut at max_turns: free the agent
        self.prompt_ids = np.asarray(task.token_ids, np.int64)
        self.prompt_len = len(self.prompt_ids)
        _start(self.agent, ClientConfig(base_url=self.session.base_url, api_key=self.session.key), task,
               self.session)
        out = await self._guarded(self._serve())
        return out if isinstance(out, Failure) else Observation(token_ids=out)

    async def step(self, action: Action) -> Step | Failure:
        if self.session is None or self.session.closed:
            return self._fail("timeout", f"the agent's request was given up ({getattr(self.session, 'closed', '')})")
        calls = self._answer(action)
        out = await self._guarded(self._serve())
        if isinstance(out, (Failure, Step)):
            return out
        return Step(observation=Observation(token_ids=out), tool_calls=calls)

    # ------------------------------------------------------------------ phases

    async def _guarded(self, work: Any) -> Any:
        try:
            return await work
        except asyncio.CancelledError:  # step_timeout_s, or the lease went back
            self.session.close("the episode was cancelled (step_timeout_s or the lease went back)")
            raise

    async def _serve(self) -> list[int] | Step | Failure:
        """The agent's next event: a request -> the ids to append; its return -> the last Step."""
        while True:
            kind, value = await self.session.next_event()
            if kind == "raised":
                return self._fail("raised", f"the agent raised {value}")
            if kind == "returned":
                return self._returned(value)
            self.info["openai_requests"] += 1
            try:
                ids = self._request(*value)
            except (BadRequest, responses_api.ResponsesError) as e:
                self.info["openai_bad_requests"] += 1
                self.session.answer(openai_server.error(400, str(e), "invalid_request_error"))
                continue
            except EpisodeError as e:
                self.session.answer(openai_server.error(400, str(e), e.reason))
                return self._fail(e.reason, str(e))
            self.length += len(ids)
            return ids

    def _request(self, route: str, body: dict[str, Any]) -> list[int]:
        raw = body
        if route == "responses":
            body, instructions = responses_api.to_chat(body, self.response_id, self.messages, self.instructions)
            if self.last_turn is None:
                self.instructions = instructions
        messages, tools = parse_request(body)
        self.api, self.request = route, raw
        self.model = str(body.get("model") or "asyncrl")[:100]
        if self.last_turn is None:  # the first request: the whole conversation is the prompt
            self.tools_key = tools_key(tools)
            self.messages = list(messages)
            ids = self.chat.prompt(messages, tools)
            if ids[: self.prompt_len] == self.prompt_ids.tolist():
                return ids[self.prompt_len:]
            self.info["prompt_not_prefix"] = 1.0
            return ids
        new = self._new_messages(messages, tools)
        self.messages += new
        return self.chat.turn(new, tools, self.last_turn)

    def _new_messages(self, messages: list[dict[str, Any]], tools: list | None) -> list[dict[str, Any]]:
        if tools_key(tools) != self.tools_key:
            raise EpisodeError("history_mismatch", "the tools differ from the episode's first request")
        n = len(self.messages)
        if len(messages) <= n:
            raise EpisodeError("history_mismatch", f"{len(messages)} messages; the conversation so far has {n}: "
                                                   "send it back whole, with the new messages after it")
        for i, (had, sent) in enumerate(zip(self.messages, messages)):
            if canon(sent) != canon(had):
                raise EpisodeError("history_mismatch", f"message {i} ({sent['role']}) is not the one this "
                                                       "episode has: earlier messages must be sent back unchanged")
        new = messages[n:]
        if any(m["role"] == "assistant" for m in new):
            raise EpisodeError("history_mismatch", "a new message is an assistant message this endpoint did not "
                                                   "write (the model's turns come only from the model)")
        return new

    def _answer(self, action: Action) -> int:
        """Send the model's turn to the waiting agent (a ChatCompletion, or a Response on /responses); returns its
        tool calls."""
        turn = 1 + (self.last_turn.turn if self.last_turn else 0)
        content, calls = parse_tool_calls(action.text, f"{self.session.sid}_{turn}")
        finish = "length" if action.finish_reason == "length" else ("tool_calls" if calls else "stop")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        usage = (self.prompt_len + self.length, len(action.token_ids))
        self.length += len(action.token_ids)
        self.messages.append(message)
        self.last_turn = action
        rid = f"{self.session.sid}_{turn}"
        if self.api == "responses":
            reply = responses_api.response(rid, self.model, content, calls, finish, usage, self.request)
            self.response_id = reply["id"]
        else:
            reply = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()),
                     "model": self.model,
                     "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                     "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}
        self.session.answer((200, reply))
        return len(calls)

    def _returned(self, value: Any) -> Step | Failure:
        if self.last_turn is None:
            return self._fail("invalid", "the agent returned before its first chat.completions request")
        extra = dict(value) if isinstance(value, dict) else {}
        reward = extra.pop("reward", None) if isinstance(value, dict) else value
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            return self._fail("invalid", f"the agent returned {type(value).__name__} {str(value)[:80]!r}; return a "
                                         "finite float reward, or a dict with one under 'reward'")
        info = {**self.info, **{k: float(v) for k, v in extra.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}}
        self.session.close("the agent returned")
        return Step(reward=float(reward), done=True, info=info)

    def _fail(self, reason: str, detail: str) -> Failure:
        if self.session is not None:
            self.session.close(f"{reason}: {detail[:200]}")
        return Failure(reason, detail[:300])


class _Chat:
    """The chat template as token ids: a first request whole, and the messages after a model turn."""

    def __init__(self, tokenizer: Any, template: str | None) -> None:
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError("OpenAIAgent needs a model with a chat template, or generator.rollout.options."
                             "chat_template (a Jinja template)")
        self.tokenizer, self.template = tokenizer, template

    def prompt(self, messages: list[dict[str, Any]], tools: list | None) -> list[int]:
        return self._encode(self._render(messages, tools, generation=True))

    def turn(self, messages: list[dict[str, Any]], tools: list | None, last: Action) -> list[int]:
        """closing of the model's turn + render(history + messages) - render(history), as ids."""
        before = self._render(_STANDIN, tools, generation=False)
        after = self._render([*_STANDIN, *messages], tools, generation=True)
        if not after.startswith(before):
            raise EpisodeError("invalid", "the chat template renders earlier messages differently once these are "
                                          "added; this model cannot be served token-exact")
        closing = before[before.index(_MARK) + len(_MARK):]
        if last.finish_reason == "stop" and len(last.token_ids):  # its stop token is already in the episode
            stop = self.tokenizer.decode([int(last.token_ids[-1])], skip_special_tokens=False)
            closing = closing[len(stop):] if stop and closing.startswith(stop) else closing
        return self._encode(closing + after[len(before):])

    def _render(self, messages: list[dict[str, Any]], tools: list | None, generation: bool) -> str:
        kw: dict[str, Any] = {"tools": tools} if tools else {}
        if self.template is not None:
            kw["chat_template"] = self.template
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kw)
        except Exception as e:  # noqa: BLE001 - a template's own error (e.g. a role it does not know)
            raise BadRequest(f"the chat template refused these messages: {type(e).__name__}: {str(e)[:200]}") from None

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]


# ---------------------------------------------------------------------- the agent


def _load_agent(spec: str) -> Any:
    where = f"generator.rollout.options.agent={spec!r}"
    module_name, _, attr = str(spec).partition(":")
    if not attr:
        raise ValueError(f"{where}: give it as 'module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr, None)
    except Exception as e:  # noqa: BLE001 - any import failure is the config's
        raise ValueError(f"{where}: cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise ValueError(f"{where}: {module_name!r} has no callable {attr!r}")
    return fn


def _start(agent: Any, client: ClientConfig, task: Task, session: openai_server.Session) -> None:
    """Run agent(client, task) in a daemon thread of its own (an async agent on an event loop of its own)."""

    def run() -> None:
        try:
            value = agent(client, task)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        except BaseException as e:  # noqa: BLE001 - SystemExit too: it ends this episode only
            session.ended("raised", f"{type(e).__name__}: {str(e)[:300]}")
        else:
            session.ended("returned", value)

    threading.Thread(target=run, name=f"agent-{session.sid}", daemon=True).start()


async def _awaited(value: Any) -> Any:
    return await value
