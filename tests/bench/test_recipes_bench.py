"""bench.recipes collect on a run directory written by hand: the table's numbers, the restatement check, and the one
file that packs each run's records (what a device call brings back)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

from bench import recipes


def write_run(out: Path, name: str, launched: float) -> None:
    run = out / name
    run.mkdir(parents=True)
    (out / f"{name}.json").write_text(json.dumps({"name": name, "config": "c.toml", "overrides": ["task.seed=1"],
                                                  "pid": 2**22 + 7, "launched": launched}))  # no such process
    (out / f"{name}.log").write_text("run finished\n")
    steps = [{"step": s, "reward_mean": s / 10, "eval_prompts_in_batch": 0, "samples_trained": 4,
              "tool_calls": 0 if s <= 10 else 2} for s in range(1, 21)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps) + '{"step": 21, "rew')  # cut last
    rounds = [{"step": 0, "pass@1": 0.1, "wall_time": launched + 30.0},
              {"step": 20, "pass@1": 0.6, "wall_time": launched + 90.0, "tool_calls_mean": 0.5}]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rounds))
    answers = [{"question": "Calculate -95 / 95.", "response": "(-95 / 95)", "score": 1.0},  # restated, scored
               {"question": "Calculate 3 + 4.", "response": "3 + 4", "score": 0.0},  # restated, not scored
               {"question": "Calculate 3 + 4.", "response": "3 + 4 = 7", "score": 1.0}]
    (run / "eval_responses.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    (run / "summary.json").write_text(json.dumps({"accounting": {"lost": 0}}))


def test_collect_summarizes_and_packs_each_run(tmp_path, monkeypatch):
    monkeypatch.setattr(recipes, "_plot", lambda run, png: None)
    out, dest = tmp_path / "out", tmp_path / "dest"
    write_run(out, "a1", launched=1000.0)
    [r] = recipes.collect(out, wait_s=0.0, dest=dest)
    assert [(e["step"], e["pass@1"], e["wall_s"]) for e in r["evals"]] == [(0, 0.1, 30.0), (20, 0.6, 90.0)]
    assert r["steps"] == 20 and abs(r["reward_first10"] - 0.55) < 1e-9 and abs(r["reward_last10"] - 1.55) < 1e-9
    assert r["tool_calls_first10"] == 0.0 and r["tool_calls_last10"] == 0.5  # 2 calls in each batch of 4 episodes
    assert [e["tool_calls_mean"] for e in r["evals"]] == [None, 0.5]
    assert r["restated_and_scored"] == {"restated": 2, "restated_scored": 1}
    assert r["accounting"] == {"lost": 0} and r["eval_prompts_in_batches"] == 0
    assert json.loads((dest / "results.json").read_text())[0]["name"] == "a1"
    md = (dest / "results.md").read_text()
    assert "| 20 | 90 | 0.600 |" in md and md.rstrip().count("| 0.500 |") == 1 and "last 10 0.500" in md
    with tarfile.open(dest / "runs.tgz") as tar:
        assert sorted(tar.getnames()) == ["a1.log", "a1/eval.jsonl", "a1/eval_responses.jsonl", "a1/metrics.jsonl",
                                          "a1/summary.json"]


def test_collect_writes_snapshots_while_runs_go_on(tmp_path, monkeypatch):
    """--every: while a run is alive, --dest is rewritten (quietly) every S seconds, so a cut-off call still
    brings back its last snapshot; the final write comes when the wait ends."""
    monkeypatch.setattr(recipes, "_plot", lambda run, png: None)
    out, dest = tmp_path / "out", tmp_path / "dest"
    write_run(out, "a1", launched=1000.0)
    meta = json.loads((out / "a1.json").read_text())
    (out / "a1.json").write_text(json.dumps({**meta, "pid": os.getpid()}))  # alive for the whole wait
    writes = []
    real = recipes._write

    def spy(out_, dest_, results, quiet=False):
        writes.append((quiet, (dest_ / "results.json").exists()))
        real(out_, dest_, results, quiet)

    monkeypatch.setattr(recipes, "_write", spy)
    recipes.collect(out, wait_s=0.6, dest=dest, every_s=0.1)
    assert len(writes) >= 3 and all(q for q, _ in writes[:-1]) and writes[-1][0] is False
    assert writes[1][1]  # the first snapshot was on disk before the wait ended
    assert (dest / "runs.tgz").exists()
