"""The one prompt format (task JSONL files, cli submit, Client.submit dicts) and its deprecated spellings."""

from __future__ import annotations

import logging

import pytest

from asyncrl.records import SamplingParams
from asyncrl.task import prompt_row
from asyncrl.task.prompt_row import parse_row


def test_every_key_reaches_the_prompt():
    row = parse_row({"text": "1+1=", "target": 2, "n": 3, "params": {"k": 1}, "sampling": {"temperature": 0.5},
                     "metadata": {"src": "x"}, "prompt_id": "q"}, "w")
    p = row.to_prompt("id", 4, SamplingParams(max_new_tokens=9), {"line": 1})
    assert (p.prompt_id, p.n, p.text, p.reward.target, p.reward.params) == ("id", 3, "1+1=", "2", {"k": 1})
    assert (p.sampling.temperature, p.sampling.max_new_tokens) == (0.5, 9)  # the row overrides only what it names
    assert p.metadata == {"src": "x", "line": 1} and row.prompt_id == "q"


def test_deprecated_spellings_are_converted_with_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(prompt_row, "_warned", set())  # warned once per process: start afresh
    with caplog.at_level(logging.WARNING):
        row = parse_row({"prompt": "a", "reward": {"target": "1", "params": {"k": 2}}}, "w")
    assert (row.text, row.target, row.params) == ("a", "1", {"k": 2})
    assert "deprecated" in caplog.text


@pytest.mark.parametrize("obj,msg", [
    ({"text": "a", "topic": "m"}, "w: unknown key 'topic'; allowed: .* \\(put other data under \"metadata\"\\)"),
    ({"text": "a", "sampling": {"temp": 1}}, "w: \"sampling\" has unknown key 'temp'"),
    ({"text": "a", "target": True}, "w: \"target\" must be a string or a number"),
    ({"text": "a", "target": "1", "reward": {"target": "2"}}, "given both at the top level and under \"reward\""),
])
def test_mistakes_name_the_key(obj, msg):
    with pytest.raises(ValueError, match=msg):
        parse_row(obj, "w")
