"""Math answers: the response's final answer (asyncrl.reward.answer, `options.answer`) against the target.

A target that is a number ("-1", "0.5", "3/4", "\\frac{1}{2}") is compared as a value, exactly (within a
relative 1e-6 when either side is a decimal), inline: the final answer must itself be a value, so a
response that restates the problem ("(-95 / 95)") scores 0. Any other target (a latex expression, a set,
an interval) goes to math-verify together with the extracted final answer only, never the whole
response; that comparison is CPU-heavy (sympy) and runs in the process pool.
"""

from __future__ import annotations

import threading
from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.answer import check_mode, final_answer, final_value, parse_value, same_value
from asyncrl.reward.offload import Offload


def math_score(response: str, target: str, mode: str = "auto") -> float:
    """1.0 when the response's final answer equals the target: as a value, or by math-verify."""
    gold = parse_value(target)
    if gold is not None:
        answer = final_value(response, mode)
        return float(answer is not None and same_value(answer, gold))
    return symbolic_score(response, target, mode)


def symbolic_score(response: str, target: str, mode: str = "auto") -> float:
    """math-verify on the extracted final answer against a target that is not a plain number."""
    from math_verify import parse, verify

    # math-verify's own timeouts use SIGALRM, which only the main thread may set; the caller times us out.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(target, parsing_timeout=limit)
    if not gold and "\\" in target:  # bare latex; not words, which math-verify reads as a product of symbols
        gold = parse(f"${target}$", parsing_timeout=limit)
    if not gold:
        raise ValueError(f"math reward: math-verify cannot parse the target {target!r}")
    text = final_answer(response, mode)
    if text is None:
        return 0.0
    answer = parse(f"${text}$", parsing_timeout=limit)
    return float(bool(answer) and verify(gold, answer, timeout_seconds=limit))


class MathVerify:
    """options: answer ("auto" | "boxed" | "marked" | "last_number"; see asyncrl.reward.answer)."""

    def __init__(self, options: dict[str, Any], offload: Offload) -> None:
        unknown = set(options) - {"answer"}
        if unknown:
            raise ValueError(f"math options: unknown {sorted(unknown)}; allowed: answer")
        self.mode = check_mode(options.get("answer", "auto"))
        self.offload = offload

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        if spec.target is None:
            raise ValueError("math reward needs a reference answer: the prompt's reward.target is empty")
        if parse_value(spec.target) is not None:  # a value comparison: cheap, inline
            return math_score(response, spec.target, self.mode)
        return await self.offload.run(symbolic_score, response, spec.target, self.mode, heavy=True)

    async def close(self) -> None:
        pass
