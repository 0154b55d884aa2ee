"""bench.agentic stays alive on CPU (tiny shape): one JSON line per tool latency, every episode finished."""

import json
import subprocess
import sys


def test_bench_agentic_runs_on_cpu():
    out = subprocess.run(
        [sys.executable, "-m", "bench.agentic", "--shape", "tiny", "--device", "cpu", "--episodes", "8", "--group", "4",
         "--turns", "2", "--turn-tokens", "4", "--obs-tokens", "2", "--prompt-len", "8", "--tool-ms", "0,10"],
        capture_output=True, text=True, timeout=300, check=True)
    rows = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert [r["tool_ms"] for r in rows] == [0.0, 10.0] and rows[0]["vs_no_tool"] == 1.0
    assert all(r["episodes"] == 8 and r["engine_rows"] == 4 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[1]["env_time_s"] >= 0.01 * 2  # two tool calls of 10 ms per episode
    assert rows[0]["prefill_tokens_per_turn"] == 8 + 4 + 2  # the whole history is prefilled again on turn 2
