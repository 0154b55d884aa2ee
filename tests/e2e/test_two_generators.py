"""What issue 32 asks to run on several GPUs, on the CPU: a LoRA run whose adapter-only pushes reach two generators
(gloo standing in for NCCL) that both roll out with FP8 weights (re-quantized after every push; on the CPU the
same e4m3 products in fp32) and play multi-turn episodes (configs/multiturn-cpu.toml)."""

from __future__ import annotations

import pytest

from e2e_helpers import ROOT, launch, metrics, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SETS = ["learner.steps=4", "learner.lora_rank=8", "generator.count=2", "generator.max_running=16",
        "generator.heartbeat_s=0.2", "model.dtype=bfloat16", "generator.weights_dtype=fp8"]


def test_lora_adapter_pushes_reach_two_fp8_generators_playing_multi_turn_episodes(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *SETS, config=ROOT / "configs" / "multiturn-cpu.toml")
    assert proc.returncode == 0, proc.output
    s = summary(run_dir)
    ms = metrics(run_dir)
    assert [m["step"] for m in ms] == [1, 2, 3, 4]
    assert all(m["push"]["kind"] == "adapter" for m in ms)  # A, B and the norms only, after the joins' base
    assert any(m["turns_mean"] > 1.0 for m in ms) and all(m["episode_failed"] == {} for m in ms)
    for g in ("generator-0", "generator-1"):  # both engines made fp8 images: qkv, o, gate_up, down of 2 layers
        assert "fp8 weights: 8 projections" in (run_dir / "logs" / f"{g}.log").read_text()
    for g in ("generator-0", "generator-1"):
        stats = s["hub"]["peers"][g]["stats"]
        assert stats["samples_sent"] > 0 and stats["weight_version"] == 4, (g, stats)  # every push reached both
    acc = s["accounting"]
    assert acc["lost"] == 0 and acc["failed"] == 0 and acc["trained"] == sum(m["samples_trained"] for m in ms), acc
