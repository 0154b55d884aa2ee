"""Config of the replay hub (read by `asyncrl.replay`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True, slots=True)
class HubConfig:
    endpoint: str = "tcp://127.0.0.1:0"
    """ZeroMQ endpoint the hub binds (ROUTER). Port 0: a free port is chosen at launch."""
    max_staleness: int = 1
    """A sample made by policy v may be trained at version <= v + max_staleness (0 = synchronous)."""
    lease_timeout_s: float = 300.0
    """A leased prompt whose samples have not all arrived by then goes back to the queue."""
    max_frame_bytes: int = 64 * 1024 * 1024
    """Frames larger than this are rejected before decoding."""
    max_queued_prompts: int = 100_000
    """Submissions beyond this many queued prompts are refused (memory bound)."""
    fsync: Literal["always", "batch", "never"] = "batch"
    """Log durability: fsync every record, once per event-loop turn, or leave it to the OS."""
    log: bool = True
    """Write the state-change log to RUN_DIR (needed for restart / resume)."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"hub.max_staleness={self.max_staleness}: must be >= 0 (0 = synchronous)")
        if self.lease_timeout_s <= 0:
            raise ValueError(f"hub.lease_timeout_s={self.lease_timeout_s}: must be > 0")
        if self.max_frame_bytes < 1024:
            raise ValueError(f"hub.max_frame_bytes={self.max_frame_bytes}: must be >= 1024")
        if self.max_queued_prompts < 1:
            raise ValueError(f"hub.max_queued_prompts={self.max_queued_prompts}: must be >= 1")
