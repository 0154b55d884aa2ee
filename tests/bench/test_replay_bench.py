"""bench.replay stays runnable: a tiny run through a real hub process with authenticated peers."""

import json
import subprocess
import sys


def test_replay_bench_small_run():
    out = subprocess.run([sys.executable, "-m", "bench.replay", "--steps", "3", "--prompts-per-step", "4", "--n", "2",
                          "--tokens", "16", "--lease-prompts", "2"], capture_output=True, text=True, timeout=240,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["bench"] == "replay" and result["samples"] == 3 * 4 * 2 and result["samples_per_s"] > 0
