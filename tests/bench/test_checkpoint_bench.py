"""bench.checkpoint runs on CPU (tiny model) and reports the stall of each background save."""

import json
import subprocess
import sys


def test_checkpoint_bench_cpu():
    out = subprocess.run([sys.executable, "-m", "bench.checkpoint", "--saves", "2"], capture_output=True,
                         text=True, timeout=240, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["bench"] == "checkpoint" and result["shape"] == "tiny" and len(result["stall_s"]) == 2
    assert all(s > 0 for s in result["stall_s"]) and all(w >= 0 for w in result["write_s"])
    assert set(result["phases_median_s"]) == {"gather_s", "stage_s"}
