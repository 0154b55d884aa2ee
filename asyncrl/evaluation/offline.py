"""Evaluate a model folder on its own (no run): the built-in torch engine answers the task's held-out prompts
and `asyncrl.evaluation.rounds` scores them strictly, as the live evaluation does during training.

`evaluate` reads the sections of a run's config it needs (model, task, eval, and the generators' batch size
and seed); `python -m asyncrl.eval` (asyncrl/eval/__main__.py) loads them from a run's TOML.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from asyncrl.evaluation.config import EvalConfig
from asyncrl.evaluation.rounds import Response, round_prompts, summarize
from asyncrl.generator.config import GeneratorConfig
from asyncrl.models.config import ModelConfig, resolve_model_path
from asyncrl.records import Prompt
from asyncrl.task.config import TaskConfig


def evaluate(model: ModelConfig, task: TaskConfig, evaluation: EvalConfig, generator: GeneratorConfig, device: str,
             log: Any = None) -> dict[str, Any]:
    """One round over the task's held-out prompts with the model at model.path (an engine of the generators'
    max_running and seed)."""
    from transformers import AutoTokenizer

    from asyncrl.engine.protocol import GenerationRequest
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.task import task_sampling
    from asyncrl.task.heldout import heldout_prompts

    path = resolve_model_path(model)
    heldout = heldout_prompts(task, evaluation.prompts, path if task.chat_template else None)
    prompts = round_prompts(heldout, evaluation, task_sampling(task), tag="eval")
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(path, device=device, dtype=model.dtype, max_running=generator.max_running,
                         seed=generator.seed, residual_fp32=model.residual_fp32, logits_fp32=model.logits_fp32)
    try:
        for p in prompts:
            engine.add(GenerationRequest(request_id=p.prompt_id, prompt_token_ids=_ids(p, tokenizer),
                                         sampling=p.sampling, n=p.n))
        responses = _drain(engine, tokenizer, sum(p.n for p in prompts), log)
    finally:
        engine.close()
    return summarize(0, prompts, responses, evaluation)


def _ids(p: Prompt, tokenizer: Any) -> np.ndarray:
    if p.token_ids is not None:
        return np.asarray(p.token_ids, dtype=np.int32)
    return np.asarray(tokenizer.encode(p.text), dtype=np.int32)  # as the generator encodes a text prompt


def _drain(engine: Any, tokenizer: Any, total: int, log: Any) -> list[Response]:
    out: list[Response] = []
    last = time.monotonic()
    while engine.has_work():
        for o in engine.step():
            out.append(Response(prompt_id=o.request_id, greedy=o.request_id.endswith("-g"), tokens=len(o.token_ids),
                                text=tokenizer.decode(o.token_ids, skip_special_tokens=True), versions=None))
        if log is not None and time.monotonic() - last > 5.0:
            last = time.monotonic()
            log(f"eval: {len(out)}/{total} samples")
    return out
