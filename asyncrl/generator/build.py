"""Assemble a generator process: engine + tokenizer + hub peer + weight receiver -> GeneratorWorker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from asyncrl.config.model import resolve_model_path
from asyncrl.config.run import RunConfig
from asyncrl.net.credentials import Credentials
from asyncrl.engine.protocol import Engine
from asyncrl.generator.worker import GeneratorWorker
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.environment import load_environment
from asyncrl.rollout.multi_turn import MultiTurn
from asyncrl.rollout.protocol import Rollout
from asyncrl.rollout.single_turn import SingleTurn
from asyncrl.net.peer import HubPeer
from asyncrl.observe.timeline import Timeline
from asyncrl.weights.receiver import WeightReceiver


CPU_THREADS = 1
"""torch threads of a generator on CPU: small decode steps, where threads cost more than they give (and the learner
shares the cores). Deterministic mode's learner-side engine scores with the same count: a CPU GEMM's float
reductions depend on it."""


def build_engine(cfg: RunConfig, device: str, model_path: str) -> Engine:
    if cfg.generator.engine == "sglang":
        from asyncrl.engine.sglang.engine import SGLangEngine

        return SGLangEngine(cfg.generator.sglang, logits_fp32=cfg.model.logits_fp32)
    from asyncrl.engine.torch.adapter_merge import LoraSpec
    from asyncrl.engine.torch.engine import TorchEngine

    gen, kv, ln = cfg.generator, cfg.generator.kv_cache_tokens, cfg.learner
    adapters = cfg.resolved_lora_push == "adapter"  # the engine applies LoRA adapters itself (adapter_merge.py)
    lora = LoraSpec(tuple(ln.lora_targets), ln.lora_alpha / ln.lora_rank) if adapters else None
    return TorchEngine(model_path, device=device, dtype=cfg.model.dtype, max_running=gen.max_running,
                       num_kv_blocks=-(-kv // KV_BLOCK_SIZE) if kv else None, kv_block_size=KV_BLOCK_SIZE,
                       seed=gen.seed, deterministic=gen.deterministic,
                       prefix_cache=gen.prefix_cache and not gen.deterministic,
                       residual_fp32=cfg.model.residual_fp32, logits_fp32=cfg.model.logits_fp32, lora=lora)


KV_BLOCK_SIZE = 16  # tokens per KV block of the torch engine


def build_generator(
    cfg: RunConfig, name: str, device: str, endpoints: dict[str, str], run_dir: str | Path
) -> tuple[GeneratorWorker, list[Callable[[], None]]]:
    from transformers import AutoTokenizer

    model_path = resolve_model_path(cfg.model)
    engine = build_engine(cfg, device, model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    hub = HubPeer(endpoints["replay"], name, timeout_s=10.0)  # loopback: a healthy hub answers in ms
    weights = WeightReceiver(endpoints["weights"], name, device, engine, credentials=Credentials.from_env())
    timeline = Timeline(run_dir, name)
    rollout = build_rollout(cfg.generator.rollout, tokenizer, engine.limits().vocab_size)
    worker = GeneratorWorker(
        name=name, engine=engine, hub=hub, tokenizer=tokenizer,
        max_running=cfg.generator.rollout.max_episodes or cfg.generator.max_running,  # samples held at once
        weights=weights, seed=cfg.generator.seed,
        heartbeat_s=cfg.generator.heartbeat_s, timeline=timeline,
        group_size=cfg.batch.samples_per_prompt, rollout=rollout,
    )
    return worker, [timeline.close, weights.close, hub.close, rollout.close, engine.close]


def build_rollout(cfg: RolloutConfig, tokenizer: object, vocab_size: int | None) -> Rollout:
    """The configured rollout: SingleTurn, or MultiTurn over generator.rollout.environment."""
    if not cfg.multi_turn:
        return SingleTurn()
    return MultiTurn(cfg, load_environment(cfg.environment), tokenizer, vocab_size)
