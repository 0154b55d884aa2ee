"""bench.logprob_agreement --lora-rank on CPU (tiny shape): the adapter push gives the merged push's weights bit
for bit and agrees with the learner's LoraLinear forward as well as the merged push does, the adapters kept unmerged
at least as well; a wrong merge shows."""

import json
import math
import sys

import pytest

from asyncrl.engine.torch import adapter_merge
from bench import logprob_agreement

ARGV = ["bench.logprob_agreement", "--shape", "tiny", "--prompts", "4", "--prompt-len", "16", "--output-len", "16",
        "--lora-rank", "8", "--lora-alpha", "16"]


def run_bench(monkeypatch, capsys) -> dict:
    monkeypatch.setattr(sys, "argv", ARGV)
    logprob_agreement.main()
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_adapter_push_agrees_as_well_as_the_merged_push(monkeypatch, capsys):
    row = run_bench(monkeypatch, capsys)
    adapter, full = row["adapter_push"], row["full_push"]
    assert row["device"] == "cpu" and row["lora_rank"] == 8 and row["dtype"] == "bfloat16"
    assert row["weights_bitwise_equal"] and row["weights_differing_count"] == 0 and row["same_tokens"]
    for key in ("mean_abs_delta", "p99_abs_delta", "max_abs_delta"):
        assert math.isfinite(adapter[key]) and math.isfinite(full[key])
        assert adapter[key] <= 1.5 * full[key] + 1e-6, (key, adapter[key], full[key])
    assert row["lora_shift_mean_abs"] > 10 * adapter["mean_abs_delta"]  # the adapters move the model past the noise
    assert adapter["push_bytes"] < full["push_bytes"] / 10
    # Kept unmerged (generator.lora_apply = "unmerged"), the engine computes the learner's own form: it agrees at
    # least as well as either merged engine (on this CPU, exactly), from the same bytes as the adapter push.
    unmerged = row["unmerged_push"]
    for key in ("mean_abs_delta", "p99_abs_delta", "max_abs_delta"):
        assert unmerged[key] <= full[key], (key, unmerged[key], full[key])
    assert unmerged["push_bytes"] == adapter["push_bytes"]


def test_a_merge_without_the_scale_shows(monkeypatch, capsys):
    def unscaled(out, weight, lora_a, lora_b, scale):
        out.copy_(adapter_merge.merge(weight, lora_a, lora_b, 1.0))

    monkeypatch.setattr(adapter_merge, "merge_into", unscaled)
    row = run_bench(monkeypatch, capsys)
    assert not row["weights_bitwise_equal"] and row["weights_differing_count"] == 14  # 7 projections x 2 layers
    assert row["adapter_push"]["mean_abs_delta"] > 3 * row["full_push"]["mean_abs_delta"]
    assert row["adapter_over_full"]["mean"] == pytest.approx(
        row["adapter_push"]["mean_abs_delta"] / row["full_push"]["mean_abs_delta"])
