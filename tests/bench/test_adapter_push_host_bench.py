"""bench.adapter_push_host runs on CPU: the 7B push's tensor count into an unmerged engine, fp32 and bf16, by the
named and the bucket path."""

import json
import subprocess
import sys


def test_prints_one_record_with_the_7b_push_shape(tmp_path):
    prof = tmp_path / "push.prof"
    out = subprocess.run([sys.executable, "-m", "bench.adapter_push_host", "--pushes", "2", "--repeat", "1",
                          "--profile", str(prof)], capture_output=True, text=True, timeout=180, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    assert row["bench"] == "adapter_push_host" and row["tensors"] == 28 * 7 * 2 + 28 * 2 + 1
    assert (row["fp32_buckets"], row["bf16_buckets"]) == (3, 2) and row["fp32_bytes"] == 2 * row["bf16_bytes"]
    assert row["fp32_ms"] > 0 and row["bf16_ms"] > 0 and prof.stat().st_size > 0
    assert row["bf16_bucket_ms"] > 0 and row["fp32_bucket_ms"] > 0 and row["bucket_over_named"] > 0
    assert row["plan_hits"] > 0  # the bucket path replayed plans (each layout planned on its first bucket)
