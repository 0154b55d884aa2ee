"""The embedded default learns on a two-node Ray cluster (launch.placement = "ray"), on CPU, loopback only.

The nodes are 127.0.0.2 (head) and 127.0.0.3: two raylets on this machine, each with its own node address,
so the hub and learner bind one address and the generator and reward worker on the other node connect to
it. Not 127.0.0.1: `ray.init` replaces a head address of 127.0.0.1 / localhost by this machine's routable
address before connecting (docs/ray.md). Ray's own processes are kept off the network (usage reports off,
HTTP through a proxy on a closed loopback port, so its cloud-metadata probe goes nowhere; no autoscaler
monitor; gloo on `lo`), and a watcher samples every socket of every process under this test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_sockets import SocketWatch

ray_cluster = pytest.importorskip("ray.cluster_utils", reason="needs ray: pip install -e '.[test]'")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(sys.platform != "linux", reason="nodes on 127.0.0.2/3 and /proc sockets: Linux")]
ROOT = Path(__file__).resolve().parents[2]
HEAD, WORKER = "127.0.0.2", "127.0.0.3"
CLOSED = "http://127.0.0.1:9"  # the discard port: normally refused at once; loopback whatever listens
OFFLINE = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_USAGE_STATS_REPORT_URL": CLOSED, "http_proxy": CLOSED,
           "https_proxy": CLOSED, "HTTP_PROXY": CLOSED, "HTTPS_PROXY": CLOSED, "no_proxy": "127.0.0.0/8,localhost",
           "NO_PROXY": "127.0.0.0/8,localhost", "GLOO_SOCKET_IFNAME": "lo"}


@pytest.fixture
def cluster(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)  # Ray's processes and the launcher inherit it
    cluster = ray_cluster.Cluster(initialize_head=True, head_node_args={
        "node_ip_address": HEAD, "num_cpus": 2, "include_dashboard": False, "no_monitor": True})
    try:
        cluster.add_node(node_ip_address=WORKER, num_cpus=2)
        yield cluster
    finally:
        cluster.shutdown()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_embedded_default_learns_across_two_ray_nodes_on_loopback(cluster, tmp_path):
    """...and a generator killed on the other node is restarted there and rejoins (a full weight push)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch", "--run-dir", str(run_dir), "--set", "launch.progress=false",
           "--set", "launch.placement=ray", "--set", f"launch.ray_address={cluster.address}",
           "--set", "learner.steps=80", "--set", "learner.checkpoint_every=40", "--set", "eval.every=0"]
    with SocketWatch(os.getpid()) as watch:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_step(run_dir, 20, proc)
            os.killpg(json.loads((run_dir / "run.json").read_text())["pids"]["generator-0"], signal.SIGKILL)
            out, _ = proc.communicate(timeout=200)
        finally:
            proc.kill()
    assert proc.returncode == 0, out

    ms = metrics(run_dir)
    assert [m["step"] for m in ms] == list(range(1, 81))
    rewards = [m["reward_mean"] for m in ms]
    first, last = sum(rewards[:16]) / 16, sum(rewards[-16:]) / 16
    assert last > first + 0.05, f"reward did not rise: first fifth {first:.3f}, last fifth {last:.3f}"

    run = json.loads((run_dir / "run.json").read_text())
    at = run["addresses"]
    assert at == {"replay": HEAD, "learner-0": HEAD, "generator-0": WORKER, "reward-0": WORKER}, at
    assert run["endpoints"]["replay"].startswith(f"tcp://{HEAD}:")  # each binds its node's address
    assert run["endpoints"]["weights"].startswith(f"tcp://{HEAD}:")
    summary = json.loads((run_dir / "summary.json").read_text())
    acc = summary["accounting"]
    assert acc["lost"] == 0 and acc["trained"] == sum(m["samples_trained"] for m in ms)
    assert summary["restarts"]["generator-0"] == 1 and summary["exit_codes"]["generator-0"] == 0
    # pushes crossed the nodes to the restarted generator (killed at step >= 20); its last heartbeat may
    # come before the run's last push or two, so not exactly 80
    assert 20 < summary["hub"]["peers"]["generator-0"]["stats"]["weight_version"] <= 80
    assert (run_dir / "export" / "model.safetensors").exists()

    assert not watch.foreign, "sockets off loopback:\n" + "\n".join(map(str, watch.foreign))
    services = {(name, address) for name, address in watch.listening if " -m services." in name}
    everywhere = [(name, address) for name, address in services if address.startswith(("0.0.0.0:", ":::"))]
    assert services and not everywhere, "services listening on every interface:\n" + "\n".join(map(str, everywhere))


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    path = run_dir / "metrics.jsonl"
    while not (path.exists() and path.read_text().count("\n") >= step):  # whole lines only
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"no step {step} within {timeout_s:.0f} s"
        time.sleep(0.2)
