"""The hub's control plane: only peers with the run's secret connect; each role may send only its
messages; only the lessee returns or fills a lease; lease ids are unguessable; a dead generator's leases
come back at once (PeerDown). A real hub (ZAP, sockets) on loopback in a background thread."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
import zmq

from asyncrl import records as R
from asyncrl.net.credentials import Credentials, RunSecret, is_local, server_pair
from asyncrl.net.peer import HubError, HubPeer, HubRefused
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.hub import Hub
from asyncrl.net.zap import ZapHandler


@pytest.fixture
def secured(tmp_path):
    secret = RunSecret.ensure(tmp_path)
    hub = BackgroundHub(HubConfig(), BatchConfig(prompts_per_step=1, samples_per_prompt=2), secret=secret)
    peers: list[HubPeer] = []

    def peer(role: str, name: str, key: bytes = secret, timeout_s: float = 10.0) -> HubPeer:
        p = HubPeer(hub.endpoint, name, timeout_s=timeout_s, credentials=Credentials.for_role(key, role), reconnect_s=0)
        peers.append(p)
        return p

    yield hub, peer
    for p in peers:
        p.close()
    hub.stop()


def sample(pid: str, i: int, reward_bait: float = 1.0) -> R.Sample:
    return R.Sample(prompt_id=pid, sample_index=i, prompt_token_ids=np.arange(3, dtype=np.int32),
                    response_token_ids=np.arange(4, dtype=np.int32), logprobs=np.full(4, -reward_bait, np.float32),
                    versions=np.zeros(4, np.int32), finish_reason=R.FinishReason.LENGTH)


def stats(peer: HubPeer) -> dict:
    return peer.request(R.StatsRequest()).counters


def test_secret_file_is_private_and_stable(tmp_path):
    a = RunSecret.ensure(tmp_path)
    assert RunSecret.ensure(tmp_path) == a and len(a) == 32
    assert stat.S_IMODE(os.stat(tmp_path / "secret").st_mode) == 0o600
    os.chmod(tmp_path / "secret", 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        RunSecret.load(tmp_path)


def test_peers_without_the_secret_get_nothing_and_are_counted(secured):
    hub, peer = secured
    stranger = peer("launcher", "x", key=b"\x00" * 32, timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(HubRefused, match=r"refused this peer's credentials.*x, role launcher"):
        stranger.request(R.Shutdown(reason="hostile"))
    assert time.monotonic() - t0 < 10  # said at once, not after the 30 s timeout
    assert stranger.monitor is None  # the outcome is known: no monitor left to fill (tests/net/test_peer_monitor.py)
    with HubPeer(hub.endpoint, "anon", timeout_s=30, credentials=None, reconnect_s=0) as anon:
        anon.credentials = None
        with pytest.raises(HubRefused, match="refused the handshake.*role none"):
            anon.request(R.WeightVersion(version=1_000_000))
    s = stats(peer("client", "c"))
    assert s["auth"]["refused"] >= 1 and not s["shutdown"] and s["policy_version"] == 0


@pytest.mark.parametrize("role, msg", [
    ("client", R.Shutdown(reason="x")), ("generator", R.Shutdown(reason="x")), ("reward", R.Shutdown(reason="x")),
    ("client", R.WeightVersion(version=1_000_000)), ("generator", R.WeightVersion(version=1_000_000)),
    ("generator", R.ScoredIds(scores=[R.ScoreResult(prompt_id="p", sample_index=0, reward=1.0)])),
    ("client", R.CommitStep(step=1, policy_version=1)), ("client", R.FatalError(service="x", name="x", reason="x")),
    ("reward", R.SubmitPrompts(prompts=[R.Prompt(prompt_id="p", n=2, text="x")])),
    ("client", R.PeerDown(service="generator", name="generator-0")),
])
def test_each_role_is_refused_what_it_may_not_send(secured, role, msg):
    _, peer = secured
    with pytest.raises(HubError, match=f"role '{role}' may not send {type(msg).__name__}"):
        peer(role, f"{role}-0").request(msg)
    s = stats(peer("launcher", "launcher"))
    assert s["hub"]["refused_requests"] == 1 and not s["shutdown"] and s["policy_version"] == 0


def test_only_the_lessee_fills_or_returns_its_lease_and_ids_are_unguessable(secured):
    _, peer = secured
    peer("client", "c").request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"p{i}", n=2, text="x") for i in range(2)]))
    g0, g1 = peer("generator", "generator-0"), peer("generator", "generator-1")
    with pytest.raises(HubError, match="not this connection's name"):
        g1.request(R.LeaseRequest(generator="generator-0", max_prompts=1, wait_s=0))
    a = g0.request(R.LeaseRequest(generator="generator-0", max_prompts=1, wait_s=0))
    b = g1.request(R.LeaseRequest(generator="generator-1", max_prompts=1, wait_s=0))
    assert a.lease_id != b.lease_id and all(len(x.lease_id.split("-", 1)[1]) == 16 for x in (a, b))
    pid = a.prompts[0].prompt_id
    with pytest.raises(HubError, match="held by another generator"):
        g1.request(R.ReturnPrompts(lease_id=a.lease_id, prompt_ids=[pid]))
    with pytest.raises(HubError, match="held by another generator"):
        g1.request(R.SampleBatch(lease_id=a.lease_id, samples=[sample(pid, 0), sample(pid, 1)]))
    guessed = g1.request(R.ReturnPrompts(lease_id=a.lease_id.split("-")[0], prompt_ids=[pid]))  # "L1": no such lease
    assert guessed.info["returned"] == 0
    assert g0.request(R.SampleBatch(lease_id=a.lease_id, samples=[sample(pid, 0), sample(pid, 1)])).ok
    s = stats(peer("launcher", "launcher"))
    assert s["states"]["generated"] == 2 and s["hub"]["refused_requests"] == 3


def test_peer_down_gives_a_dead_generators_leases_back_at_once(secured):
    _, peer = secured
    peer("client", "c").request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"p{i}", n=2, text="x") for i in range(2)]))
    gen = peer("generator", "generator-0")
    assert len(gen.request(R.LeaseRequest(generator="generator-0", max_prompts=2, wait_s=0)).prompts) == 2
    launcher = peer("launcher", "launcher")
    assert stats(launcher)["leased_prompts"] == 2  # lease_timeout_s is 300 s: without PeerDown they stay out
    assert launcher.request(R.PeerDown(service="generator", name="generator-0", reason="exit -9")).info["returned"] == 2
    s = stats(launcher)
    assert s["leases"] == 0 and s["queued_prompts"] == 2 and s["accounting"]["lost"] == 0


def test_curve_is_used_off_loopback_and_refuses_wrong_keys(tmp_path):
    """CURVE set up as for a non-loopback bind, exercised over loopback only (no traffic leaves the host)."""
    secret = RunSecret.ensure(tmp_path)
    ctx = zmq.Context()
    zap = ZapHandler(ctx, secret)
    server, good, bad = (ctx.socket(t) for t in (zmq.ROUTER, zmq.DEALER, zmq.DEALER))
    for sock in (server, good, bad):
        sock.linger = 0
    try:
        zap.secure(server, "tcp://192.0.2.1:5555")  # what the hub does for an address that is not loopback
        assert server.curve_server and not server.plain_server
        port = server.bind_to_random_port("tcp://127.0.0.1")
        Credentials.for_role(secret, "reward").apply(good, "reward-0", "tcp://192.0.2.1:5555")
        stranger = Credentials.for_role(b"\x01" * 32, "reward")  # a client key of no role of this run ...
        stranger.apply(bad, "reward-1", "tcp://192.0.2.1:5555")
        bad.curve_serverkey = server_pair(secret)[0]  # ... with the right server key
        for sock in (good, bad):
            sock.connect(f"tcp://127.0.0.1:{port}")
            sock.send(b"hello")
        assert server.poll(5000)
        frames = server.recv_multipart(copy=False)
        assert frames[-1].bytes == b"hello" and frames[-1].get("User-Id") == "reward"
        assert frames[-1].get("X-Name") == "reward-0"
        assert not server.poll(500) and zap.counters["refused"] >= 1
    finally:
        for sock in (server, good, bad):
            sock.close(linger=0)
        zap.close()
        ctx.term()


def test_hub_without_secret_refuses_to_bind_off_loopback():
    assert is_local("tcp://127.0.0.1:1") and is_local("ipc:///tmp/x") and not is_local("tcp://0.0.0.0:1")
    assert not is_local("tcp://*:1")
    with pytest.raises(ValueError, match="needs the run secret"):
        Hub(HubConfig(log=False), BatchConfig(), endpoint="tcp://0.0.0.0:0")
