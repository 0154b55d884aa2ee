"""Per-step metrics: one JSON line per learner step in RUN_DIR/metrics.jsonl, plus TensorBoard events.

TensorBoard is optional at run time: without the `tensorboard` package only the JSONL is written.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsWriter:
    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        except ImportError:
            log.info("tensorboard is not installed: writing metrics.jsonl only")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}, default=_plain) + "\n")
        if self._tb is not None:
            for key, value in _flatten(metrics):
                self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


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
