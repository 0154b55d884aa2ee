"""Assemble a generator process: engine + tokenizer + hub peer + weight receiver -> GeneratorWorker.

From the generator's own config and the model's; the few values of other sections it needs (the group size,
the LoRA adapters the engine applies) are handed in by services/generator.py, which reads the run config."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from asyncrl.engine.protocol import Engine
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.generator.config import GeneratorConfig
from asyncrl.models.config import ModelConfig, resolve_model_path
from asyncrl.net.credentials import Credentials
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.environment import load_environment
from asyncrl.rollout.multi_turn import MultiTurn
from asyncrl.rollout.protocol import Rollout
from asyncrl.rollout.single_turn import SingleTurn
from asyncrl.net.hub_shards import hub_endpoints
from asyncrl.net.sharded_peer import hub_peer
from asyncrl.observe.timeline import Timeline
from asyncrl.weights.receiver import WeightReceiver


log = logging.getLogger("asyncrl.generator.build")

CPU_THREADS = 1
"""torch threads of a generator on CPU: small decode steps, where threads cost more than they give (and the learner
shares the cores). Deterministic mode's learner-side engine scores with the same count: a CPU GEMM's float
reductions depend on it."""


def build_engine(gen: GeneratorConfig, model: ModelConfig, device: str, model_path: str,
                 lora: LoraSpec | None = None, run_dir: str | Path | None = None) -> Engine:
    """`lora`: the adapters the torch engine applies itself (adapter_merge.py; None: every push is whole weights).
    `run_dir`: where the base holder publishes the shared base image (generator.share_base)."""
    if gen.engine == "sglang":
        from asyncrl.engine.sglang.engine import SGLangEngine

        from asyncrl.weights.transport import join_as_receiver

        return SGLangEngine(gen.sglang, logits_fp32=model.logits_fp32, lora=lora,  # adapters: sglang/lora.py
                            adapter_channel=join_as_receiver, weights_dtype=gen.weights_dtype)
    from asyncrl.engine.torch.engine import TorchEngine

    kv = gen.kv_cache_tokens
    image = None
    if gen.share_base:
        if run_dir is None:
            raise ValueError("generator.share_base needs the run directory, where the base holder publishes the image")
        from asyncrl.weights.base_image import open_image

        image = open_image(run_dir, device)  # waits for the holder
        log.info("computing with the shared base image: %d matrices, %.1f MB not held by this process", len(image),
                 sum(t.numel() * t.element_size() for t in image.values()) / 1e6)
    engine = TorchEngine(model_path, device=device, dtype=model.dtype, max_running=gen.max_running,
                         num_kv_blocks=-(-kv // KV_BLOCK_SIZE) if kv else None, kv_block_size=KV_BLOCK_SIZE,
                         seed=gen.seed, deterministic=gen.deterministic,
                         prefix_cache=gen.prefix_cache and not gen.deterministic,
                         residual_fp32=model.residual_fp32, logits_fp32=model.logits_fp32, lora=lora,
                         weights_dtype=gen.weights_dtype, base_image=image)
    if engine.fp8 is not None:
        log.info("fp8 weights: %d projections (%.1f MB of e4m3 images), %d kept in %s%s", len(engine.fp8.linears),
                 engine.fp8.nbytes / 1e6, len(engine.fp8.skipped), model.dtype,
                 f" ({', '.join(engine.fp8.skipped)})" if engine.fp8.skipped else "")
    return engine


KV_BLOCK_SIZE = 16  # tokens per KV block of the torch engine


def build_generator(
    gen: GeneratorConfig, model: ModelConfig, name: str, device: str, endpoints: dict[str, str], run_dir: str | Path,
    *, group_size: int, lora: LoraSpec | None = None,
) -> tuple[GeneratorWorker, list[Callable[[], None]]]:
    """`group_size`: samples per prompt (batch.samples_per_prompt); `lora`: as build_engine's."""
    from transformers import AutoTokenizer

    model_path = resolve_model_path(model)
    engine = build_engine(gen, model, device, model_path, lora, run_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    hub = hub_peer(hub_endpoints(endpoints), name, timeout_s=10.0)  # loopback: a healthy hub answers in ms
    weights = WeightReceiver(endpoints["weights"], name, device, engine, credentials=Credentials.from_env(),
                             ipc_staging=gen.ipc_staging)
    timeline = Timeline(run_dir, name)
    rollout = build_rollout(gen.rollout, tokenizer, engine.limits().vocab_size)
    worker = GeneratorWorker(
        name=name, engine=engine, hub=hub, tokenizer=tokenizer,
        max_running=gen.rollout.episodes(gen.max_running),  # samples held at once
        weights=weights, seed=gen.seed,
        heartbeat_s=gen.heartbeat_s, timeline=timeline,
        group_size=group_size, rollout=rollout,
    )
    return worker, [timeline.close, weights.close, hub.close, rollout.close, engine.close]


def build_rollout(cfg: RolloutConfig, tokenizer: object, vocab_size: int | None) -> Rollout:
    """The configured rollout: SingleTurn, or MultiTurn over generator.rollout.environment."""
    if not cfg.multi_turn:
        return SingleTurn()
    return MultiTurn(cfg, load_environment(cfg.environment), tokenizer, vocab_size)
