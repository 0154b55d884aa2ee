"""JSONL prompt source: fields, per-line n, shuffling, repeat, and errors that name the line."""

import itertools
import json

import numpy as np
import pytest

from asyncrl.records import SamplingParams
from asyncrl.task.config import TaskConfig
from asyncrl.task.source import make_prompt_source


def write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return str(path)


def test_reads_text_token_ids_target_n_and_metadata(tmp_path):
    path = write(tmp_path, [{"text": "1+1=", "target": "2"}, "",
                            {"token_ids": [1, 4, 5], "target": 7, "n": 2, "metadata": {"src": "x"}, "params": {"k": 1}}])
    cfg = TaskConfig(name="jsonl", path=path, shuffle=False, repeat=False)
    prompts = list(make_prompt_source(cfg, 4, SamplingParams()))
    assert len(prompts) == 2
    a, b = prompts
    assert a.text == "1+1=" and a.reward.target == "2" and a.n == 4 and a.metadata["line"] == 1
    assert b.token_ids.dtype == np.int32 and b.token_ids.tolist() == [1, 4, 5]
    assert b.n == 2 and b.reward.target == "7" and b.reward.params == {"k": 1} and b.metadata["src"] == "x"
    assert b.metadata["line"] == 3


def test_shuffles_each_pass_and_repeats_deterministically(tmp_path):
    path = write(tmp_path, [{"text": f"{i}=", "target": str(i)} for i in range(10)])
    cfg = TaskConfig(name="jsonl", path=path, seed=1)
    first = [p.text for p in itertools.islice(make_prompt_source(cfg, 1), 30)]
    assert first == [p.text for p in itertools.islice(make_prompt_source(cfg, 1), 30)]
    assert sorted(first[:10]) == sorted(first[10:20]) and first[:10] != first[10:20]
    assert len({p.prompt_id for p in itertools.islice(make_prompt_source(cfg, 1), 30)}) == 30


@pytest.mark.parametrize("bad,msg", [
    ("{not json", "p.jsonl:2: not valid JSON"),
    ("[1, 2]", "p.jsonl:2: expected a JSON object"),
    ({"target": "1"}, 'p.jsonl:2: give exactly one of "text" or "token_ids"'),
    ({"text": "a", "token_ids": [1]}, "p.jsonl:2: give exactly one"),
    ({"token_ids": [1, -2]}, 'p.jsonl:2: "token_ids" must be'),
    ({"text": "a", "n": 0}, 'p.jsonl:2: "n" must be an integer >= 1'),
    ({"text": "a", "answer": "1"}, "p.jsonl:2: unknown key 'answer'"),
    ({"text": "a", "metadata": [1]}, 'p.jsonl:2: "metadata" must be an object'),
])
def test_errors_name_the_line(tmp_path, bad, msg):
    path = write(tmp_path, [{"text": "ok"}, bad])
    with pytest.raises(ValueError, match=msg.replace("[", r"\[")):
        make_prompt_source(TaskConfig(name="jsonl", path=path), 1).__next__()


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ValueError, match="file not found"):
        next(make_prompt_source(TaskConfig(name="jsonl", path=str(tmp_path / "nope.jsonl")), 1))
    with pytest.raises(ValueError, match="no prompts"):
        next(make_prompt_source(TaskConfig(name="jsonl", path=write(tmp_path, [""])), 1))
