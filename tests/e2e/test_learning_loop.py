"""The whole system through the launcher on CPU: the embedded default learns, and a killed learner resumes
without dropping or repeating a sample (beside a killed hub shard). The run's other modes: test_run_modes.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asyncrl.models.config import ModelConfig, resolve_model_path
from e2e_helpers import launch, metrics, run_pid, summary, wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_embedded_default_learns_and_changes_every_parameter(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "learner.steps=80", "learner.checkpoint_every=40", "eval.every=40", "eval.prompts=64",
                  "eval.k=8")
    assert proc.returncode == 0, proc.output
    ms = metrics(run_dir)
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 40, 80] and all(e["prompts"] == 64 and e["missing"] == 0 for e in evals)
    # Held out, at the training temperature: 0.31-0.34 -> 0.44-0.47 in two runs of 32 prompts (2026-12-05); the
    # standard error of the difference over 64 x 8 samples is ~0.03
    assert evals[-1]["mean@k"] > evals[0]["mean@k"] + 0.03, [e["mean@k"] for e in evals]
    assert all(m["eval_prompts_in_batch"] == 0 for m in ms)  # held-out prompts never reach a batch
    assert ms[-1]["eval"]["step"] == 80 and "eval pass@1" in proc.output
    assert summary(run_dir)["eval"]["first"]["step"] == 0 and summary(run_dir)["eval"]["last"]["step"] == 80
    assert [m["step"] for m in ms] == list(range(1, 81))
    rewards = [m["reward_mean"] for m in ms]
    first, last = sum(rewards[:16]) / 16, sum(rewards[-16:]) / 16
    assert last > first + 0.05, f"reward did not rise: first fifth {first:.3f}, last fifth {last:.3f}"
    before = load_file(Path(resolve_model_path(ModelConfig())) / "model.safetensors")
    after = load_file(run_dir / "export" / "model.safetensors")
    assert set(before) == set(after)
    unchanged = [k for k in before if torch.equal(before[k], after[k].to(before[k].dtype))]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    acc = summary(run_dir)["accounting"]
    assert acc["lost"] == 0 and acc["trained"] == sum(m["samples_trained"] for m in ms)
    for key in ("step", "policy_version", "reward_mean", "samples_trained", "tokens_generated",
                "staleness_mean", "staleness_max", "time_s", "hub"):
        assert key in ms[-1], key
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    run = json.loads((run_dir / "run.json").read_text())
    assert {"replay", "weights"} <= set(run["endpoints"])
    assert {n.split("-")[0] for n in run["pids"]} == {"replay", "generator", "reward", "learner"}


def test_killed_learner_resumes_without_dropping_or_repeating(tmp_path):
    """With the hub as two shards (hub.shards = 2, each its own process and journal): shard 1 is killed after
    step 2 and restarted by the launcher from RUN_DIR/replay-1/; the learner is killed after step 4 (one step past
    the checkpoint at 3); the resumed run trains steps 4-8 again from the same batches: every step once, nothing
    lost, each sample counted once, each shard half of every step."""
    run_dir = tmp_path / "run"
    sets = ("hub.shards=2", "learner.steps=8", "learner.checkpoint_every=3")
    proc = launch(run_dir, *sets, wait=False)
    wait_for_step(run_dir, 2, timeout_s=300, proc=proc)
    os.killpg(run_pid(run_dir, "replay-1"), signal.SIGKILL)
    wait_for_step(run_dir, 4, timeout_s=300, proc=proc)
    os.killpg(run_pid(run_dir, "learner-0"), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "learner-0 exited" in out, out
    assert "replay-1 exited" in out, out  # and was restarted: the run went on to step 4
    trained_before = [m["step"] for m in metrics(run_dir)]
    resumed = launch(run_dir, *sets, resume=True)
    assert resumed.returncode == 0, resumed.output
    steps = [m["step"] for m in metrics(run_dir)]
    redone = steps[len(trained_before):]
    assert redone[0] <= 4 and redone[-1] == 8 and sorted(set(steps)) == list(range(1, 9))
    s = summary(run_dir)
    acc = s["accounting"]
    per_step = {m["step"]: m["samples_trained"] for m in metrics(run_dir)}  # a redone step: its last run
    assert acc["lost"] == 0 and acc["trained"] == sum(per_step.values()) == 8 * 8 * 8, (acc, per_step)
    assert [sh["accounting"]["trained"] for sh in s["hub"]["shards"]] == [8 * 4 * 8] * 2
    assert all((run_dir / f"replay-{k}" / "replay.log").exists() for k in range(2))


