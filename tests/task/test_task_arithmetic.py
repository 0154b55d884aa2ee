"""The arithmetic task: seeded prompt stream, answers, verifier; and make_prompt_source."""

import itertools
import random

import pytest

from asyncrl.records import SamplingParams
from asyncrl.task.arithmetic import extract_answer, make_problem, verify
from asyncrl.task.config import TaskConfig
from asyncrl.task.source import make_prompt_source


def test_problems_are_correct_and_within_the_digit_range():
    rng = random.Random(1)
    for _ in range(500):
        p = make_problem(rng, 3, "+-")
        a, op, b = p.text[:-1].partition("+") if "+" in p.text else p.text[:-1].partition("-")
        assert p.text.endswith("=") and 1 <= len(a) <= 3 and 1 <= len(b) <= 3
        assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert not (len(a) > 1 and a.startswith("0"))


def test_source_is_seeded_and_carries_target_n_and_sampling():
    sampling = SamplingParams(temperature=0.7, max_new_tokens=6)
    first = list(itertools.islice(make_prompt_source(TaskConfig(seed=3), 4, sampling), 50))
    again = list(itertools.islice(make_prompt_source(TaskConfig(seed=3), 4, sampling), 50))
    other = list(itertools.islice(make_prompt_source(TaskConfig(seed=4), 4, sampling), 50))
    assert [p.text for p in first] == [p.text for p in again] != [p.text for p in other]
    assert len({p.prompt_id for p in first}) == 50
    p = first[0]
    assert p.n == 4 and p.sampling == sampling and p.sampling is not sampling and p.token_ids is None
    assert verify(p.reward.target, p.reward.target) == 1.0
    default = next(make_prompt_source(TaskConfig(max_new_tokens=5, temperature=0.5), 2))
    assert default.sampling.max_new_tokens == 5 and default.sampling.temperature == 0.5


def test_ops_restrict_the_operators():
    texts = [p.text for p in itertools.islice(make_prompt_source(TaskConfig(ops="+"), 1), 100)]
    assert all("+" in t and "-" not in t for t in texts)


@pytest.mark.parametrize("response,target,expected", [
    ("85", "85", 1.0), ("85<eos>", "85", 1.0), (" 85 <eos>12", "85", 1.0), ("<bos>85<eos><pad><pad>", "85", 1.0),
    ("-11<eos>", "-11", 1.0), ("085", "85", 0.0), ("8 5", "85", 0.0), ("", "85", 0.0), ("<eos>85", "85", 0.0),
])
def test_verifier(response, target, expected):
    assert verify(response, target) == expected


def test_extract_answer_cuts_at_eos():
    assert extract_answer("12<eos>34") == "12"


@pytest.mark.parametrize("kw,msg", [({"digits": 0}, "task.digits"), ({"ops": "*"}, "task.ops"),
                                    ({"name": "gsm"}, "task.name"), ({"name": "jsonl"}, "task.path"),
                                    ({"max_new_tokens": 0}, "task.max_new_tokens")])
def test_config_validation_names_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TaskConfig(**kw)
