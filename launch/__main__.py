"""python -m launch [CONFIG] [--set key=value ...] [--run-dir DIR] [--resume DIR]

With no CONFIG it runs the embedded default (tiny model, arithmetic task, CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from asyncrl.config.loader import ConfigError, apply_overrides, from_dict, to_dict
from asyncrl.config.run import RunConfig, load_run_config
from launch.progress import Progress
from asyncrl.rundir import load_config, save_config
from launch.run_dir import make_run_dir
from launch.placement import run_placement
from launch.supervisor import RunFailed, Supervisor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="TOML run config (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. learner.lr=1e-5")
    p.add_argument("--run-dir", help="run directory (default: runs/<timestamp>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    return p.parse_args(argv)


EMBEDDED = Path(__file__).with_name("embedded.toml")


def resumed_config(run_dir: str, overrides: list[str]) -> RunConfig:
    """The run's own config, with --set applied on top (e.g. learner.steps=200 to train longer)."""
    return from_dict(RunConfig, apply_overrides(to_dict(load_config(run_dir)), overrides))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = resumed_config(args.resume, args.set) if args.resume else load_run_config(args.config or EMBEDDED, args.set)
        placement = run_placement(cfg)
    except (ConfigError, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    run_dir = make_run_dir(cfg, args.run_dir, args.resume)
    save_config(run_dir, cfg)
    print(f"run directory: {run_dir}", file=sys.stderr)
    print(f"placement: {placement.describe()}", file=sys.stderr)
    sup = Supervisor(cfg, run_dir, resume=bool(args.resume), placement=placement)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the run like Ctrl-C
    code = 0
    try:
        sup.start()
        with Progress(run_dir, cfg.learner.steps, cfg.launch.progress) as progress:
            sup.watch(progress)
    except KeyboardInterrupt:
        print("interrupted: checkpointing and stopping ...", file=sys.stderr)
        sup.interrupt()
        code = 130
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        code = 1
    finally:
        summary = sup.finish()
    print(json.dumps({"run_dir": str(run_dir), "accounting": summary["accounting"]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
