"""Base holder process: one copy of the frozen base on the device, for the learner and generators to map
(generator.share_base; asyncrl/weights/base_holder.py).

python -m services.base_holder --run-dir DIR --name base-holder --device cuda:0
"""

from __future__ import annotations

from asyncrl.models.config import resolve_model_path
from asyncrl.run.lifecycle import start_service
from asyncrl.weights.base_holder import hold


def main() -> None:
    started = start_service("asyncrl base holder", None, device=True)
    args, cfg = started.args, started.cfg
    hold(args.run_dir, resolve_model_path(cfg.model), cfg.model.dtype, args.device, started.stop.is_set)


if __name__ == "__main__":
    main()
