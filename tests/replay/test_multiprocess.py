"""The hub service process and small peer processes exchanging real messages over loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl import records as R
from asyncrl.net.credentials import Credentials, RunSecret
from asyncrl.net.peer import HubPeer
from tests.doubles.run_dir import launched_run_dir

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(__file__).with_name("replay_peers.py")
SETS = ["batch.prompts_per_step=2", "batch.samples_per_prompt=2", "generator.max_running=2", "hub.max_staleness=1"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def start_service(run_dir: Path) -> tuple[subprocess.Popen, str]:
    _, endpoints = launched_run_dir(run_dir, SETS)
    cmd = [sys.executable, "-m", "services.replay", "--run-dir", str(run_dir), "--name", "replay"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, proc.stderr.read()  # type: ignore[union-attr]
    assert json.loads(line)["endpoint"] == endpoints["replay"]  # bound where run.json says
    return proc, endpoints["replay"]


def stop_service(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, proc.stderr.read()  # type: ignore[union-attr]


def test_service_and_peer_processes_train_every_sample_once(tmp_path):
    proc, endpoint = start_service(tmp_path)
    try:
        assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":0")
        steps = 5
        secret = RunSecret.load(tmp_path)  # the service made it; peers prove a role with it
        launcher = Credentials.for_role(secret, "launcher")
        with HubPeer(endpoint, "feeder", credentials=launcher) as feeder:
            feeder.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"q{i}", n=2, text="x") for i in range(2 * steps)]))
        roles = {"generator": 2 * steps, "scorer": 4 * steps, "learner": steps}
        kinds = {"generator": "generator", "scorer": "reward", "learner": "learner"}
        peers = [subprocess.Popen([sys.executable, str(PEERS), role, endpoint, str(count)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**env(), **Credentials.for_role(secret, kinds[role]).to_env()})
                 for role, count in roles.items()]
        results = {}
        for p in peers:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            results.update(json.loads(out))
        assert results == {"generator": {"prompts": 10}, "scorer": {"samples": 20}, "learner": {"trained": 20}}
        with HubPeer(endpoint, "check", credentials=launcher) as peer:
            before = peer.request(R.StatsRequest()).counters
        assert before["accounting"]["trained"] == 20 and before["accounting"]["lost"] == 0
        assert before["policy_version"] == steps and set(before["peers"]) >= {"generator-0", "scorer-0", "learner-0"}
    finally:
        stop_service(proc)
    proc, endpoint = start_service(tmp_path)  # restart on the same run directory
    try:
        with HubPeer(endpoint, "check", credentials=launcher) as peer:
            after = peer.request(R.StatsRequest()).counters
        for key in ("states", "transitions", "events", "policy_version", "next_step", "committed_step"):
            assert after[key] == before[key], key
    finally:
        stop_service(proc)
