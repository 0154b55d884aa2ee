"""Live progress in the terminal: learner step, reward, tokens/s, staleness, queue depths.

Reads the last line of RUN_DIR/metrics.jsonl and the hub's counters; plain log lines when the
output is not a terminal (CI, nohup).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table


def last_metrics(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, json.JSONDecodeError, IndexError):
        return {}


class Progress:
    def __init__(self, run_dir: Path, total_steps: int, enabled: bool = True) -> None:
        self.run_dir, self.total = run_dir, total_steps
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2) if enabled and sys.stderr.isatty() else None
        self._last_print = 0.0
        self._last_step = -1

    def __enter__(self) -> "Progress":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, hub: dict[str, Any]) -> None:
        m = last_metrics(self.run_dir)
        row = {
            "step": f"{m.get('step', 0)}/{self.total}",
            "reward": f"{m.get('reward_mean', float('nan')):.3f}",
            "tokens/s": f"{m.get('tokens_per_s', 0.0):.0f}",
            "staleness": f"{m.get('staleness_mean', 0.0):.2f} (max {m.get('staleness_max', 0)})",
            "version": str(hub.get("policy_version", m.get("policy_version", 0))),
            "queues": " ".join(f"{k}={v}" for k, v in (hub.get("states") or {}).items() if v),
        }
        if self.live is not None:
            self.live.update(self._table(row))
        elif m.get("step", 0) != self._last_step or time.monotonic() - self._last_print > 30:
            self._last_step, self._last_print = m.get("step", 0), time.monotonic()
            print(" | ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr, flush=True)

    @staticmethod
    def _table(row: dict[str, str]) -> Table:
        table = Table(title="asyncrl", expand=False)
        for key in row:
            table.add_column(key)
        table.add_row(*row.values())
        return table
