"""Supervision under faults, with real launcher runs of the embedded default on CPU:
the generator SIGKILLed six times and the hub once in one run; a reward function that always raises
(the watchdog ends the run with the reason); a SIGKILLed launcher (no child outlives it, the learner still
checkpoints); the learner's rendezvous store listening on loopback only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import launch, metrics, summary, wait_for_step, what_the_run_said
from test_supervision import _alive

sys.path.insert(0, str(Path(__file__).parents[1] / "learner"))
from test_tcp_store import listening  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

FAST = ["hub.lease_timeout_s=300", "launch.restart_window_s=600", "generator.heartbeat_s=0.5",
        "reward.heartbeat_s=0.5"]


def pids(run_dir: Path) -> dict[str, int]:
    return json.loads((run_dir / "run.json").read_text())["pids"]


def kill(run_dir: Path, name: str) -> int:
    pid = pids(run_dir)[name]
    os.killpg(pid, signal.SIGKILL)
    return pid


def wait_new_pid(run_dir: Path, name: str, old: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while pids(run_dir)[name] == old:
        if time.monotonic() >= deadline or proc.poll() is not None:
            raise AssertionError(f"{name} was not restarted\n{what_the_run_said(run_dir, proc)}")
        time.sleep(0.1)


def test_generator_killed_six_times_and_hub_once_the_run_finishes_by_itself(tmp_path):
    run_dir = tmp_path / "run"
    steps = 24
    # the default budget (3 crashes in a row): the run trains between kills, so each restart starts it afresh;
    # only the backoff is shortened (1 s by default), to keep the suite quick
    proc = launch(run_dir, f"learner.steps={steps}", "learner.checkpoint_every=4", "launch.restart_backoff_s=0.2",
                  *FAST, wait=False)
    try:
        for i in range(6):
            wait_for_step(run_dir, 2 + 3 * i, proc=proc)
            if i == 0:  # a local run: the hub is restarted on its Unix socket (a SIGKILL leaves the file behind)
                assert json.loads((run_dir / "run.json").read_text())["endpoints"]["replay"] == \
                    f"ipc://{run_dir.resolve()}/replay.sock"
            wait_new_pid(run_dir, "generator-0", kill(run_dir, "generator-0"), proc)
            if i == 2:
                wait_new_pid(run_dir, "replay", kill(run_dir, "replay"), proc)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    s = summary(run_dir)
    assert s["accounting"]["lost"] == 0, s["accounting"]
    assert s["restarts"]["generator-0"] == 6 and s["restarts"]["replay"] == 1, s["restarts"]
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, steps + 1))  # every step trained once
    assert s["hub"]["leases"] == 0  # nothing held by the dead generators at the end


def test_reward_that_always_raises_ends_the_run_with_the_reason(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    (tmp_path / "bad_reward.py").write_text(
        "def score(response, spec):\n    raise RuntimeError('broken reward for every sample')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    component = '[{kind="python", options={function="bad_reward:score"}}]'
    proc = launch(run_dir, "learner.steps=5", f"reward.components={component}", wait=False)  # no stall timeout: ends at once
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, out
    assert "every sample failed" in out and "broken reward for every sample" in out, out[-3000:]
    s = summary(run_dir)
    assert s["accounting"]["failed"] > 0 and s["accounting"]["trained"] == 0 and s["accounting"]["lost"] == 0


def test_killed_launcher_leaves_no_orphans_and_a_final_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "learner.steps=200", "learner.checkpoint_every=100", "hub.max_uncommitted_steps=201",
                  wait=False)
    wait_for_step(run_dir, 3, proc=proc)
    master_port = json.loads((run_dir / "run.json").read_text())["master_port"]
    assert listening(master_port) == ["0100007F"]  # the learner's rendezvous store: loopback only
    names = {pid: name for name, pid in pids(run_dir).items()}
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60
    alive = list(names)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.2)
    assert not alive, f"children outlived the launcher: {[names[p] for p in alive]}"
    last = metrics(run_dir)[-1]["step"]
    steps = sorted(int(p.name.rsplit("-", 1)[-1]) for p in (run_dir / "checkpoints").iterdir()
                   if p.name.startswith("step-"))
    # Every reported step is kept; a step trained after the last metrics line (the stop can land between
    # training and reporting) is kept too.
    assert steps and steps[-1] in (last, last + 1), (steps, last)
