"""The hub's Prometheus exporter: accounting and rejected/refused counters, scraped over loopback HTTP."""

from __future__ import annotations

import time

import pytest
import zmq
from replay_fakes import prompt

from asyncrl import records as R
from asyncrl.net.peer import HubPeer
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig
from tests.doubles.scraper import scrape

pytestmark = pytest.mark.timeout(60)


def scrape_until(url: str, key: tuple, value: float, wait_s: float = 20.0) -> dict:
    """The first scrape where `key` has `value` (the hub refreshes its values about once a second)."""
    deadline = time.monotonic() + wait_s
    while True:
        got = scrape(url)
        if got.get(key) == value or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_hub_exports_accounting_and_rejections():
    h = BackgroundHub(HubConfig(), BatchConfig(prompts_per_step=2, samples_per_prompt=2), metrics_port=0)
    ctx = zmq.Context()
    try:
        url = h.hub.exporter.url
        with HubPeer(h.endpoint, "t") as peer:
            peer.request(R.SubmitPrompts(prompts=[prompt("", 2) for _ in range(3)]))
            peer.request(R.WeightVersion(version=2))
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.connect(h.endpoint)
        bad.send_multipart([b"", b"\xc1 not msgpack"])
        assert bad.poll(10_000)  # the hub answers a rejected frame with an error
        got = scrape_until(url, ("asyncrl_hub_rejected_frames_total", ()), 1)
        assert got[("asyncrl_hub_rejected_frames_total", ())] == 1
        assert got[("asyncrl_hub_rejected_frames_by_kind_total", (("kind", "not_msgpack"),))] == 1
        assert got[("asyncrl_hub_samples_submitted_total", ())] == 6  # 3 prompts x 2 samples
        assert got[("asyncrl_hub_samples_in_flight", ())] == 6
        assert got[("asyncrl_hub_samples_lost", ())] == 0
        assert got[("asyncrl_hub_queued_prompts", ())] == 3
        assert got[("asyncrl_hub_policy_version", ())] == 2
        assert got[("asyncrl_hub_refused_requests_total", ())] == 0
        assert got[("asyncrl_hub_requests_total", ())] >= 2
    finally:
        ctx.destroy(linger=0)
        h.stop()


def test_hub_without_metrics_port_has_no_exporter():
    h = BackgroundHub(HubConfig(), BatchConfig(prompts_per_step=2, samples_per_prompt=2))
    try:
        assert h.hub.exporter is None
    finally:
        h.stop()
