"""Cheap rule-based reward kinds, run inline on the event loop: exact match, regex, the task verifier."""

from __future__ import annotations

import re
from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.answer import check_mode, final_answer
from asyncrl.task.arithmetic import verify as task_verify


def _target(spec: RewardSpec, kind: str) -> str:
    if spec.target is None:
        raise ValueError(f"{kind} reward needs a reference answer: the prompt's reward.target is empty")
    return spec.target


def _normalise(text: str) -> str:
    return " ".join(text.split())


class ExactMatch:
    """1.0 when response and target are equal after collapsing whitespace runs and trimming. With
    options.answer ("auto" | "boxed" | "marked" | "last_number") only the extracted final answer
    (asyncrl.reward.answer.final_answer) is compared, so reasoning before the answer is allowed."""

    def __init__(self, options: dict[str, Any]) -> None:
        unknown = set(options) - {"answer"}
        if unknown:
            raise ValueError(f"exact_match options: unknown {sorted(unknown)}; allowed: answer")
        self.mode = check_mode(options["answer"]) if "answer" in options else None

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        target = _target(spec, "exact_match")
        answer = response if self.mode is None else final_answer(response, self.mode)
        return float(answer is not None and _normalise(answer) == _normalise(target))

    async def close(self) -> None:
        pass


class RegexMatch:
    """Format check: 1.0 when `pattern` matches the response (anywhere, or the whole of it with full_match)."""

    def __init__(self, options: dict[str, Any]) -> None:
        unknown = set(options) - {"pattern", "full_match"}
        if unknown:
            raise ValueError(f"regex options: unknown {sorted(unknown)}; allowed: pattern, full_match")
        try:
            self.pattern = re.compile(options["pattern"], re.DOTALL)
        except (re.error, TypeError) as e:
            raise ValueError(f"regex options.pattern={options['pattern']!r} does not compile: {e}") from None
        self.full_match = bool(options.get("full_match", False))

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        match = self.pattern.fullmatch(response) if self.full_match else self.pattern.search(response)
        return float(match is not None)

    async def close(self) -> None:
        pass


class TaskVerifier:
    """The embedded arithmetic task's verifier (asyncrl.task.arithmetic.verify)."""

    def __init__(self, options: dict[str, Any]) -> None:
        if options:
            raise ValueError(f"task reward takes no options, got {sorted(options)}")

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        return task_verify(response, _target(spec, "task"))

    async def close(self) -> None:
        pass
