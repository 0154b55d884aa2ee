"""bench.learner stays alive on CPU: the tiny shape, a small batch, one JSON line with its context."""

import json
import subprocess
import sys


def test_bench_learner_cpu_prints_one_json_line():
    out = subprocess.run(
        [sys.executable, "-m", "bench.learner", "--shape", "tiny", "--samples", "16", "--tokens", "15",
         "--steps", "1", "--warmup", "0"], capture_output=True, text=True, timeout=300, check=True)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["bench"] == "learner" and line["device"] == "cpu" and line["attn"] == "asyncrl_varlen"
    assert line["tokens_per_step"] == 16 * (8 + 15 - 1)
    assert line["step_s"] > 0 and line["hf_fwd_bwd_s"] > 0 and line["mfu"] is None  # no peak known for a CPU
