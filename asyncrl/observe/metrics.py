"""Per-step metrics: one JSON line per learner step in RUN_DIR/metrics.jsonl, plus TensorBoard events,
plus (when asked) Prometheus gauges on loopback and Weights & Biases.

TensorBoard is optional at run time: without the `tensorboard` package only the JSONL is written.
Prometheus gauges are every finite number of the record except the hub's counters (the hub exports
those itself), e.g. asyncrl_learner_loss, asyncrl_learner_reward_mean, asyncrl_learner_step_time_s.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from asyncrl.observe.prometheus import PrometheusExporter, scalar_samples
from asyncrl.observe.wandb_run import WandbRun

log = logging.getLogger(__name__)


class MetricsWriter:
    def __init__(self, run_dir: str | Path, prometheus_port: int | None = None, wandb_project: str = "",
                 wandb_config: dict[str, Any] | None = None) -> None:
        """`prometheus_port`: serve gauges on http://127.0.0.1:PORT/metrics (0: any free port; None: off).
        `wandb_project`: also log to W&B ("" = off)."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.exporter = PrometheusExporter("asyncrl_learner", prometheus_port) if prometheus_port is not None else None
        self.wandb = WandbRun(wandb_project, run_dir, wandb_config) if wandb_project else None
        self._file = open(self.path, "a", buffering=1)
        self.last_eval: dict[str, float] = {}  # the newest evaluation's numbers (Prometheus eval_* gauges)
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        except ImportError:
            log.info("tensorboard is not installed: writing metrics.jsonl only")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}, default=_plain) + "\n")
        scalars = {k: v for k, v in metrics.items() if k != "eval"}  # evaluations go by their own step (write_eval)
        if self._tb is not None:
            for key, value in _flatten(scalars):
                self._tb.add_scalar(key, value, step)
        if self.exporter is not None:
            self.exporter.publish(scalar_samples({"step": step, **scalars, "eval": self.last_eval}, skip=("hub",)))
        if self.wandb is not None:
            self.wandb.log(step, dict(_flatten(metrics)))  # W&B steps only grow: an evaluation at the step it arrives

    def write_eval(self, record: dict[str, Any]) -> None:
        """A held-out evaluation (asyncrl.evaluation): TensorBoard at the step it evaluated, and its numbers as eval_*
        Prometheus gauges from the next `write` on (the record itself is in eval.jsonl)."""
        numbers = {k: v for k, v in record.items() if k not in ("step", "versions", "check")}
        self.last_eval = dict(_flatten(numbers))
        if self._tb is not None:
            for key, value in _flatten(numbers, "eval/"):
                self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self.exporter is not None:
            self.exporter.close()
        if self.wandb is not None:
            self.wandb.close()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return str(v)


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(_flatten(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append((key, float(v)))
    return out
