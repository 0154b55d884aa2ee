"""bench.agentic stays alive on CPU (tiny shape): one JSON line per tool latency and prefix-cache setting, every
episode finished, and with the cache the next turn prefills only what the KV of the first lacks."""

import json
import subprocess
import sys


def test_bench_agentic_runs_on_cpu():
    out = subprocess.run(
        [sys.executable, "-m", "bench.agentic", "--shape", "tiny", "--device", "cpu", "--episodes", "8", "--group", "4",
         "--turns", "2", "--turn-tokens", "4", "--obs-tokens", "2", "--prompt-len", "32", "--tool-ms", "0,10"],
        capture_output=True, text=True, timeout=300, check=True)
    rows = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert [(r["tool_ms"], r["prefix_cache"]) for r in rows] == [(0.0, False), (0.0, True), (10.0, False), (10.0, True)]
    assert rows[0]["vs_no_tool"] == rows[1]["vs_no_tool"] == 1.0
    assert all(r["episodes"] == 8 and r["engine_rows"] == 4 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[2]["env_time_s"] >= 0.01 * 2  # two tool calls of 10 ms per episode
    off, on = rows[0], rows[1]
    assert off["history_tokens_per_turn"] == off["prefill_tokens_per_turn"] == 32 + 4 + 2  # all prefilled again
    # with the cache: turn 1's KV (32 + 4 - 1 tokens) holds two full 16-token pages; the rest is prefilled
    assert on["prefill_tokens_per_turn"] == 32 + 4 + 2 - 32 and on["prefix_cache_hit_tokens"] == 8 * 32
    assert on["vs_no_cache"]["prefill_tokens"] == round(on["prefill_tokens"] / off["prefill_tokens"], 3)
    for r in rows:  # 8 episodes x 2 turns, admitted in at least one batch a turn; every step at most 4 rows + prefills
        assert 2 <= r["prefill_batches"] <= 16 and r["decode_steps"] > 0 and 0 < r["rows_per_decode"] <= 8


def test_ragged_turns_keep_the_mean_and_the_bounds():
    from bench.agentic import longest_turn, turn_lengths

    assert turn_lengths(128, 0.0, 5).tolist() == [128] * 5
    ragged = turn_lengths(128, 0.5, 4000)
    assert ragged.min() >= 64 and ragged.max() <= longest_turn(128, 0.5) == 192
    assert len(set(ragged.tolist())) > 100 and abs(ragged.mean() - 128) < 2
    assert (turn_lengths(128, 0.5, 4000) == ragged).all()  # the same draw at every tool latency
