"""The reasoning_gym reward kind (the task's own scorer on the extracted final answer, the entry rebuilt
from the prompt's params) and the strict held-out check (asyncrl.reward.strict)."""

import asyncio
from itertools import islice

import pytest

from asyncrl.records import RewardSpec
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.strict import strict_score
from asyncrl.task.config import TaskConfig
from asyncrl.task.source import make_prompt_source
from reward_helpers import config, item

ARITH = {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                                "operators": ["+", "-", "*", "/"]}}


def prompts(*tasks, k=200):
    cfg = TaskConfig(name="reasoning_gym", tasks=list(tasks), size=k, shuffle=False)
    return list(islice(make_prompt_source(cfg, 1), k))


def scores(spec, texts, **options):
    async def go():
        scorer = Scorer(config({"kind": "reasoning_gym", "options": options}, process_pool=1, timeout_s=30))
        try:
            return [(await scorer.score(item(t, spec))).reward for t in texts]
        finally:
            await scorer.close()
    return asyncio.run(go())


def division():
    """A basic_arithmetic prompt "Calculate a / b." and its expression."""
    p = next(p for p in prompts(ARITH) if " / " in p.text and "(" not in p.text)
    return p, p.text.removeprefix("Calculate ").removesuffix(".")


def test_basic_arithmetic_right_wrong_and_restated():
    p, expr = division()
    answer = p.reward.target
    wrong = str(int(answer) + 1)
    assert scores(p.reward, [answer, f"{expr} = {answer}", wrong, f"({expr})", expr, f"\\boxed{{{answer}}}"]) \
        == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_gsm_symbolic_right_wrong_and_restated():
    p = prompts({"name": "gsm_symbolic"}, k=3)[0]
    answer = p.reward.target
    got = scores(p.reward, [f"So the total is {answer}.", f"#### {answer}", f"#### {int(answer) + 1}", p.text])
    assert got[:2] == [1.0, 1.0] and got[2] < 1.0 and got[3] < 1.0


def test_answer_option_and_the_process_pool():
    p, expr = division()
    text = f"answer: {p.reward.target}. Then {expr}"
    assert scores(p.reward, [text], answer="marked") == [1.0]
    assert scores(p.reward, [text], answer="last_number") == [0.0]
    assert scores(p.reward, [p.reward.target], cpu_heavy=True) == [1.0]


def test_prompts_from_another_task_fail_with_a_reason():
    async def go():
        scorer = Scorer(config({"kind": "reasoning_gym"}))
        try:
            return await scorer.score(item("1", RewardSpec(target="1")))
        finally:
            await scorer.close()
    out = asyncio.run(go())
    assert out.reward == 0.0 and "rg_task" in out.reason
    with pytest.raises(ValueError, match="reasoning_gym options: unknown"):
        Scorer(config({"kind": "reasoning_gym", "options": {"strict": True}}))


def test_strict_score():
    p, expr = division()
    answer = p.reward.target
    assert [strict_score(t, p.reward) for t in (answer, f"{expr} = {answer}", f"({expr})", str(int(answer) + 1))] \
        == [1.0, 1.0, 0.0, 0.0]
    g = prompts({"name": "gsm_symbolic"}, k=2)[1]
    assert strict_score(f"The answer is {g.reward.target}", g.reward) == 1.0
    assert strict_score(g.reward.target + "0", g.reward) == 0.0
    # without rg params: the value of the final answer against the target, never the whole response
    assert [strict_score(t, RewardSpec(target="-1")) for t in ("(-95 / 95)", "-1", "-95 / 95 = -1")] == [0.0, 1.0, 1.0]
    assert strict_score(r"so \boxed{\sqrt{2}}", RewardSpec(target=r"\sqrt{2}")) == 1.0
    assert [strict_score(t, RewardSpec(target="Paris")) for t in ("The answer is Paris.", "Hmm.\nparis", "Rome")] == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="neither a reward target nor params.rg_task"):
        strict_score("1", RewardSpec())
