"""Evaluate a model folder on its own (no run): the built-in torch engine answers the task's held-out prompts
and `asyncrl.evaluation.rounds` scores them strictly, as the live evaluation does during training.

The samples are made by the generator's own loop (`GeneratorWorker`, with the config's `generator.rollout`)
against an in-process stand-in for the hub (`asyncrl.generator.local_hub`): one engine request per prompt, or,
for a multi-turn config, whole episodes against its environment (tool calls answered, next turns continued from
the exact tokens), each scored on the model's last turn as the live evaluation scores it. A multi-turn record adds
`turns_mean` and `tool_calls_mean` per greedy episode (and `...@k` per sampled one) and `episodes_failed`.

`evaluate` reads the sections of a run's config it needs (model, task, eval, and the generators' batch size,
seed and rollout); `python -m asyncrl.eval` (asyncrl/eval/__main__.py) loads them from a run's TOML.
"""

from __future__ import annotations

import time
from typing import Any

from asyncrl.evaluation.config import EvalConfig
from asyncrl.evaluation.live import response
from asyncrl.evaluation.rounds import episode_figures, round_prompts, summarize
from asyncrl.generator.config import GeneratorConfig
from asyncrl.models.config import ModelConfig, resolve_model_path
from asyncrl.task.config import TaskConfig


def evaluate(model: ModelConfig, task: TaskConfig, evaluation: EvalConfig, generator: GeneratorConfig, device: str,
             log: Any = None) -> dict[str, Any]:
    """One round over the task's held-out prompts with the model at model.path (an engine of the generators'
    max_running and seed, and their rollout)."""
    from transformers import AutoTokenizer

    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.generator.build import build_rollout
    from asyncrl.generator.local_hub import LocalHub
    from asyncrl.generator.worker import GeneratorWorker
    from asyncrl.task import task_sampling
    from asyncrl.task.heldout import heldout_prompts

    path = resolve_model_path(model)
    heldout = heldout_prompts(task, evaluation.prompts, path if task.chat_template else None)
    prompts = round_prompts(heldout, evaluation, task_sampling(task), tag="eval")
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(path, device=device, dtype=model.dtype, max_running=generator.max_running,
                         seed=generator.seed, residual_fp32=model.residual_fp32, logits_fp32=model.logits_fp32)
    hub = LocalHub(prompts)
    try:
        rollout = build_rollout(generator.rollout, tokenizer, engine.limits().vocab_size)
        try:
            worker = GeneratorWorker(name="eval", engine=engine, hub=hub, tokenizer=tokenizer,
                                     max_running=generator.rollout.episodes(generator.max_running),
                                     seed=generator.seed, group_size=max(p.n for p in prompts), rollout=rollout)
            _drain(worker, hub, log)
        finally:
            rollout.close()
    finally:
        engine.close()
    multi_turn = generator.rollout.multi_turn
    decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=True)) if multi_turn else None
    record = summarize(0, prompts, [response(s, decode) for s in hub.samples], evaluation)
    if multi_turn:
        record.update(episode_figures(hub.samples))
    return record


def _drain(worker: Any, hub: Any, log: Any) -> None:
    """Run the generator's loop until every sample came back or its prompt was given up on (logged)."""
    total, last = hub.left(), time.monotonic()
    while hub.left() > 0:
        worker.run_once()
        if log is not None and time.monotonic() - last > 5.0:
            last = time.monotonic()
            log(f"eval: {total - hub.left()}/{total} samples")
    if log is not None:
        for pid, why in hub.failed.items():
            log(f"eval: prompt {pid} not run: {why}")
