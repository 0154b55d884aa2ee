"""bench.long_prompts writes prompt rows the jsonl task reads, each question's target its sum."""

import json

from asyncrl.task.prompt_row import parse_row
from bench import long_prompts


def test_rows_parse_and_answers_are_right(tmp_path):
    out = tmp_path / "p.jsonl"
    rows = long_prompts.rows(5, examples=3, seed=1)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for i, line in enumerate(out.read_text().splitlines()):
        row = parse_row(json.loads(line), f"line {i}")
        question = json.loads(line)["text"].rsplit("; ", 1)[-1]
        a, b = question.rstrip("=").split("+")
        assert json.loads(line)["target"] == str(int(a) + int(b))
        assert json.loads(line)["text"].count(";") == 3 and row is not None
