"""Config of the replay hub (read by `asyncrl.replay`): the hub itself, and the batch units it hands the learner,
defined once (prompts per step x samples per prompt = samples per step)."""

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
    score_timeout_s: float = 60.0
    """A sample handed to a reward worker and not scored by then is offered to another worker."""
    max_uncommitted_steps: int = 128
    """Delivered batches kept for re-delivery until the learner commits them (memory bound); a learner
    that runs this many steps ahead of its last commit gets an error instead of a new batch."""
    max_samples_per_prompt: int = 1024
    """Largest n (group size) a submitted prompt may ask for (memory bound against bad requests)."""
    max_wait_s: float = 60.0
    """Longest a long-poll request (lease, score, batch) is held, whatever its wait_s asks."""
    shards: int = 1
    """Hub processes. Each holds the prompts whose id hashes to it, with its own journal (RUN_DIR/replay-K/
    when more than one), and forms 1/shards of every step's groups; every peer talks to all of them
    (asyncrl.net.sharded_peer, docs/scale.md). batch.prompts_per_step must be a multiple of it."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"hub.max_staleness={self.max_staleness}: must be >= 0 (0 = synchronous)")
        if self.lease_timeout_s <= 0:
            raise ValueError(f"hub.lease_timeout_s={self.lease_timeout_s}: must be > 0")
        if self.max_frame_bytes < 1024:
            raise ValueError(f"hub.max_frame_bytes={self.max_frame_bytes}: must be >= 1024")
        if self.max_queued_prompts < 1:
            raise ValueError(f"hub.max_queued_prompts={self.max_queued_prompts}: must be >= 1")
        if self.score_timeout_s <= 0:
            raise ValueError(f"hub.score_timeout_s={self.score_timeout_s}: must be > 0")
        if self.max_uncommitted_steps < 1:
            raise ValueError(
                f"hub.max_uncommitted_steps={self.max_uncommitted_steps}: must be >= 1 "
                "(and above learner.checkpoint_every, since the learner commits at checkpoints)"
            )
        if self.max_samples_per_prompt < 1:
            raise ValueError(f"hub.max_samples_per_prompt={self.max_samples_per_prompt}: must be >= 1")
        if self.max_wait_s <= 0:
            raise ValueError(f"hub.max_wait_s={self.max_wait_s}: must be > 0")
        if self.shards < 1:
            raise ValueError(f"hub.shards={self.shards}: must be >= 1 (1 = one hub process)")


@dataclass(kw_only=True, slots=True)
class BatchConfig:
    prompts_per_step: int = 8
    """Prompts (groups) in one learner step."""
    samples_per_prompt: int = 8
    """Completions per prompt (the GRPO group size, `n`)."""

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1:
            raise ValueError(f"batch.prompts_per_step={self.prompts_per_step}: must be >= 1")
        if self.samples_per_prompt < 1:
            raise ValueError(f"batch.samples_per_prompt={self.samples_per_prompt}: must be >= 1")

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


def shard_batch(batch: BatchConfig, shards: int) -> BatchConfig:
    """What one of `shards` hubs hands the learner per step: its share of the groups (the learner joins the
    shards' parts into the step's batch)."""
    if batch.prompts_per_step % shards:
        raise ValueError(f"batch.prompts_per_step={batch.prompts_per_step} is not a multiple of hub.shards={shards}: "
                         "each shard forms an equal part of every step; change one of the two")
    return BatchConfig(prompts_per_step=batch.prompts_per_step // shards, samples_per_prompt=batch.samples_per_prompt)
