"""configs/gpu-1-lora.toml (issue 30's one-GPU 7B LoRA run) loads on CPU and says what it runs."""

from pathlib import Path

from asyncrl.config.run import load_run_config

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "gpu-1-lora.toml"


def test_gpu_1_lora_loads_with_lora_rank_64_and_grpo_32_x_8_x_256_on_one_gpu():
    cfg = load_run_config(CONFIG, ["model.path=/models/x"])
    assert cfg.model.path == "/models/x" and cfg.learner.algorithm == "grpo"
    assert (cfg.batch.prompts_per_step, cfg.batch.samples_per_prompt, cfg.task.max_new_tokens) == (32, 8, 256)
    assert cfg.learner.lora_rank == 64 and cfg.learner.lora_push == "adapter"
    assert cfg.learner.devices == ["cuda:0"] and cfg.generator.devices == ["cuda:0"]
    assert cfg.generator.kv_cache_tokens >= cfg.generator.max_running * cfg.task.max_new_tokens  # never the auto size


def test_gpu_1_lora_header_says_how_to_run_it():
    header = [line for line in CONFIG.read_text().splitlines() if line.startswith("#")][:12]
    text = "\n".join(header)
    assert "bench.make_model --shape 7b" in text and "python -m launch configs/gpu-1-lora.toml" in text
