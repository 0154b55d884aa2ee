"""Reference answers of submitted prompts: derived by the task, demanded by kinds that need one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl.reward.reference import RewardComponentRef, complete_reference, run_reward_components
from asyncrl.task.arithmetic import solve

TASK = [RewardComponentRef(name="task", kind="task")]
EXACT = [RewardComponentRef(name="em", kind="exact_match")]


def prompt(text=None, target=None, ids=None):
    return R.Prompt(prompt_id="p", n=1, text=text, token_ids=ids, reward=R.RewardSpec(target=target))


@pytest.mark.parametrize("text,answer", [("12+34=", "46"), (" 7 - 40 = ", "-33"), ("0+0=", "0"),
                                         ("12+34", None), ("2*3=", None), ("what is 2+2?", None)])
def test_solve_answers_only_task_problems(text, answer):
    assert solve(text) == answer


def test_task_reward_fills_in_the_answer_of_its_own_problems():
    assert complete_reference(prompt("12+34="), TASK, 0).reward.target == "46"
    assert complete_reference(prompt("12+34=", target="7"), TASK, 0).reward.target == "7"  # a given target wins
    assert complete_reference(prompt("12+34="), None, 0).reward.target == "46"  # unknown run: derive anyway


def test_a_prompt_that_cannot_be_scored_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match=r"prompt 3 \('hello'\) has no reference answer and reward component 'task' "
                                         r"\(task\) needs one: pass target="):
        complete_reference(prompt("hello"), TASK, 3)
    with pytest.raises(ValueError, match="'em' \\(exact_match\\) needs one"):
        complete_reference(prompt("12+34="), EXACT, 0)  # only the task kind computes answers
    with pytest.raises(ValueError, match="3 token ids"):
        complete_reference(prompt(ids=np.array([1, 2, 3], np.int32)), TASK, 0)


def test_kinds_without_a_target_and_unknown_runs_pass_prompts_through():
    regex = [RewardComponentRef(name="fmt", kind="regex")]
    assert complete_reference(prompt("hello"), regex, 0).reward.target is None
    assert complete_reference(prompt("hello"), None, 0).reward.target is None


def test_components_come_from_the_run_config(tmp_path):
    assert run_reward_components(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"reward": {"components": [
        {"kind": "task", "name": ""}, {"kind": "regex", "name": "fmt"}]}}))
    assert run_reward_components(tmp_path) == [RewardComponentRef("task", "task"), RewardComponentRef("fmt", "regex")]
