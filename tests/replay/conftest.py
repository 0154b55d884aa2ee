"""A live hub on a loopback port, served from a background thread (stopped after each test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig


@pytest.fixture
def start_hub() -> Iterator:
    started: list[BackgroundHub] = []

    def start(cfg: HubConfig | None = None, batch: BatchConfig | None = None, run_dir: Path | None = None) -> BackgroundHub:
        h = BackgroundHub(cfg or HubConfig(), batch or BatchConfig(prompts_per_step=2, samples_per_prompt=2), run_dir)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()
