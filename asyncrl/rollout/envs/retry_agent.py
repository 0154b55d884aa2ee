"""`retry_arithmetic`: the embedded arithmetic task with retries, written as an OpenAI-client agent.

    [generator.rollout]
    environment = "asyncrl.rollout.envs.openai_agent:OpenAIAgent"
    options = { agent = "asyncrl.rollout.envs.retry_agent:retry_arithmetic" }   # configs/openai-agent-cpu.toml

The rules are those of `RetryArithmetic` (a wrong answer gets the problem again; the right one ends the episode
with reward 0.5 ** (turn - 1)), but the agent sees only chat messages, as an agent written for any
OpenAI-compatible server does. It uses the `openai` package when it is installed, else one JSON POST with the
body that package sends (POST {base_url}/chat/completions, the bearer key), so the recipe runs without it.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from asyncrl.rollout.environment import Task
from asyncrl.rollout.envs.openai_agent import ClientConfig

DISCOUNT = 0.5
TIMEOUT_S = 60.0  # one model turn, waited for by the generator's own step timeout too


def retry_arithmetic(client: ClientConfig, task: Task, turns: int = 3) -> float:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.text}]
    for turn in range(1, turns + 1):
        reply = chat(client, messages)
        answer = (reply.get("content") or "").strip().split(" ")[0]
        if task.target is not None and answer == task.target.strip():
            return DISCOUNT ** (turn - 1)
        messages += [reply, {"role": "user", "content": " " + (task.text or "")}]
    return 0.0


def chat(client: ClientConfig, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message of one chat completion, as a dict."""
    try:
        import openai
    except ImportError:
        body = json.dumps({"model": client.model, "messages": messages}).encode()
        req = urllib.request.Request(client.base_url + "/chat/completions", data=body, method="POST", headers={
            "Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:  # loopback: the generator's own endpoint
            return json.loads(r.read())["choices"][0]["message"]
    api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, timeout=TIMEOUT_S, max_retries=0)
    msg = api.chat.completions.create(model=client.model, messages=messages).choices[0].message
    return {"role": "assistant", "content": msg.content}
