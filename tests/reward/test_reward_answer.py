"""Final-answer extraction (asyncrl.reward.answer) and the math reward that compares it as a value: a
response that restates the problem scores 0."""

import asyncio

import pytest

from asyncrl.reward.answer import answer_span, final_answer, final_value, parse_value
from asyncrl.reward.mathverify import math_score
from asyncrl.reward.scorer import Scorer
from reward_helpers import config, item, spec


def test_restating_the_problem_scores_zero_and_the_answer_one():
    """"Calculate -95 / 95." (target -1): the cheat math-verify let through on the whole response."""
    assert math_score("(-95 / 95)", "-1") == 0.0
    assert math_score("-1", "-1") == 1.0
    assert math_score("-95 / 95 = -1", "-1") == 1.0

    async def through_the_scorer():
        scorer = Scorer(config({"kind": "math"}, process_pool=0))
        try:
            return [(await scorer.score(item(t, spec("-1")))).reward for t in ("(-95 / 95)", "-1", "-95 / 95 = -1")]
        finally:
            await scorer.close()
    assert asyncio.run(through_the_scorer()) == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("response,value", [
    ("-1", "-1"), ("-95 / 95 = -1", "-1"), ("−95 ÷ 95 = −1", "-1"), ("(-1)", "-1"), ("The answer is 7. Check: 3+4", "7"),
    ("**Final Answer:** 1,234", "1234"), ("x = -3/4.", "-3/4"), (r"so $\frac{1}{2}$", "1/2"), (r"$-\frac{3}{4}$", "-3/4"),
    ("I think 0.5", "0.5"), (r"\boxed{18 \text{ apples}} and then 3", "18"), ("<answer>42</answer> bye 7", "42"),
    ("#### 288", "288"), ("Answer:\n\n12", "12"), ("It costs $18.", "18"), (r"\boxed{\boxed{5}}", "5"),
    # no value: the last number is an operand, or an unevaluated division
    ("(-95 / 95)", None), ("-95/95", None), ("0 + 5", None), ("5-3", None), ("2^3", None), ("2**3", None),
    (r"\boxed{\frac{2}{4}}", None), ("6/1", None), ("answer: -95 / 95", None), (r"\boxed{x}", None), ("no digits", None),
])
def test_final_value(response, value):
    got = final_value(response)
    assert (None if got is None else got.text()) == value


def test_modes_and_the_answer_text():
    text = r"answer: 4. So \boxed{5}; finally 6"
    assert [final_value(text, m).text() for m in ("auto", "boxed", "marked", "last_number")] == ["5", "5", "4", "6"]
    assert answer_span("just 3", "boxed") is None and answer_span("just 3", "marked") is None
    assert final_answer(r"so \boxed{x + 1}") == "x + 1"
    assert final_answer("thinking...\nParis") == "Paris"  # auto without box or marker: the last line
    assert final_answer("it is 12 or 13", "last_number") == "13"


@pytest.mark.parametrize("target,value", [("-1", "-1"), ("1,000", "1000"), ("3/6", "1/2"), (r"\frac{1}{2}", "1/2"),
                                          ("$3$", "3"), ("0.25", "0.25"), ("x+1", None), ("3/0", None)])
def test_targets_parse_leniently(target, value):
    got = parse_value(target)
    assert (None if got is None else got.text()) == value


def test_decimal_tolerance_and_exact_fractions():
    assert math_score("0.3333333", "1/3") == 1.0 and math_score("0.33", "1/3") == 0.0
    assert math_score("1/3", "1/3") == 1.0 and math_score("2/6", "1/3") == 0.0


def test_bad_answer_option_is_a_config_error():
    with pytest.raises(ValueError, match="options.answer='last'"):
        Scorer(config({"kind": "math", "options": {"answer": "last"}}))
    with pytest.raises(ValueError, match="math options: unknown"):
        Scorer(config({"kind": "math", "options": {"mode": "auto"}}))


def test_exact_match_can_compare_the_extracted_answer():
    async def go(options, text):
        scorer = Scorer(config({"kind": "exact_match", "options": options}))
        try:
            return (await scorer.score(item(text, spec("Paris")))).reward
        finally:
            await scorer.close()
    assert asyncio.run(go({}, "I think the answer is: Paris")) == 0.0
    assert asyncio.run(go({"answer": "auto"}, "I think the answer is: Paris")) == 1.0
