"""The strict held-out check: did the response's final answer get the problem right? Synchronous and
deterministic, for evaluation (asyncrl.evaluation), never gameable by restating the problem.

    reasoning_gym prompt (params.rg_task)  the task's own scorer on the extracted final answer ("auto"
                                           extraction); 1.0 only for full credit, partial credit counts 0
    a numeric target                       the final answer as a value equals it (asyncrl.reward.mathverify)
    another target                         math-verify on the extracted final answer only; a target
                                           math-verify cannot read (plain words) is compared as text
"""

from __future__ import annotations

from asyncrl.records import RewardSpec
from asyncrl.reward.answer import final_answer
from asyncrl.reward.mathverify import math_score
from asyncrl.reward.reasoning_gym import rg_score

_FULL = 1.0 - 1e-9


def strict_score(response: str, spec: RewardSpec) -> float:
    """1.0 when the response's final answer is right, else 0.0 (see the module docstring)."""
    if "rg_task" in spec.params:
        return float(rg_score(response, spec, "auto") >= _FULL)
    if spec.target is None:
        raise ValueError("strict check: the prompt has neither a reward target nor params.rg_task; "
                         "held-out prompts need a reference answer")
    try:
        return math_score(response, spec.target, "auto")
    except ValueError:  # math-verify cannot parse the target: words, names
        answer = final_answer(response, "auto")
        return float(answer is not None and _words(answer) == _words(spec.target))


def _words(text: str) -> str:
    return " ".join(text.split()).rstrip(".").casefold()
