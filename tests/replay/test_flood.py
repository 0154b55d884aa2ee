"""A flood of hostile frames at a live hub process costs bounded memory and it keeps serving real peers.

Bounded: 1,500 frames (~190 MB) from one authenticated loopback DEALER (a buggy or hostile peer that
holds the run secret) that never reads its replies, then one real peer's requests. The hub's peak RSS (VmHWM) must stay within a bound derived from its socket limits.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import json
from pathlib import Path

import msgpack
import pytest
import zmq

from asyncrl import records as R
from asyncrl.net.credentials import Credentials
from asyncrl.net.peer import HubPeer
from tests.doubles.run_dir import launched_run_dir

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
MAX_FRAME = 256 * 1024


def start_hub(run_dir: Path) -> tuple[subprocess.Popen, str]:
    launched_run_dir(run_dir, [f"hub.max_frame_bytes={MAX_FRAME}", "batch.prompts_per_step=1",
                               "batch.samples_per_prompt=2"], endpoints={"replay": "tcp://127.0.0.1:0"})
    cmd = [sys.executable, "-m", "services.replay", "--run-dir", str(run_dir), "--name", "replay"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, proc.stderr.read()  # type: ignore[union-attr]
    return proc, json.loads(line)["endpoint"]


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def hostile(rng: random.Random, i: int) -> bytes:
    kind = i % 5
    if kind == 0:  # random bytes, some beyond MAXMSGSIZE (the transport drops those connections)
        return rng.randbytes(rng.randrange(1, 3 * MAX_FRAME))
    if kind == 1:  # valid msgpack that builds ~70x its size in objects
        n = MAX_FRAME - 64
        return b"\x83\xa1v\x01\xa1t\xa9Heartbeat\xa1b\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    if kind == 2:  # deep nesting inside a free-form field
        deep = functools.reduce(lambda a, _: [a], range(rng.randrange(100, 900)), [])
        return msgpack.packb({"v": R.SCHEMA_VERSION, "t": "Heartbeat", "b": {"service": "g", "name": "x", "info": {"d": deep}}})
    if kind == 3:  # well-formed envelope, absurd body
        return msgpack.packb({"v": R.SCHEMA_VERSION, "t": rng.choice(["SampleBatch", "ScoredIds", "Lease"]),
                              "b": {"samples": [rng.randbytes(64)] * 100}})
    return rng.randbytes(rng.randrange(1, 64))


def test_a_flood_of_random_frames_costs_bounded_memory_and_the_hub_keeps_serving(tmp_path):
    proc, endpoint = start_hub(tmp_path)
    ctx = zmq.Context()
    flood = ctx.socket(zmq.DEALER)
    try:
        client = Credentials.from_run_dir(tmp_path, "client")
        with HubPeer(endpoint, "probe", timeout_s=20, credentials=client) as peer:
            peer.request(R.StatsRequest())  # warm: imports and first allocations done
        base = rss_kb(proc.pid, "VmRSS")
        flood.setsockopt(zmq.LINGER, 0)
        Credentials.from_run_dir(tmp_path, "generator").apply(flood, "flood", endpoint)
        flood.setsockopt(zmq.SNDTIMEO, 20_000)  # a blocked send fails the test instead of hanging it
        flood.connect(endpoint)
        rng = random.Random(14)
        for i in range(1500):
            flood.send(hostile(rng, i))
        with HubPeer(endpoint, "real", timeout_s=30, credentials=client) as peer:
            ack = peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id="ok", n=2, text="q")]))
            assert ack.ok and ack.info["prompt_ids"] == ["ok"]
            stats = peer.request(R.StatsRequest()).counters
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        peak_mb = (rss_kb(proc.pid, "VmHWM") - base) / 1024
        # queued: <= RCVHWM frames of <= 2 x MAX_FRAME per connection; built: <= 128 MB per frame walked
        assert peak_mb < 400, f"hub peak RSS grew {peak_mb:.0f} MB during the flood"
        print(f"flood: peak RSS +{peak_mb:.0f} MB, rejected {stats['rejected']}")
        assert stats["rejected_frames"] >= 200, stats["rejected"]  # the rest: dropped with oversize connections
        assert stats["rejected"].get("too_deep", 0) > 0 and stats["hub"]["internal_errors"] == 0, stats["rejected"]
        assert stats["accounting"]["lost"] == 0
    finally:
        flood.close()
        ctx.term()
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


def test_queued_frames_per_connection_are_bounded_by_socket_options():
    """What a flood can park in the hub's receive queue is RCVHWM frames of at most MAXMSGSIZE bytes per
    connection. At 4d2de4a that was 100,000 x 128 MB (the 22 GB OOM); now it is a few frames."""
    from asyncrl.replay.config import BatchConfig, HubConfig
    from asyncrl.replay.hub import RECV_BUDGET_BYTES, Hub

    cfg = HubConfig()
    hub = Hub(cfg, BatchConfig(), None, "tcp://127.0.0.1:0")
    try:
        queued = hub.sock.getsockopt(zmq.RCVHWM) * hub.sock.getsockopt(zmq.MAXMSGSIZE)
        assert 0 < queued <= max(RECV_BUDGET_BYTES, 4 * 2 * cfg.max_frame_bytes)
    finally:
        hub.close()
