"""python -m launch [CONFIG] [--set key=value ...] [--run-dir DIR] [--resume DIR] [--show-config]

With no CONFIG it runs the embedded default (tiny model, arithmetic task, CPU). Everything a user can
get wrong (config keys, model path, task files, devices, the run directory) is checked before any
process starts: one line naming the key and the fix, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

from asyncrl.config.loader import ConfigError, apply_overrides, from_dict, to_dict
from asyncrl.config.reference import render_text
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.run.rundir import RunDirError, check_resumable, load_config, make_run_dir, save_config
from launch.host import Host, LocalHost
from launch.placement import Placement, run_placement
from launch.preflight import preflight
from launch.progress import Progress
from launch.report import final_report
from launch.supervisor import RunFailed, Supervisor

EMBEDDED = Path(__file__).with_name("embedded.toml")
EXIT_USAGE = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="TOML run config (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. learner.lr=1e-5")
    p.add_argument("--run-dir", help="run directory of a new run (default: runs/<timestamp>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--show-config", action="store_true",
                   help="print every config key with its value, type, default and doc, then exit")
    return p.parse_args(argv)


def resumed_config(run_dir: str, overrides: list[str]) -> RunConfig:
    """The run's own config, with --set applied on top (e.g. learner.steps=200 to train longer)."""
    check_resumable(run_dir)
    saved = load_config(run_dir)
    cfg = from_dict(RunConfig, apply_overrides(to_dict(saved), overrides))
    if cfg.hub.shards != saved.hub.shards:  # each shard's journal holds its own prompts: a new split loses them
        raise ValueError(f"hub.shards={cfg.hub.shards}: the run in {run_dir} has {saved.hub.shards} hub shard(s), each "
                         "with its own journal; a resumed run keeps them; drop --set hub.shards")
    return cfg


def place(cfg: RunConfig) -> tuple[Host, Placement]:
    """This host and its devices, or (launch.placement = "ray") a node per service of a Ray cluster."""
    if cfg.launch.placement == "ray":
        from launch.ray_host import RayHost

        host = RayHost.connect(cfg)
        return host, host.placement
    return LocalHost(cfg.launch.host), run_placement(cfg)


def prepare(args: argparse.Namespace) -> tuple[RunConfig, Host, Placement, Path]:
    """Config -> file-system checks -> placement -> run directory; raises ValueError with the one line to print."""
    cfg = resumed_config(args.resume, args.set) if args.resume else load_run_config(args.config or EMBEDDED, args.set)
    preflight(cfg)
    host, placement = place(cfg)
    try:
        return cfg, host, placement, make_run_dir(cfg, args.run_dir, args.resume)
    except BaseException:
        host.close()
        raise


def run(cfg: RunConfig, host: Host, placement: Placement, run_dir: Path, resume: bool) -> tuple[int, dict, str]:
    """Start the processes, watch them to the end, stop them: (exit code, summary, outcome)."""
    sup = Supervisor(cfg, run_dir, resume=resume, placement=placement, host=host)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the run like Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited ignored (a script's `&` job)
    code, outcome = 0, "finished"
    try:
        sup.start()
        with Progress(run_dir, cfg.learner.steps, cfg.launch.progress) as progress:
            sup.watch(progress)
    except KeyboardInterrupt:
        print("interrupted: checkpointing and stopping ...", file=sys.stderr)
        sup.interrupt()
        code, outcome = 130, "interrupted"
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        code, outcome = 1, "failed"
    finally:
        summary = sup.finish()
    return code, summary, outcome


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.show_config:
            cfg = load_run_config(args.config or EMBEDDED, args.set)
            sys.stdout.write(render_text(cfg))
            return 0
        cfg, host, placement, run_dir = prepare(args)
    except RunDirError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    save_config(run_dir, cfg)
    print(f"run directory: {run_dir}", file=sys.stderr)
    print(f"placement: {placement.describe()}", file=sys.stderr)
    if host.describe():
        print(f"nodes: {host.describe()}", file=sys.stderr)
    started = time.monotonic()
    code, summary, outcome = run(cfg, host, placement, run_dir, bool(args.resume))
    print(final_report(run_dir, summary["accounting"], time.monotonic() - started, cfg.learner.steps, outcome),
          file=sys.stderr)
    print(json.dumps({"run_dir": str(run_dir), "accounting": summary["accounting"]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
