"""The launcher supervises: a crashed generator is restarted and rejoins with a full weight push;
Ctrl-C stops the run cleanly after a final checkpoint."""

from __future__ import annotations

import json
import os
import signal

import pytest

from e2e_helpers import launch, metrics, summary, wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]




def test_crashed_generator_is_restarted_and_gets_weights(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "learner.steps=10", wait=False)
    wait_for_step(run_dir, 3)
    pid = json.loads((run_dir / "run.json").read_text())["pids"]["generator-0"]
    os.killpg(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    s = summary(run_dir)
    assert s["restarts"]["generator-0"] == 1 and s["accounting"]["lost"] == 0
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, 11))
    new_pid = json.loads((run_dir / "run.json").read_text())["pids"]["generator-0"]
    assert new_pid != pid
    late = [m for m in metrics(run_dir) if m["step"] >= 6]
    assert all(int(max(m["staleness_hist"], key=int)) <= 1 for m in late)  # fresh weights after the rejoin


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for a shell script's background job (`launch ... &`)


def test_ctrl_c_checkpoints_and_stops(tmp_path):
    """SIGINT stops the run after a checkpoint, even for a launcher that inherited SIGINT ignored."""
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "learner.steps=200", "learner.checkpoint_every=100", "hub.max_uncommitted_steps=201",
                  wait=False, preexec_fn=_sigint_ignored)
    wait_for_step(run_dir, 2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    last = metrics(run_dir)[-1]["step"]
    assert 2 <= last < 200
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("."))
    assert ckpts and ckpts[-1].endswith(str(last)), (ckpts, last)
    assert summary(run_dir)["accounting"]["lost"] == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; only its parent has not reaped it
        return f.read().split(")")[-1].split()[0] != "Z"
