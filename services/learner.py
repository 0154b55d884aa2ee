"""Learner rank: FSDP2 training on batches from the hub; rank 0 pushes weights to the generators.

Started by the launcher like torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment):
python -m services.learner --run-dir DIR --name learner-0 --device cpu
"""

from __future__ import annotations

import dataclasses
import os

import torch.distributed as dist

from asyncrl.learner.service import LearnerService, init_distributed
from asyncrl.net.heartbeat import fatal_to_hub
from asyncrl.run.lifecycle import start_service
from asyncrl.observe.prometheus import url_port


def main() -> None:
    started = start_service("asyncrl learner rank", "learner", device=True)
    args, log, stop, cfg, run = started.args, started.log, started.stop, started.cfg, started.run
    cfg.launch.host = os.environ.get("MASTER_ADDR", cfg.launch.host)  # rank 0's weight store binds its own address
    init_distributed(args.device)
    metrics_port = url_port(run.get("metrics_endpoints", {}).get("learner", ""))
    service = LearnerService(
        cfg.learner, cfg.model, args.run_dir, args.name, args.device, run["endpoints"], stop.is_set,
        generator=cfg.generator, evaluation=cfg.eval, task=cfg.task, push_mode=cfg.resolved_lora_push,
        max_uncommitted_steps=cfg.hub.max_uncommitted_steps, seed=cfg.launch.seed, host=cfg.launch.host,
        wandb_project=cfg.launch.wandb_project, wandb_config=dataclasses.asdict(cfg), metrics_port=metrics_port)
    log.info("learner %s on %s: %d steps", args.name, args.device, cfg.learner.steps)
    try:
        with fatal_to_hub(service.hub, "learner", args.name):
            service.run()
    finally:
        service.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
