"""`ToolUse`: the model may call a calculator or a sandboxed Python executor before it answers.

    user: Calculate 37 * 48.            model: <tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>
    tool: <tool_response>1776</tool_response>                               model: 37 * 48 = 1776

Tool calls use the Hermes/Qwen format (a JSON object between <tool_call> tags), which is what chat
templates with tool support teach their models. Each turn's calls (at most `max_calls`) run in order and
come back in one message of role `tool_role`; a turn with no call is the final answer, scored by the
strict check of asyncrl.reward.strict against the task's answer (1 right, 0 wrong: reward for the
answer, never for calling tools). Tools: "calculator" (asyncrl/rollout/calculator.py) and "python"
(asyncrl/rollout/sandbox.py: a fresh temp dir, no network, CPU/memory/time limits).

One exception, off by default: `call_reward` (with `call_reward_until`) pays the first call of an episode that a
tool ran without an error, call_reward x (1 - version / call_reward_until) for the weight version that sampled
the turn, so nothing from version `call_reward_until` on. It is a start for a model that calls the tool too rarely
for the answer reward ever to reach a call (SmolLM2-135M: about 1 episode in 100, docs/rollouts.md). The payment
is for any working call, the prompt's own example too, so it must end: a lasting bonus is a reward hole (a policy
calls for the bonus and stops answering). The held-out evaluation never sees it: it scores the final answer.
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
_ERROR = "error"  # how every failed call's answer begins ("error: ...", the sandbox's "error (exit 1): ...")


class ToolUse:
    def __init__(self, tools: list[str] | tuple[str, ...] = ("calculator",), tool_role: str = "tool",
                 max_calls: int = 4, python_wall_s: float = 5.0, call_reward: float = 0.0,
                 call_reward_until: int = 0) -> None:
        unknown = sorted(set(tools) - set(TOOLS))
        if unknown:
            raise ValueError(f"generator.rollout.options.tools: unknown {unknown}; known: {list(TOOLS)}")
        _check_call_reward(call_reward, call_reward_until)
        self.tools, self.tool_role, self.max_calls = tuple(tools), tool_role, max_calls
        self.call_reward, self.call_reward_until = float(call_reward), int(call_reward_until)
        self.limits = SandboxLimits(wall_s=python_wall_s)
        self.spec = RewardSpec()
        self.paid = False  # the episode's first working call has had its call_reward

    def reset(self, task: Task) -> None:
        self.spec = RewardSpec(target=task.target, params=dict(task.params))
        self.paid = False
        return None

    def step(self, action: Action) -> Step:
        calls = TOOL_CALL.findall(action.text)
        if not calls:
            return Step(reward=strict_score(action.text, self.spec), done=True)
        answers = [self._run(c) for c in calls[: self.max_calls]]
        content = "\n".join(f"<tool_response>{a}</tool_response>" for a in answers)
        errors = sum(a.startswith(_ERROR) for a in answers)
        return Step(observation=Observation(message={"role": self.tool_role, "content": content}),
                    reward=self._call_reward(action.version, working=errors < len(answers)),
                    tool_calls=len(answers), info={"tool_errors": float(errors)})

    def _call_reward(self, version: int, working: bool) -> float:
        """call_reward for the episode's first working call, decayed linearly to 0 at call_reward_until."""
        if not working or self.paid or self.call_reward == 0.0:
            return 0.0
        self.paid = True
        return self.call_reward * max(0.0, 1.0 - version / self.call_reward_until)

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


def _check_call_reward(call_reward: float, until: int) -> None:
    if not (isinstance(call_reward, (int, float)) and 0.0 <= call_reward <= 1.0):
        raise ValueError(f"generator.rollout.options.call_reward={call_reward!r}: must be in [0, 1] (a fraction of "
                         "a right answer's reward; 0 = off)")
    if call_reward and not (isinstance(until, int) and until > 0):
        raise ValueError(f"generator.rollout.options.call_reward_until={until!r}: call_reward needs the weight "
                         "version at which it has decayed to 0, an integer > 0 (a bonus that never ends is a "
                         "reward the policy can farm by calling and not answering)")


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
