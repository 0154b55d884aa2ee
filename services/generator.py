"""Generator process: one inference engine kept full with prompts leased from the hub.

python -m services.generator --run-dir DIR --name generator-0 --device cpu
"""

from __future__ import annotations

import torch

from asyncrl.config.run import RunConfig
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.generator.build import CPU_THREADS, build_generator
from asyncrl.net.heartbeat import fatal_to_hub
from asyncrl.run.lifecycle import start_service


def main() -> None:
    started = start_service("asyncrl generator", "generator", device=True)
    args, log, stop, cfg = started.args, started.log, started.stop, started.cfg
    if args.device == "cpu":
        torch.set_num_threads(CPU_THREADS)
    endpoints = started.run["endpoints"]
    worker, closers = build_generator(cfg.generator, cfg.model, args.name, args.device, endpoints, args.run_dir,
                                      group_size=cfg.batch.samples_per_prompt, lora=engine_lora(cfg))
    worker.hub.give_up = stop.is_set  # stopping: do not wait for a hub that may be gone for good
    log.info("generator %s on %s serving %s", args.name, args.device, endpoints["replay"])
    try:
        with fatal_to_hub(worker.hub, "generator", args.name):
            worker.run(stop.is_set)
    finally:
        for close in closers:
            close()


def engine_lora(cfg: RunConfig) -> LoraSpec | None:
    """The LoRA adapters the engine applies itself when each push carries adapters only (learner.lora_push)."""
    if cfg.resolved_lora_push != "adapter":
        return None
    ln = cfg.learner
    return LoraSpec(tuple(ln.lora_targets), ln.lora_alpha / ln.lora_rank, ln.lora_rank, cfg.generator.lora_apply)


if __name__ == "__main__":
    main()
