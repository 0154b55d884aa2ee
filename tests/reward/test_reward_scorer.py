"""Weighted combination of components and what ScoreResult reports."""

import asyncio

from asyncrl.records import ScoreStatus
from asyncrl.reward.scorer import Scorer
from reward_helpers import config, fn, item, spec


def test_weighted_sum_and_unweighted_components():
    cfg = config({"kind": "task", "weight": 1.0},
                 {"kind": "regex", "name": "format", "weight": 0.5, "options": {"pattern": r"^-?\d+", "full_match": False}},
                 {"kind": "python", "name": "len", "weight": -0.1, "options": {"function": fn("length")}})

    async def go():
        scorer = Scorer(cfg)
        try:
            return await asyncio.gather(scorer.score(item("85", spec("85"))), scorer.score(item("x", spec("85"))))
        finally:
            await scorer.close()
    right, wrong = asyncio.run(go())
    assert right.status is ScoreStatus.OK and right.components == {"task": 1.0, "format": 1.0, "len": 0.2}
    assert abs(right.reward - (1.0 + 0.5 - 0.02)) < 1e-9
    assert wrong.components == {"task": 0.0, "format": 0.0, "len": 0.1}
    assert abs(wrong.reward - (-0.01)) < 1e-9
    assert (right.prompt_id, right.sample_index) == ("p0", 0)  # by id: the hub keeps the sample


def test_one_failing_component_fails_the_sample_and_keeps_the_others():
    cfg = config({"kind": "task"}, {"kind": "python", "name": "bad", "options": {"function": fn("raises")}})

    async def go():
        scorer = Scorer(cfg)
        try:
            return await scorer.score(item("85", spec("85")))
        finally:
            await scorer.close()
    out = asyncio.run(go())
    assert out.status is ScoreStatus.FAILED and out.reward == 0.0
    assert out.reason == "bad: raised ValueError: boom" and out.components == {"task": 1.0}
