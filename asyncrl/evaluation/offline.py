"""Evaluate a model folder on its own (no run): the built-in torch engine answers the task's held-out prompts
and `asyncrl.evaluation.rounds` scores them strictly, as the live evaluation does during training.

The samples go through the generator's own rollout seam (`generator.rollout`): one engine request per prompt,
or, for a multi-turn config, whole episodes against its environment (tool calls answered, next turns
continued from the exact tokens), each scored on the model's last turn as the live evaluation scores it. A
multi-turn record adds `turns_mean` and `tool_calls_mean` per greedy episode (and `...@k` per sampled one)
and `episodes_failed`.

`evaluate` reads the sections of a run's config it needs (model, task, eval, and the generators' batch size,
seed and rollout); `python -m asyncrl.eval` (asyncrl/eval/__main__.py) loads them from a run's TOML.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from asyncrl.evaluation.config import EvalConfig
from asyncrl.evaluation.live import answer_tokens
from asyncrl.evaluation.rounds import Response, round_prompts, summarize
from asyncrl.generator.config import GeneratorConfig
from asyncrl.models.config import ModelConfig, resolve_model_path
from asyncrl.records import Prompt
from asyncrl.rollout.protocol import Finished, Rollout, Trajectory
from asyncrl.task.config import TaskConfig


def evaluate(model: ModelConfig, task: TaskConfig, evaluation: EvalConfig, generator: GeneratorConfig, device: str,
             log: Any = None) -> dict[str, Any]:
    """One round over the task's held-out prompts with the model at model.path (an engine of the generators'
    max_running and seed, and their rollout)."""
    from transformers import AutoTokenizer

    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.generator.build import build_rollout
    from asyncrl.task import task_sampling
    from asyncrl.task.heldout import heldout_prompts

    path = resolve_model_path(model)
    heldout = heldout_prompts(task, evaluation.prompts, path if task.chat_template else None)
    prompts = round_prompts(heldout, evaluation, task_sampling(task), tag="eval")
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(path, device=device, dtype=model.dtype, max_running=generator.max_running,
                         seed=generator.seed, residual_fp32=model.residual_fp32, logits_fp32=model.logits_fp32)
    try:
        rollout = build_rollout(generator.rollout, tokenizer, engine.limits().vocab_size)
        try:
            finished = _run(engine, rollout, prompts, tokenizer, log)
        finally:
            rollout.close()
    finally:
        engine.close()
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    record = summarize(0, prompts, [_response(pid, t, decode) for pid, t in finished], evaluation)
    if generator.rollout.multi_turn:
        record.update(_episode_figures(finished))
    return record


def _ids(p: Prompt, tokenizer: Any) -> np.ndarray:
    if p.token_ids is not None:
        return np.asarray(p.token_ids, dtype=np.int32)
    return np.asarray(tokenizer.encode(p.text), dtype=np.int32)  # as the generator encodes a text prompt


def _run(engine: Any, rollout: Rollout, prompts: list[Prompt], tokenizer: Any, log: Any) -> list[Finished]:
    """Every sample of `prompts` through `rollout` as the generator runs them (engine steps; environment
    answers polled between them), without a hub. An engine that refuses a request fails that sample only
    (a first turn: its prompt's samples are missing from the record; a later turn: its episode ends)."""
    total = sum(p.n for p in prompts)
    out: list[Finished] = []
    for p in prompts:
        try:
            for request in rollout.start(p, _ids(p, tokenizer), p.sampling):
                engine.add(request)
        except ValueError as e:
            engine.abort(rollout.drop(p.prompt_id))
            total -= p.n
            if log is not None:
                log(f"eval: prompt {p.prompt_id} not run: {e}")
    last = time.monotonic()
    while len(out) < total:
        requests, finished = rollout.poll(engine.weight_version)
        for request in requests:
            try:
                engine.add(request)
            except ValueError as e:  # e.g. the history outgrew the KV cache: that episode ends
                finished += rollout.rejected(request.request_id, str(e))
        if engine.has_work():
            for o in engine.step():
                finished += rollout.on_output(o, engine.weight_version)
        elif not finished:
            if not rollout.busy():
                raise RuntimeError(f"evaluation stalled with {total - len(out)} of {total} samples unfinished")
            time.sleep(0.002)  # every episode waits on its environment
        out += finished
        if log is not None and time.monotonic() - last > 5.0:
            last = time.monotonic()
            log(f"eval: {len(out)}/{total} samples")
    return out


def _response(prompt_id: str, t: Trajectory, decode: Callable[[np.ndarray], str]) -> Response:
    """A finished sample as the strict check reads it (answer_tokens: an episode's last model turn)."""
    return Response(prompt_id=prompt_id, greedy=prompt_id.endswith("-g"), tokens=len(t.token_ids),
                    text=decode(answer_tokens(t.token_ids, t.loss_mask)), versions=None)


def _episode_figures(finished: list[Finished]) -> dict[str, float]:
    """turns_mean and tool_calls_mean per episode: of the greedy episodes, and (suffix @k) of the sampled ones;
    episodes_failed: episodes whose environment raised, hung or refused (all of them)."""
    out: dict[str, float] = {"episodes_failed": float(sum(1 for _, t in finished if t.env_error))}
    for suffix, kind in (("", "-g"), ("@k", "-s")):
        stats = [t.stats for pid, t in finished if pid.endswith(kind)]
        if stats:
            out[f"turns_mean{suffix}"] = sum(s.get("turns", 0.0) for s in stats) / len(stats)
            out[f"tool_calls_mean{suffix}"] = sum(s.get("tool_calls", 0.0) for s in stats) / len(stats)
    return out
