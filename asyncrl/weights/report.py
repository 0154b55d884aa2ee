"""PushReport: what one weight push did (timings, bytes, who got it, who was dropped and why)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, slots=True)
class PushReport:
    """What one push did. Seconds are wall time on the learner unless noted."""

    version: int
    generators: list[str]  # got this version
    dropped: dict[str, str] = field(default_factory=dict)  # generator -> why
    buckets: int = 0
    bytes: int = 0  # flat bytes per generator
    gather_s: float = 0.0  # pulling (name, tensor) and packing buckets (FSDP full_tensor() runs here)
    transfer_s: float = 0.0  # starting and waiting for the bucket transfers
    ack_s: float = 0.0  # waiting for generators to load and ack (not overlapped with gather)
    total_s: float = 0.0
    pause_s: float = 0.0  # max over generators: engine.pause() (aborts in-flight work in 'abort' mode)
    recv_s: float = 0.0  # max over generators: posting each bucket's receive (CUDA IPC: opening the learner's
    # buffer; staged, queueing the copy out of it) and waiting for its bytes
    load_s: float = 0.0  # max over generators: sum of engine.load_weights()
    apply_s: float = 0.0  # max over generators: end_weight_update (adapter merges, FP8 requantization) and the
    # device's wait for it and the loads
    paused_s: float = 0.0  # max over generators: engine paused, pause() to resume()
    per_generator: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.bytes / self.transfer_s / 1e9 if self.transfer_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        keys = ("version", "buckets", "bytes", "gather_s", "transfer_s", "ack_s", "total_s", "pause_s", "recv_s",
                "load_s", "apply_s", "paused_s")
        out: dict[str, Any] = {k: getattr(self, k) for k in keys}
        out.update(gbps=self.gbps, generators=list(self.generators), dropped=dict(self.dropped))
        return out
