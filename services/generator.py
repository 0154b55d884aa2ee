"""Generator process: one inference engine kept full with prompts leased from the hub.

python -m services.generator --run-dir DIR --name generator-0 --device cpu
"""

from __future__ import annotations

import torch

from asyncrl.generator.build import CPU_THREADS, build_generator
from asyncrl.net.heartbeat import fatal_to_hub
from asyncrl.run.lifecycle import start_service


def main() -> None:
    started = start_service("asyncrl generator", "generator", device=True)
    args, log, stop, cfg = started.args, started.log, started.stop, started.cfg
    if args.device == "cpu":
        torch.set_num_threads(CPU_THREADS)
    endpoints = started.run["endpoints"]
    worker, closers = build_generator(cfg, args.name, args.device, endpoints, args.run_dir)
    worker.hub.give_up = stop.is_set  # stopping: do not wait for a hub that may be gone for good
    log.info("generator %s on %s serving %s", args.name, args.device, endpoints["replay"])
    try:
        with fatal_to_hub(worker.hub, "generator", args.name):
            worker.run(stop.is_set)
    finally:
        for close in closers:
            close()


if __name__ == "__main__":
    main()
