"""bench.generation's RL-shaped case stays alive on CPU (tiny shape), and its workload is what it says."""

import json
import subprocess
import sys

import pytest

from bench.rl_workload import rl_workload


def test_rl_workload_groups_share_prompts_and_lengths_vary():
    w = rl_workload(groups=32, n=8, prompt_len=512, max_new=1024, vocab=1000, seed=0)
    assert len(w.prompts) == len(w.lengths) == 256 and all(len(p) == 512 for p in w.prompts)
    assert all(w.prompts[g * 8] == w.prompts[g * 8 + i] for g in range(32) for i in range(8))
    assert w.prompts[0] != w.prompts[8]
    assert all(128 <= x <= 1024 for x in w.lengths)
    s = w.summary()
    assert 0.15 < s["truncated_frac"] < 0.35 and s["mean_len"] < 900 and s["useful_tokens"] == sum(w.lengths)
    assert rl_workload(32, 8, 512, 1024, 1000, seed=0) == w  # seeded
    with pytest.raises(ValueError, match="must be >= 1"):
        rl_workload(0, 8, 512, 1024, 1000)


def test_bench_generation_rl_case_runs_on_cpu():
    out = subprocess.run(
        [sys.executable, "-m", "bench.generation", "--rl", "--shapes", "tiny", "--rl-groups", "2", "--rl-n", "2",
         "--prompt-len", "16", "--rl-max-new", "12"], capture_output=True, text=True, timeout=300, check=True)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["case"] == "rl" and line["device"] == "cpu" and line["useful_tokens"] > 0
    assert line["engine_tok_s"] > 0 and line["hf_tok_s"] > 0 and line["speedup"] > 0
