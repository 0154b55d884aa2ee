"""Spawned generator body and a tiny model for the adapter-push tests (imported by the spawned children too)."""

from __future__ import annotations

from pathlib import Path

import torch
from weights_procs import fingerprint


def make_tiny_model(path: Path) -> Path:
    """A tiny random Qwen2 folder (hidden 64, 2 layers, vocab 32), as tests/learner makes it."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def run_lora_generator(endpoint: str, name: str, out_q, stop, model_path: str, targets: tuple[str, ...],
                       scale: float) -> None:
    """A torch engine that applies adapters (lora=LoraSpec) behind a WeightReceiver; reports every update's
    result and the engine's parameters (fingerprints) to the test."""
    from asyncrl.engine.torch.adapter_merge import LoraSpec
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.weights.receiver import WeightReceiver

    torch.set_num_threads(1)
    engine = TorchEngine(model_path, max_running=4, lora=LoraSpec(targets, scale))
    rx = WeightReceiver(endpoint, name, "cpu", engine, timeout_s=10.0)
    try:
        while not stop.is_set():
            result = rx.poll(0.01)
            if result is None:
                continue
            weights = {k: fingerprint(p) for k, p in engine.model.named_parameters()}
            out_q.put({"name": name, "ok": result.ok, "version": result.version, "error": result.error,
                       "weights": weights})
    finally:
        rx.close()
        engine.close()
