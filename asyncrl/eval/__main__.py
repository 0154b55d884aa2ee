"""Evaluate a model folder on its own (no run): the built-in torch engine answers the task's held-out prompts
and `asyncrl.evaluation.rounds` scores them strictly, as the live evaluation does during training.

    python -m asyncrl.eval MODEL [CONFIG.toml] [--set task.key=value ...] [--prompts N] [--k K] [--device cpu]

MODEL is a Hugging Face folder (a run's `export/`), a `.gguf` file, or "embedded"; the task, eval and model
dtype come from CONFIG (the run's TOML) and `--set`, so the held-out prompts are the ones that run never
trained on. One JSON line on stdout (the same record as eval.jsonl); progress on stderr.

This program is an entry point, like services/: it reads a run's whole TOML (checked as the launcher checks
it) and hands `asyncrl.evaluation.offline.evaluate` the sections it needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from asyncrl.config.loader import ConfigError
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.evaluation.offline import evaluate


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
        record = evaluate(cfg.model, cfg.task, cfg.eval, cfg.generator, args.device,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    record.update(model=cfg.model.path, duration_s=time.time() - start)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
