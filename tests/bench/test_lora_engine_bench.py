"""bench.lora_engine on CPU (tiny shape): the three engines run, the unmerged one keeps no pristine copy, and the
JSON line carries every push and decode run it summarises."""

from bench import lora_engine


def test_lora_engine_bench_runs_on_cpu(capsys):
    row = lora_engine.main(["--shape", "tiny", "--rank", "4", "--batch", "4", "--prompt-len", "8",
                            "--output-len", "8", "--pushes", "2", "--repeats", "1"])
    assert row["device"] == "cpu" and row["dtype"] == "float32" and row["commit"]
    assert row["pristine_bytes"]["unmerged"] == 0 < row["pristine_bytes"]["merge"]
    assert all(len(v) == 2 and min(v) > 0 for v in row["push_runs_ms"].values())
    assert set(row["decode"]) == {"none", "merge", "unmerged"}
    assert all(d["tok_s"] > 0 and d["step_ms"] > 0 for d in row["decode"].values())
    unmerged, merge = row["push_ms"]["unmerged"], row["push_ms"]["merge"]  # medians rounded to 0.001 ms
    low, high = max(unmerged - 5e-4, 0) / (merge + 5e-4), (unmerged + 5e-4) / (merge - 5e-4)
    assert low * 0.995 <= row["unmerged_over_merge"]["push"] <= high * 1.005  # the ratio of the unrounded medians
    assert '"bench": "lora_engine"' in capsys.readouterr().out
