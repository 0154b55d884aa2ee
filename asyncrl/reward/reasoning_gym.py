"""The reasoning_gym reward kind: the task's own scorer (`dataset.score_answer(answer, entry)`) on the
final answer extracted from the response (asyncrl.reward.answer, `options.answer`).

The entry is rebuilt from the prompt's reward params (asyncrl.task.reasoning_gym.entry: task, options,
seed, size, index), so the worker needs nothing but the RewardSpec. For a numeric answer the scorer sees
the extracted value in its canonical spelling ("-1", "3/4"), or None when the response has no value (it
restated the problem, or ended in an expression); for other answers it sees the answer text (the boxed
or marked span, else the last non-empty line).

Scoring is pure Python and cheap for most tasks (the datasets and the last entries are cached per
process), so it runs inline; `cpu_heavy = true` moves it to the process pool. No batching: each call is
independent and the worker already scores up to reward.max_inflight samples concurrently.
"""

from __future__ import annotations

from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.answer import check_mode, final_answer, final_value, parse_value
from asyncrl.reward.offload import Offload
from asyncrl.task import reasoning_gym


def rg_answer(response: str, target: str | None, mode: str = "auto") -> str | None:
    """What the task's scorer is given: the value's canonical text for a numeric target, else the answer text."""
    if target is not None and parse_value(target) is not None:
        value = final_value(response, mode)
        return None if value is None else value.text()
    return final_answer(response, mode)


def rg_score(response: str, spec: RewardSpec, mode: str = "auto") -> float:
    if "rg_task" not in spec.params:
        raise ValueError('reasoning_gym reward: the prompt has no params.rg_task; it scores prompts of '
                         'task.name = "reasoning_gym" only')
    return reasoning_gym.score(rg_answer(response, spec.target, mode), spec.params, spec.target)


class ReasoningGymReward:
    """options: answer ("auto" | "boxed" | "marked" | "last_number"), cpu_heavy (false)."""

    def __init__(self, options: dict[str, Any], offload: Offload) -> None:
        unknown = set(options) - {"answer", "cpu_heavy"}
        if unknown:
            raise ValueError(f"reasoning_gym options: unknown {sorted(unknown)}; allowed: answer, cpu_heavy")
        self.mode = check_mode(options.get("answer", "auto"))
        self.cpu_heavy = bool(options.get("cpu_heavy", False))
        self.offload = offload
        reasoning_gym.require_package()  # a missing package is a config error, not a failed sample

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        if self.cpu_heavy:
            return await self.offload.run(rg_score, response, spec, self.mode, heavy=True)
        return rg_score(response, spec, self.mode)

    async def close(self) -> None:
        pass
