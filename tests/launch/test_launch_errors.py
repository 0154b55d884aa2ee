"""Every user mistake the launcher can see is one line on stderr and exit code 2, before any process starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.config.run import RunConfig
from asyncrl.run.rundir import save_config
from launch.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def past_run(path: Path, steps: int, last_step: int) -> Path:
    """A run directory as a launcher leaves it: config.json, metrics.jsonl, summary.json."""
    path.mkdir(parents=True)
    cfg = RunConfig()
    cfg.learner.steps = steps
    save_config(path, cfg)
    rows = [{"step": s, "reward_mean": 0.1 * s} for s in range(1, last_step + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"accounting": {"submitted": 1, "lost": 0}}))
    return path


def test_missing_model_path_names_model_path(capsys, tmp_path):
    err = one_line_error(capsys, ["--set", f"model.path={tmp_path / 'nope'}", "--run-dir", str(tmp_path / "r")])
    assert "model.path=" in err and "does not exist" in err
    assert not (tmp_path / "r").exists()  # nothing was created


def test_model_folder_without_a_loadable_config_names_model_path(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    err = one_line_error(capsys, ["--set", f"model.path={tmp_path / 'm'}", "--run-dir", str(tmp_path / "r")])
    assert "model.path=" in err and "transformers cannot load" in err


def test_missing_task_file_names_task_path(capsys, tmp_path):
    err = one_line_error(capsys, ["--set", "task.name=jsonl", "--set", f"task.path={tmp_path / 'p.jsonl'}",
                                  "--run-dir", str(tmp_path / "r")])
    assert "task.path=" in err and "does not exist" in err


@pytest.mark.parametrize("sets, words", [
    (["generator.rollout.environment=nosuch.envs:Calc"], ["generator.rollout.environment=", "cannot import"]),
    (["generator.rollout.environment=asyncrl.rollout.envs.tool_use:Nope"], ["has no callable 'Nope'"]),
    (["generator.rollout.environment=calculator"], ["'module:ClassName'"]),
    (["generator.rollout.environment=asyncrl.rollout.envs.tool_use:ToolUse", "reward.components=[{kind = \"environment\"}]",
      "generator.rollout.options={tools = [\"calculator\"], max_call = 2}"],
     ["generator.rollout.options of asyncrl.rollout.envs.tool_use:ToolUse", "max_call"]),
    (["generator.rollout.environment=asyncrl.rollout.envs.tool_use:ToolUse", "reward.components=[{kind = \"environment\"}]",
      "generator.rollout.options={call_reward = 0.2}"], ["call_reward_until=0"]),
    (["reward.components=[{kind = \"environment\"}]"], ["kind 'environment'", "generator.rollout.environment"]),
    (["learner.lora_rank=4", 'learner.lora_targets=["q_proj", "qkv"]'], ["learner.lora_targets", "'qkv'"]),
    (["learner.lora_rank=4", 'learner.lora_trainable=["norm", "layer_norm_x"]'],
     ["learner.lora_trainable", "'layer_norm_x'"]),
])
def test_rollout_and_lora_mistakes_are_one_line_before_anything_starts(capsys, tmp_path, sets, words):
    err = one_line_error(capsys, [x for kv in sets for x in ("--set", kv)] + ["--run-dir", str(tmp_path / "r")])
    assert all(w in err for w in words), err
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a GPU config on a host without GPUs")
def test_gpu_config_on_a_cpu_host_is_one_line(capsys, tmp_path):
    err = one_line_error(capsys, [str(ROOT / "configs" / "gpu-1.toml"), "--run-dir", str(tmp_path / "r")])
    assert "devices[0]='cuda:0'" in err and "0 GPU" in err


def test_resume_of_a_missing_directory(capsys, tmp_path):
    err = one_line_error(capsys, ["--resume", str(tmp_path / "nope")])
    assert "--resume" in err and "no such directory" in err


def test_resume_of_a_directory_that_holds_no_run(capsys, tmp_path):
    err = one_line_error(capsys, ["--resume", str(tmp_path)])
    assert "no config.json" in err


def test_run_dir_of_an_existing_run_refuses_and_points_at_resume(capsys, tmp_path):
    run = past_run(tmp_path / "run", steps=5, last_step=2)
    before = (run / "config.json").read_text()
    err = one_line_error(capsys, ["--run-dir", str(run)])
    assert f"--resume {run}" in err
    assert (run / "config.json").read_text() == before  # not rewritten


def test_resume_refuses_another_number_of_hub_shards(capsys, tmp_path):
    run = past_run(tmp_path / "run", steps=5, last_step=2)
    err = one_line_error(capsys, ["--resume", str(run), "--set", "hub.shards=2"])
    assert "hub.shards=2" in err and "has 1 hub shard(s)" in err and "drop --set hub.shards" in err


def test_resume_of_a_finished_run_says_so(capsys, tmp_path):
    run = past_run(tmp_path / "run", steps=5, last_step=5)
    err = one_line_error(capsys, ["--resume", str(run)])
    assert "finished (step 5/5)" in err and "learner.steps" in err
    assert (run / "summary.json").exists()


def test_unknown_key_is_one_line_through_the_module_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch", "--set", "learner.nope=1", "--run-dir", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "learner.nope" in proc.stderr


def test_show_config_prints_every_key_with_type_default_and_doc(capsys):
    assert main(["--show-config", str(ROOT / "configs" / "gpu-1.toml")]) == 0
    out = capsys.readouterr().out
    assert 'model.dtype = "bfloat16"    (Literal' in out and 'default "auto"' in out
    assert "learner.steps = 200    (int, default" in out
    assert "Prompts (groups) in one learner step." in out


def test_resume_of_an_unfinished_run_reuses_it_and_clears_its_old_summary(tmp_path):
    from asyncrl.run.rundir import make_run_dir

    run = past_run(tmp_path / "run", steps=5, last_step=2)
    cfg = RunConfig()
    cfg.learner.steps = 5
    assert make_run_dir(cfg, None, str(run)) == run
    assert not (run / "summary.json").exists()  # clients see a live run; the end writes a new summary
