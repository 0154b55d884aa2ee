"""Hub shards: a run's replay hub as N processes, each holding the prompts whose id hashes to it.

    shard_of("task-00042", 2) -> 0 or 1          which shard holds a prompt (crc32 of the id: stable everywhere)
    shard_name(1, 2) -> "replay-1"                the process name ("replay" when the hub is one process)
    hub_endpoints(run["endpoints"])               every shard's endpoint, in shard order (run.json)

Shard K binds run.json's endpoints["replay_shards"][K], keeps its journal in RUN_DIR/replay-K/ (a hub of
one shard: RUN_DIR/replay.log, as always) and serves metrics at metrics_endpoints["hub-K"] ("hub" for 0).
Peers reach all shards through `asyncrl.net.sharded_peer.ShardedPeer`; docs/scale.md has the arithmetic.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def shard_of(prompt_id: str, shards: int) -> int:
    """The shard that holds `prompt_id` (crc32: the same in every process and Python version)."""
    return zlib.crc32(prompt_id.encode()) % shards


def hub_endpoints(endpoints: dict[str, Any]) -> list[str]:
    """The hub shards' endpoints from run.json's "endpoints": "replay_shards" (one per shard), else "replay"."""
    shards = endpoints.get("replay_shards")
    if isinstance(shards, list) and shards and all(isinstance(e, str) for e in shards):
        return list(shards)
    return [endpoints["replay"]]


def shard_name(k: int, shards: int) -> str:
    """The process name of hub shard `k`: "replay" for a hub of one shard, else "replay-K"."""
    return "replay" if shards == 1 else f"replay-{k}"


@dataclass(frozen=True, slots=True)
class HubShard:
    """One hub process of a run: which shard it is, where it binds, where its journal and metrics go."""

    index: int
    shards: int
    run_dir: Path

    @classmethod
    def of(cls, name: str, shards: int, run_dir: Path) -> HubShard:
        """Shard K of a process named "replay-K"; a hub of one shard takes any name (e.g. started by hand)."""
        if shards == 1:
            return cls(0, 1, run_dir)
        for k in range(shards):
            if name == shard_name(k, shards):
                return cls(k, shards, run_dir)
        names = ", ".join(shard_name(k, shards) for k in range(shards))
        raise ValueError(f"--name {name!r} is no shard of hub.shards={shards}: expected one of {names}")

    def journal_dir(self) -> Path:
        """RUN_DIR for a hub of one shard, else RUN_DIR/replay-K (made here): each shard resumes from its own."""
        if self.shards == 1:
            return self.run_dir
        path = self.run_dir / shard_name(self.index, self.shards)
        path.mkdir(exist_ok=True)
        return path

    def endpoint(self, run: dict[str, Any]) -> str:
        return hub_endpoints(run["endpoints"])[self.index]

    def metrics_endpoint(self, run: dict[str, Any]) -> str:
        return run.get("metrics_endpoints", {}).get(metrics_key(self.index), "")


def metrics_key(k: int) -> str:
    """run.json's metrics_endpoints key of hub shard `k`: "hub", then "hub-1", "hub-2", ..."""
    return "hub" if k == 0 else f"hub-{k}"
