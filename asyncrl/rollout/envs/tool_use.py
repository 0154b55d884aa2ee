"""`ToolUse`: the model may call a calculator or a sandboxed Python executor before it answers.

    user: Calculate 37 * 48.            model: <tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>
    tool: <tool_response>1776</tool_response>                               model: 37 * 48 = 1776

Tool calls use the Hermes/Qwen format (a JSON object between <tool_call> tags), which is what chat
templates with tool support teach their models. Each turn's calls (at most `max_calls`) run in order and
come back in one message of role `tool_role`; a turn with no call is the final answer, scored by the
strict check of asyncrl.reward.strict against the task's answer (1 right, 0 wrong: reward for the
answer, never for calling tools). Tools: "calculator" (asyncrl/rollout/calculator.py) and "python"
(asyncrl/rollout/sandbox.py: a fresh temp dir, no network, CPU/memory/time limits).
"""

from __future__ import annotations

import json
import re
from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.strict import strict_score
from asyncrl.rollout.calculator import CalculatorError, calculate
from asyncrl.rollout.environment import Action, Observation, Step, Task
from asyncrl.rollout.sandbox import SandboxLimits, SandboxUnavailable, run_python

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOLS = ("calculator", "python")


class ToolUse:
    def __init__(self, tools: list[str] | tuple[str, ...] = ("calculator",), tool_role: str = "tool",
                 max_calls: int = 4, python_wall_s: float = 5.0) -> None:
        unknown = sorted(set(tools) - set(TOOLS))
        if unknown:
            raise ValueError(f"generator.rollout.options.tools: unknown {unknown}; known: {list(TOOLS)}")
        self.tools, self.tool_role, self.max_calls = tuple(tools), tool_role, max_calls
        self.limits = SandboxLimits(wall_s=python_wall_s)
        self.spec = RewardSpec()

    def reset(self, task: Task) -> None:
        self.spec = RewardSpec(target=task.target, params=dict(task.params))
        return None

    def step(self, action: Action) -> Step:
        calls = TOOL_CALL.findall(action.text)
        if not calls:
            return Step(reward=strict_score(action.text, self.spec), done=True)
        answers = [self._run(c) for c in calls[: self.max_calls]]
        content = "\n".join(f"<tool_response>{a}</tool_response>" for a in answers)
        return Step(observation=Observation(message={"role": self.tool_role, "content": content}),
                    tool_calls=len(answers))

    def _run(self, raw: str) -> str:
        call = _parse(raw)
        if isinstance(call, str):
            return call
        name, args = call
        if name not in self.tools:
            return f"error: no tool {name!r}; tools: {', '.join(self.tools)}"
        if name == "calculator":
            try:
                return calculate(str(args.get("expression", "")))
            except CalculatorError as e:
                return f"error: {e}"
        try:
            return run_python(str(args.get("code", "")), self.limits).summary()
        except SandboxUnavailable as e:
            return f"error: {e}"


def _parse(raw: str) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments), or the error text the model gets back."""
    try:
        call = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):  # the model's text, nesting bombs included
        return "error: a tool call must be a JSON object with name and arguments"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "error: a tool call must be a JSON object with name and arguments"
    args = call.get("arguments", {})
    return (call["name"], args) if isinstance(args, dict) else "error: arguments must be a JSON object"
