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


def test_bench_learner_lora_against_full_runs_both_and_compares():
    out = subprocess.run(
        [sys.executable, "-m", "bench.learner", "--shape", "tiny", "--samples", "16", "--tokens", "15",
         "--steps", "1", "--warmup", "0", "--skip-hf", "--lora-rank", "4", "0", "--checkpoint"],
        capture_output=True, text=True, timeout=300, check=True)
    lora, full, compare = (json.loads(x) for x in out.stdout.strip().splitlines()[-3:])
    assert (lora["lora_rank"], full["lora_rank"]) == (4, 0) and lora["model"] == full["model"]
    assert 0 < lora["trained_params"] < full["trained_params"]
    assert lora["adapter_push_bytes"] == 4 * lora["trained_params"] and "adapter_push_bytes" not in full
    assert lora["adapter_gather_ms"] > 0 and lora["checkpoint_stall_s"] > 0 and lora["checkpoint_stall_traced_s"] > 0
    assert lora["checkpoint_bytes"]["model.pt"] < full["checkpoint_bytes"]["model.pt"]  # adapters + norms only
    assert compare["bench"] == "learner_lora_compare" and compare["ranks"] == [4, 0]
    assert compare["step_s"] == {"4": lora["step_s"], "0": full["step_s"]}
    assert compare["over_full"]["4"]["step_s"] == round(lora["step_s"] / full["step_s"], 3)


def test_child_arguments_replace_rank_model_and_shape():
    from bench.learner import child_argv

    argv = ["--shape", "1.5b", "--lora-rank", "64", "0", "--skip-hf", "--model=/x", "--steps", "2"]
    assert child_argv(argv, 64, "/m", "1.5b") == ["--skip-hf", "--steps", "2", "--lora-rank", "64", "--model", "/m",
                                                  "--shape", "1.5b"]
