"""Held-out prompts (asyncrl.task.heldout): deterministic, n = 1, "eval-<i>", and never yielded by the
training source built with the same `heldout` count."""

from __future__ import annotations

import json
from itertools import islice

import pytest

from asyncrl.task.config import TaskConfig
from asyncrl.task.heldout import heldout_prompts
from asyncrl.task.source import make_prompt_source, task_sampling

ARITH = {"name": "basic_arithmetic",
         "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-", "*", "/"]}}


def texts(prompts):
    return [p.text for p in prompts]


def test_interface():
    cfg = TaskConfig(temperature=0.5, max_new_tokens=6)
    held = heldout_prompts(cfg, 10)
    assert [p.prompt_id for p in held] == [f"eval-{i}" for i in range(10)]
    assert all(p.n == 1 and p.sampling == task_sampling(cfg) and p.reward.target is not None for p in held)
    assert texts(held) == texts(heldout_prompts(cfg, 10)) and len(set(texts(held))) == 10
    assert heldout_prompts(cfg, 0) == []


def test_reasoning_gym_heldout_never_in_a_training_set_of_2000():
    cfg = TaskConfig(name="reasoning_gym", tasks=[ARITH], size=2000)
    held = heldout_prompts(cfg, 200)
    train = set(texts(islice(make_prompt_source(cfg, 1, heldout=200), 2000)))
    assert len(train) > 1500 and len(held) == 200 == len(set(texts(held)))
    assert not train & set(texts(held))
    assert all(p.reward.params["rg_task"] == "basic_arithmetic" for p in held)
    assert texts(held) == texts(heldout_prompts(cfg, 200))


def test_reasoning_gym_heldout_is_the_same_whatever_the_training_size():
    """The held-out set is drawn first and training skips it, so scores compare across task.size (cutting the
    held-out set to what training lacked left it only the rare, hard problems of a large training set)."""
    small, large = (TaskConfig(name="reasoning_gym", tasks=[ARITH], size=size) for size in (300, 6000))
    held = texts(heldout_prompts(small, 200))
    assert held == texts(heldout_prompts(large, 200))
    train = set(texts(islice(make_prompt_source(large, 1, heldout=200), 6000)))
    assert len(train) > 3000 and not train & set(held)
    everything = set(texts(islice(make_prompt_source(large, 1), 6000)))
    assert everything & set(held)  # without heldout the large set would train on some of them


TINY = {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                               "operators": ["+"], "allow_negation": False}}  # a few hundred questions


def test_reasoning_gym_without_enough_distinct_problems():
    with pytest.raises(ValueError, match=r"eval.prompts=1000: only \d+ of 4064"):
        heldout_prompts(TaskConfig(name="reasoning_gym", tasks=[TINY], size=3000), 1000)


def test_arithmetic_training_stream_skips_the_heldout_problems():
    cfg = TaskConfig(digits=1)  # 200 distinct problems: overlaps would show at once
    held = set(texts(heldout_prompts(cfg, 60)))
    stream = texts(islice(make_prompt_source(cfg, 1, heldout=60), 3000))
    assert not held & set(stream) and len(set(stream)) == 200 - 60
    assert set(texts(islice(make_prompt_source(cfg, 1), 3000))) >= held  # without heldout they would be trained on
    with pytest.raises(ValueError, match="hold out at most 100"):
        heldout_prompts(cfg, 101)


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_holds_out_the_last_distinct_rows(tmp_path):
    rows = [{"text": f"{i}+0=", "target": str(i)} for i in range(8)] + [{"text": "7+0=", "target": "7"}]
    cfg = TaskConfig(name="jsonl", path=write(tmp_path / "p.jsonl", rows), repeat=False)
    held = heldout_prompts(cfg, 3)
    assert texts(held) == ["5+0=", "6+0=", "7+0="] and [p.reward.target for p in held] == ["5", "6", "7"]
    train = texts(make_prompt_source(cfg, 1, heldout=3))
    assert sorted(train) == [f"{i}+0=" for i in range(5)]  # "7+0=" also left out where it repeats
    with pytest.raises(ValueError, match="every prompt of task.path"):
        make_prompt_source(cfg, 1, heldout=8)
    with pytest.raises(ValueError, match="has only 8 distinct prompts"):
        heldout_prompts(cfg, 9)


def test_eval_path_is_held_out_and_dropped_from_training(tmp_path):
    train_rows = [{"prompt": f"q{i}", "answer": i} for i in range(6)]
    eval_rows = [{"prompt": "q1", "answer": 1}, {"prompt": "e0", "answer": 0}, {"prompt": "e1", "answer": 1}]
    cfg = TaskConfig(name="dataset", path=write(tmp_path / "t.jsonl", train_rows),
                     eval_path=write(tmp_path / "e.jsonl", eval_rows), repeat=False)
    assert texts(heldout_prompts(cfg, 2)) == ["q1", "e0"]
    assert sorted(texts(make_prompt_source(cfg, 1, heldout=2))) == ["q0", "q2", "q3", "q4", "q5"]
    with pytest.raises(ValueError, match="task.eval_path=.*has only 3 distinct prompts"):
        heldout_prompts(cfg, 4)
    with pytest.raises(ValueError, match="task.eval_path applies to jsonl and dataset"):
        TaskConfig(eval_path="x.jsonl")
