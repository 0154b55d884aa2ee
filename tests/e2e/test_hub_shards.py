"""A run whose hub is two processes (hub.shards = 2) through the launcher on CPU: it trains, a killed shard
comes back from its own journal, and a killed learner resumes without dropping or repeating a sample."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from e2e_helpers import metrics
from test_learning_loop import launch, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def wait_for_steps(run_dir: Path, steps: int, proc) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"no step {steps} (launcher rc {proc.poll()})")


def pid(run_dir: Path, name: str) -> int:
    return json.loads((run_dir / "run.json").read_text())["pids"][name]


def test_two_hub_shards_train_survive_a_killed_shard_and_resume_exactly(tmp_path):
    run_dir = tmp_path / "run"
    sets = ("hub.shards=2", "learner.steps=8", "learner.checkpoint_every=3")
    proc = launch(run_dir, *sets, wait=False)
    wait_for_steps(run_dir, 2, proc)
    os.killpg(pid(run_dir, "replay-1"), signal.SIGKILL)  # restarted by the launcher from RUN_DIR/replay-1/
    wait_for_steps(run_dir, 4, proc)
    os.killpg(pid(run_dir, "learner-0"), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "learner-0 exited" in out, out
    assert "replay-1 exited" in out, out  # it was restarted, and the run went on
    trained_before = [m["step"] for m in metrics(run_dir)]

    resumed = launch(run_dir, *sets, resume=True)
    assert resumed.returncode == 0, resumed.output
    steps = [m["step"] for m in metrics(run_dir)]
    assert sorted(set(steps)) == list(range(1, 9)) and steps[len(trained_before):][-1] == 8
    s = summary(run_dir)
    acc, shards = s["accounting"], s["hub"]["shards"]
    per_step = {m["step"]: m["samples_trained"] for m in metrics(run_dir)}  # a redone step: its last run
    assert acc["lost"] == 0 and acc["trained"] == sum(per_step.values()) == 8 * 8 * 8, (acc, per_step)
    # each shard formed half of every step, from its own journal
    assert [sh["accounting"]["trained"] for sh in shards] == [8 * 4 * 8] * 2, [sh["accounting"] for sh in shards]
    assert all((run_dir / f"replay-{k}" / "replay.log").exists() for k in range(2))
    assert not (run_dir / "replay.log").exists()
