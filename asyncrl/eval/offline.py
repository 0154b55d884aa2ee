"""Evaluate a model folder on its own (no run): the built-in torch engine answers the task's held-out prompts
and `asyncrl.eval.rounds` scores them strictly, as the live evaluation does during training.

    python -m asyncrl.eval MODEL [CONFIG.toml] [--set task.key=value ...] [--prompts N] [--k K] [--device cpu]

MODEL is a Hugging Face folder (a run's `export/`), a `.gguf` file, or "embedded"; the task, eval and model
dtype come from CONFIG (the run's TOML) and `--set`, so the held-out prompts are the ones that run never
trained on. One JSON line on stdout (the same record as eval.jsonl); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from asyncrl.config.loader import ConfigError
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.eval.rounds import Response, round_prompts, summarize
from asyncrl.records import Prompt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m asyncrl.eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help='a Hugging Face folder (e.g. RUN_DIR/export), a .gguf file, or "embedded"')
    ap.add_argument("config", nargs="?", help="the run's TOML config (task, eval, model.dtype)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    ap.add_argument("--prompts", type=int, help="held-out prompts (default eval.prompts)")
    ap.add_argument("--k", type=int, help="samples per prompt for mean@k (default eval.k)")
    ap.add_argument("--device", default="cpu", help="torch device of the engine (cpu, cuda:0)")
    return ap.parse_args(argv)


def run_config(args: argparse.Namespace) -> RunConfig:
    sets = [f"model.path={args.model}", *args.set]
    if args.prompts is not None:
        sets.append(f"eval.prompts={args.prompts}")
    if args.k is not None:
        sets.append(f"eval.k={args.k}")
    return load_run_config(args.config, sets)


def evaluate(cfg: RunConfig, device: str, log: Any = None) -> dict[str, Any]:
    """One round over the task's held-out prompts with the model at cfg.model.path."""
    from transformers import AutoTokenizer

    from asyncrl.config.model import resolve_model_path
    from asyncrl.engine.protocol import GenerationRequest
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.task import task_sampling
    from asyncrl.task.heldout import heldout_prompts

    path = resolve_model_path(cfg.model)
    heldout = heldout_prompts(cfg.task, cfg.eval.prompts, path if cfg.task.chat_template else None)
    prompts = round_prompts(heldout, cfg.eval, task_sampling(cfg.task), tag="eval")
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = TorchEngine(path, device=device, dtype=cfg.model.dtype, max_running=cfg.generator.max_running,
                         seed=cfg.generator.seed, residual_fp32=cfg.model.residual_fp32, logits_fp32=cfg.model.logits_fp32)
    try:
        for p in prompts:
            engine.add(GenerationRequest(request_id=p.prompt_id, prompt_token_ids=_ids(p, tokenizer),
                                         sampling=p.sampling, n=p.n))
        responses = _drain(engine, tokenizer, sum(p.n for p in prompts), log)
    finally:
        engine.close()
    return summarize(0, prompts, responses, cfg.eval)


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = run_config(args)
        if cfg.eval.prompts < 1:
            raise ConfigError(f"eval.prompts={cfg.eval.prompts}: must be >= 1")
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.time()
    try:
        record = evaluate(cfg, args.device, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    record.update(model=cfg.model.path, duration_s=time.time() - start)
    print(json.dumps(record))
    return 0
