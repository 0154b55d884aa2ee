"""Math answers checked with math-verify: parse the target and the response, then compare symbolically."""

from __future__ import annotations

import threading
from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.offload import Offload


def math_score(response: str, target: str) -> float:
    """1.0 when math-verify finds the response's answer equal to the target. CPU-heavy (sympy)."""
    from math_verify import parse, verify

    # math-verify's own timeouts use SIGALRM, which only the main thread may set; the caller times us out.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(target, parsing_timeout=limit)
    if not gold:
        raise ValueError(f"math reward: math-verify cannot parse the target {target!r}")
    answer = parse(response, parsing_timeout=limit)
    return float(bool(answer) and verify(gold, answer, timeout_seconds=limit))


class MathVerify:
    def __init__(self, options: dict[str, Any], offload: Offload) -> None:
        if options:
            raise ValueError(f"math reward takes no options, got {sorted(options)}")
        self.offload = offload

    async def __call__(self, response: str, spec: RewardSpec) -> float:
        if spec.target is None:
            raise ValueError("math reward needs a reference answer: the prompt's reward.target is empty")
        return await self.offload.run(math_score, response, spec.target, heavy=True)

    async def close(self) -> None:
        pass
