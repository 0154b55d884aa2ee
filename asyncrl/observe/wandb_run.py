"""Optional Weights & Biases logging of the learner's per-step metrics (rank 0), `launch.wandb_project`.

`wandb` is imported only when a project is set, so runs without it never need the package. The run's
files go under RUN_DIR/wandb; WANDB_MODE=offline (wandb's own variable) keeps everything local.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class WandbRun:
    def __init__(self, project: str, run_dir: str | Path, config: dict[str, Any] | None = None) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ValueError(f"launch.wandb_project={project!r} needs the wandb package: pip install wandb, "
                             "or set launch.wandb_project=\"\" to log without it") from e
        run_dir = Path(run_dir)
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=config or {},
                              reinit="finish_previous")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
