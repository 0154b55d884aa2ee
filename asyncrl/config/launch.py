"""Config of the launcher: where the run lives and how it is shown."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    run_dir: str = ""
    """Run directory (default: runs/<timestamp>)."""
    host: str = "127.0.0.1"
    """Address services bind (loopback unless you run across hosts)."""
    progress: bool = True
    """Live progress in the terminal."""
    max_restarts: int = 3
    """Restarts per crashed generator / reward worker before the run is stopped."""
    seed: int = 0
    """Global seed."""
