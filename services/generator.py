"""Generator process: one inference engine kept full with prompts leased from the hub.

python -m services.generator --run-dir DIR --name generator-0 --device cpu
"""

from __future__ import annotations

import argparse

from asyncrl.generator.build import build_generator
from asyncrl.lifecycle import StopFlag, setup_logging
from asyncrl.rundir import load_config, read_run_json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    log = setup_logging(args.name)
    stop = StopFlag().install()
    cfg = load_config(args.run_dir)
    endpoints = read_run_json(args.run_dir)["endpoints"]
    worker, closers = build_generator(cfg, args.name, args.device, endpoints, args.run_dir)
    log.info("generator %s on %s serving %s", args.name, args.device, endpoints["replay"])
    try:
        while not (stop.is_set() or worker.stopping):
            worker.run_once()
    finally:
        worker.shutdown()
        for close in closers:
            close()


if __name__ == "__main__":
    main()
