"""bench.engine_host runs on CPU and prints its record."""

import json
import subprocess
import sys


def test_prints_one_record():
    out = subprocess.run([sys.executable, "-m", "bench.engine_host", "--rows", "16", "--number", "5"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    assert row["bench"] == "engine_host" and row["rows"] == 16 and row["stage_ms"] > 0
