"""Every reward kind through the Scorer, including functions that raise, hang or return garbage."""

import asyncio
import os

import pytest

from asyncrl.records import ScoreStatus
from asyncrl.reward.config import RewardComponentConfig, RewardConfig
from asyncrl.reward.protocol import RewardFn
from asyncrl.reward.rules import ExactMatch, RegexMatch, TaskVerifier
from asyncrl.reward.scorer import Scorer
from reward_helpers import config, fn, item, spec


def score(cfg: RewardConfig, text: str, target: str | None = None, **params):
    async def go():
        scorer = Scorer(cfg)
        try:
            return await scorer.score(item(text, spec(target, **params)))
        finally:
            await scorer.close()
    return asyncio.run(go())


def test_builtins_implement_the_protocol():
    for impl in (ExactMatch({}), RegexMatch({"pattern": "x"}), TaskVerifier({})):
        assert isinstance(impl, RewardFn)


@pytest.mark.parametrize("text,expected", [("  hello   world \n", 1.0), ("hello world!", 0.0)])
def test_exact_match_normalises_whitespace(text, expected):
    assert score(config({"kind": "exact_match"}), text, "hello  world").reward == expected


def test_exact_match_without_target_fails():
    out = score(config({"kind": "exact_match"}), "x", None)
    assert out.status is ScoreStatus.FAILED and "target" in out.reason


@pytest.mark.parametrize("full,text,expected", [(False, "so <answer>4</answer>", 1.0), (True, "so <answer>4</answer>", 0.0),
                                                (True, "<answer>4</answer>", 1.0), (False, "4", 0.0)])
def test_regex_search_and_full_match(full, text, expected):
    cfg = config({"kind": "regex", "options": {"pattern": r"<answer>\d+</answer>", "full_match": full}})
    assert score(cfg, text).reward == expected


def test_regex_bad_pattern_is_a_config_error():
    with pytest.raises(ValueError, match="does not compile"):
        Scorer(config({"kind": "regex", "options": {"pattern": "("}}))


@pytest.mark.parametrize("text,expected", [("85", 1.0), ("85<eos>", 1.0), (" 85 <eos>9", 1.0), ("58", 0.0), ("", 0.0)])
def test_task_kind_uses_the_arithmetic_verifier(text, expected):
    assert score(config({"kind": "task"}), text, "85").reward == expected


def test_math_kind_in_a_thread_and_in_the_process_pool():
    cfg_thread = config({"kind": "math"}, process_pool=0, timeout_s=20)
    assert score(cfg_thread, r"so the answer is $\frac{1}{2}$", "0.5").reward == 1.0
    assert score(cfg_thread, r"the answer is $3$", "0.5").reward == 0.0

    async def pooled(target, texts):
        scorer = Scorer(config({"kind": "math"}, timeout_s=30))
        try:
            return [s.reward for s in await asyncio.gather(*(scorer.score(item(t, spec(target))) for t in texts))]
        finally:
            await scorer.close()
    # A numeric target is compared as a value inline; an unsimplified fraction is not a final answer.
    assert asyncio.run(pooled("1/2", [r"$\boxed{\frac{1}{2}}$", "I think 0.5", r"$\boxed{2}$", r"$\boxed{\frac{2}{4}}$"])) \
        == [1.0, 1.0, 0.0, 0.0]
    # Any other target goes to math-verify in the process pool, with the extracted answer only.
    assert asyncio.run(pooled(r"\sqrt{2}", [r"so $\boxed{\sqrt{2}}$", r"$\boxed{2}$", r"the answer is \sqrt{2}"])) == [1.0, 0.0, 1.0]


def test_python_sync_async_dict_and_spec():
    assert score(config({"kind": "python", "options": {"function": fn("length")}}), "abcde").reward == 0.5
    assert score(config({"kind": "python", "options": {"function": fn("async_half")}}), "x").reward == 0.5
    assert score(config({"kind": "python", "options": {"function": fn("target_len")}}), "x", "abc").reward == 3.0
    out = score(config({"kind": "python", "name": "d", "options": {"function": fn("with_details")}}), "abc")
    assert out.reward == 0.25 and out.components == {"d": 0.25, "d/chars": 3.0}


def test_python_cpu_heavy_runs_in_another_process():
    out = score(config({"kind": "python", "options": {"function": fn("pid"), "cpu_heavy": True}}), "x")
    assert out.status is ScoreStatus.OK and out.reward != float(os.getpid())


def test_python_bad_path_is_a_config_error():
    with pytest.raises(ValueError, match="cannot be imported"):
        Scorer(config({"kind": "python", "options": {"function": "reward_fns:nope"}}))
    with pytest.raises(ValueError, match="pkg.module:function"):
        Scorer(config({"kind": "python", "options": {"function": "reward_fns.length"}}))


@pytest.mark.parametrize("name,reason", [
    ("raises", "raised ValueError: boom"),
    ("returns_nan", "non-finite"),
    ("returns_text", "not a number"),
    ("dict_without_reward", "without a 'reward' entry"),
    ("async_hangs", "timed out after 0.3 s"),
    ("hangs", "timed out after 0.3 s"),
])
def test_python_failures_mark_the_sample_failed(name, reason):
    cfg = config({"kind": "python", "options": {"function": fn(name)}}, timeout_s=0.3)
    out = score(cfg, "x")
    assert out.status is ScoreStatus.FAILED and out.reward == 0.0
    assert out.reason.startswith("python: ") and reason in out.reason


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="kind='nope'"):
        RewardComponentConfig(kind="nope")
    with pytest.raises(ValueError, match="options.function"):
        RewardComponentConfig(kind="python")
    with pytest.raises(ValueError, match="distinct name"):
        RewardConfig(components=[RewardComponentConfig(kind="task"), RewardComponentConfig(kind="task")])
    with pytest.raises(ValueError, match="reward.process_pool"):
        RewardConfig(process_pool=-1)
