"""bench.hub_core stays runnable: HubCore fed bench.replay's messages in process, with each journal mode."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("log", ["none", "sync", "background"])
def test_hub_core_bench_small_run(log):
    out = subprocess.run([sys.executable, "-m", "bench.hub_core", "--steps", "3", "--prompts-per-step", "4", "--n", "2",
                          "--tokens", "16", "--repeat", "1", "--log", log],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["bench"] == "hub_core" and result["context"]["log"] == log and result["us_per_sample"] > 0
    assert set(result["by_kind"]) == {"submit", "lease", "samples", "score_request", "scored_ids", "batch", "version",
                                      "commit"}
    assert all(v > 0 for v in result["decode_us_per_sample"].values())


def test_an_odd_step_is_refused_with_the_reason():
    got = subprocess.run([sys.executable, "-m", "bench.hub_core", "--prompts-per-step", "5"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 2 and "even number" in got.stderr
