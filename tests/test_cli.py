"""asyncrl.cli on a run directory that is missing, not a run, or finished: one line at once, never a hang."""

import json
import subprocess
import sys
from pathlib import Path

from asyncrl.cli import main

ROOT = Path(__file__).resolve().parents[1]


def finished_run(path: Path) -> Path:
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"endpoints": {"replay": "tcp://127.0.0.1:9"}}))
    (path / "summary.json").write_text(json.dumps({"accounting": {"trained": 64, "lost": 0},
                                                   "hub": {"policy_version": 20}}))
    return path


def one_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_stats_and_submit_on_a_missing_run_dir(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"1+1="\n')
    assert "no such directory" in one_line(capsys, ["stats", "--run-dir", str(tmp_path / "nope")])
    assert "no such directory" in one_line(capsys, ["submit", str(prompts), "--run-dir", str(tmp_path / "nope")])


def test_a_directory_without_run_json_is_not_a_run(capsys, tmp_path):
    assert "no run.json" in one_line(capsys, ["stats", "--run-dir", str(tmp_path)])


def test_submit_to_a_finished_run_says_it_finished(capsys, tmp_path):
    run = finished_run(tmp_path / "run")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"1+1="\n')
    err = one_line(capsys, ["submit", str(prompts), "--run-dir", str(run)])
    assert "finished" in err and "--resume" in err


def test_stats_of_a_finished_run_prints_its_final_counters(capsys, tmp_path):
    run = finished_run(tmp_path / "run")
    assert main(["stats", "--run-dir", str(run)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["finished"] is True and line["policy_version"] == 20 and line["accounting"]["trained"] == 64


def test_missing_prompt_file_is_one_line(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"endpoints": {"replay": "tcp://127.0.0.1:9"}}))
    assert "no such prompt file" in one_line(capsys, ["submit", str(tmp_path / "nope.jsonl"), "--run-dir", str(run)])


def test_module_entry_point_answers_in_one_line(tmp_path):
    run = finished_run(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "submit", str(tmp_path / "x.jsonl"), "--run-dir", str(run)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr


def test_a_bad_prompt_line_is_one_line_naming_it(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"endpoints": {"replay": "tcp://127.0.0.1:9"}}))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"1+1="\n\n{not json\n')
    assert "p.jsonl:3: not valid JSON" in one_line(capsys, ["submit", str(prompts), "--run-dir", str(run)])
