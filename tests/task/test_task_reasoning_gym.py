"""reasoning-gym as a task source: deterministic, weighted mixes, prompt_format, the chat template, what
the prompts carry for the scorer, and errors that name the key (also through launch.task_check)."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice

import msgpack
import pytest
from transformers import AutoTokenizer

from asyncrl.config.loader import ConfigError, from_dict
from asyncrl.config.run import RunConfig
from asyncrl.task import reasoning_gym
from asyncrl.task.config import TaskConfig
from asyncrl.task.source import make_prompt_source
from launch.task_check import check_task_source

ARITH = {"name": "basic_arithmetic", "weight": 1,
         "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-", "*", "/"]}}
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIALS = ["<pad>", "<|user|>", "<|assistant|>", "<|end|>"]


def rg(*tasks, **kw) -> TaskConfig:
    return TaskConfig(name="reasoning_gym", tasks=list(tasks) or [ARITH], **{"size": 300, **kw})


def first(cfg, k=5, **kw):
    return list(islice(make_prompt_source(cfg, 4, **kw), k))


def test_deterministic_and_seeded():
    a = [(p.prompt_id, p.text, p.reward.target) for p in first(rg(), 50)]
    assert a == [(p.prompt_id, p.text, p.reward.target) for p in first(rg(), 50)]
    assert a != [(p.prompt_id, p.text, p.reward.target) for p in first(rg(seed=1), 50)]
    ordered = first(rg(shuffle=False), 3)
    assert [p.prompt_id for p in ordered] == ["reasoning_gym-0-0", "reasoning_gym-0-1", "reasoning_gym-0-2"]
    assert all(p.n == 4 and p.text.startswith("Calculate ") for p in ordered)
    assert len(list(make_prompt_source(rg(size=20, repeat=False), 1))) == 20


def test_two_task_seeds_are_two_problem_sets_not_one_shifted():
    """reasoning-gym draws problem i of a dataset from Random(dataset seed + i): seeds s and s + 1 handed to it
    as they are give one set shifted by one (the H200 runs of 2026-12-05 had the same 300 held-out problems under
    seeds 0 and 1). mix_seed spreads task.seed; seed 0 keeps its problems."""
    def questions(seed):
        return [p.question for p in reasoning_gym.problems(rg(), reasoning_gym.mix_seed(seed), 400)]

    zero, one, two = questions(0), questions(1), questions(2)
    assert zero == [p.question for p in reasoning_gym.problems(rg(), 0, 400)]  # unchanged for seed 0
    assert zero[1:] != one[:-1] and one[1:] != two[:-1]  # no shift of one another
    assert sum(a == b for a, b in zip(zero, one)) < 40 and len(set(zero) & set(two)) < 200


def test_prompts_carry_what_the_scorer_needs_in_plain_types():
    p = first(rg(shuffle=False), 1)[0]
    assert p.reward.params == {"rg_task": "basic_arithmetic", "rg_config": ARITH["config"], "rg_seed": 1,
                               "rg_size": 300, "rg_index": 0}
    assert msgpack.unpackb(msgpack.packb(p.reward.params)) == p.reward.params
    entry = reasoning_gym.entry(p.reward.params)
    assert entry["question"] == p.text and entry["answer"] == p.reward.target
    assert reasoning_gym.score(p.reward.target, p.reward.params, p.reward.target) == 1.0


def test_weighted_mix():
    cfg = rg(ARITH, {"name": "gsm_symbolic", "weight": 3}, size=400)
    counts = Counter(p.metadata["rg_task"] for p in first(cfg, 400))
    assert 250 < counts["gsm_symbolic"] < 350 and counts["gsm_symbolic"] + counts["basic_arithmetic"] == 400


def test_prompt_format_keeps_other_braces():
    cfg = rg(prompt_format="Q: {question}\nPut the answer in \\boxed{}.", shuffle=False)
    p = first(cfg, 1)[0]
    assert p.text.startswith("Q: Calculate ") and p.text.endswith(".\nPut the answer in \\boxed{}.")
    with pytest.raises(ValueError, match="has no {question}"):
        rg(prompt_format="no question here")
    with pytest.raises(ValueError, match="prompt_format applies to"):
        TaskConfig(prompt_format="x {question}")


def _tokenizer(path):
    """A character-level tokenizer with TEMPLATE as its chat template, saved at `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + [chr(c) for c in range(32, 127)] + ["\n"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(SPECIALS)
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", chat_template=TEMPLATE).save_pretrained(path)


def test_chat_template(tmp_path):
    _tokenizer(tmp_path)
    cfg = rg(chat_template=True, shuffle=False, prompt_format="{question}\nAnswer:")
    p = first(cfg, 1, tokenizer_path=str(tmp_path))[0]
    plain = first(rg(shuffle=False, prompt_format="{question}\nAnswer:"), 1)[0]
    spelled = "".join(AutoTokenizer.from_pretrained(tmp_path).convert_ids_to_tokens(p.token_ids.tolist()))
    assert p.text is None and spelled == f"<|user|>{plain.text}<|end|><|assistant|>"
    assert p.reward == plain.reward


def test_response_prefix_is_filled_from_the_problem_and_ends_the_prompt(tmp_path):
    _tokenizer(tmp_path)
    cfg = rg(chat_template=True, shuffle=False, response_prefix="{expression} =")
    p = first(cfg, 1, tokenizer_path=str(tmp_path))[0]
    plain = first(rg(shuffle=False), 1)[0]
    expression = plain.text.removeprefix("Calculate ").removesuffix(".")
    spelled = "".join(AutoTokenizer.from_pretrained(tmp_path).convert_ids_to_tokens(p.token_ids.tolist()))
    assert spelled == f"<|user|>{plain.text}<|end|><|assistant|>{expression} ="
    assert p.reward == plain.reward  # the target is the problem's answer, not shifted by the prefix
    without = first(rg(shuffle=False, response_prefix="Q was {question} ->"), 1)[0]
    assert without.text == f"{plain.text}Q was {plain.text} ->"  # no template: the prefix ends the text


def test_response_prefix_mistakes_stop_the_launch():
    with pytest.raises(ValueError, match=r"names \{answer_text\}, which reasoning-gym's basic_arithmetic problems lack; "
                                         r"their fields: .*expression"):
        make_prompt_source(rg(response_prefix="{answer_text} ="), 1)
    cfg = from_dict(RunConfig, {"task": {"name": "reasoning_gym", "tasks": [ARITH], "size": 10,
                                         "response_prefix": "{nope}"}})
    with pytest.raises(ConfigError, match="task.response_prefix='{nope}' names"):
        check_task_source(cfg)
    with pytest.raises(ValueError, match="response_prefix applies to"):
        TaskConfig(response_prefix="The answer is")


@pytest.mark.parametrize("task,msg", [
    ({"name": "basic_arithmetc"}, r"task.tasks\[0\].name='basic_arithmetc': no such reasoning-gym task; close matches: basic_arithmetic"),
    ({"name": "basic_arithmetic", "config": {"max_term": 3}}, r"task.tasks\[0\].config.max_term: basic_arithmetic has no such option"),
    ({"name": "basic_arithmetic", "config": {"min_terms": 0}}, r"reasoning-gym's basic_arithmetic rejects it \(AssertionError: min_terms"),
])
def test_bad_task_name_or_option(task, msg):
    with pytest.raises(ValueError, match=msg):
        make_prompt_source(rg(task), 1)
    cfg = from_dict(RunConfig, {"task": {"name": "reasoning_gym", "tasks": [task]}})
    with pytest.raises(ConfigError, match=msg):
        check_task_source(cfg)


def test_config_mistakes_name_the_key():
    for data, msg in [({"name": "reasoning_gym"}, "needs task.tasks"),
                      ({"name": "reasoning_gym", "tasks": [{"name": "a", "config": {"seed": 1}}]}, "config.seed is set by task.seed"),
                      ({"name": "reasoning_gym", "tasks": [{"name": "a", "weight": 0}]}, "weight=0.0 must be"),
                      ({"name": "reasoning_gym", "tasks": [{"name": "a"}, {"name": "a"}]}, "names 'a' twice"),
                      ({"name": "reasoning_gym", "tasks": [{"name": "a"}], "size": 0}, "task.size=0"),
                      ({"tasks": [{"name": "a"}]}, "task.tasks is set but")]:
        with pytest.raises(ConfigError, match=msg):
            from_dict(RunConfig, {"task": data})


def test_a_missing_package_is_one_line(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_rg(name, *args, **kw):
        if name == "reasoning_gym":
            raise ImportError(name)
        return real(name, *args, **kw)
    monkeypatch.setattr(builtins, "__import__", no_rg)
    with pytest.raises(ValueError, match="needs the reasoning-gym package: pip install reasoning-gym"):
        make_prompt_source(rg(), 1)


def test_config_round_trips_through_json():
    cfg = from_dict(RunConfig, {"task": {"name": "reasoning_gym", "tasks": [ARITH], "size": 10}})
    from asyncrl.config.loader import to_dict

    again = from_dict(RunConfig, json.loads(json.dumps(to_dict(cfg))))
    assert again.task == cfg.task and again.task.tasks[0].weight == 1.0
    check_task_source(again, heldout=5)
