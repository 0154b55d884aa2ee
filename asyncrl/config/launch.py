"""Config of the launcher: where the run lives, how it is shown, how it is supervised."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    run_dir: str = ""
    """Run directory (default: runs/<timestamp>)."""
    placement: Literal["local", "ray"] = "local"
    """Where the services run: "local" starts them on this host; "ray" places the hub, learner ranks, generators
    and reward workers on the nodes of an existing Ray cluster by their resources (docs/ray.md), each binding
    its node's address."""
    ray_address: str = "auto"
    """The Ray cluster to join with placement = "ray" (ray.init's address: "auto" = the cluster this node
    belongs to, or "HOST:PORT" of its head)."""
    host: str = "127.0.0.1"
    """Address services bind: ZeroMQ endpoints and the learner's TCP stores (loopback unless you run across
    hosts; any other address makes the hub require CURVE, see docs/trust.md). With placement = "ray" each
    service binds the address of its Ray node instead."""
    unix_sockets: bool = True
    """With placement = "local" and a loopback host, peers reach the hub through Unix sockets in the run directory
    (ipc://RUN_DIR/replay.sock), which cost the kernel less CPU per frame than TCP on loopback; false: TCP on
    loopback. A run directory where no Unix socket can live (a path over 107 bytes, a file system that refuses
    them) uses TCP."""
    progress: bool = True
    """Live progress in the terminal."""
    max_restarts: int = 3
    """Restarts of one crashed service (hub, generator, reward worker) in a row without it becoming healthy
    (launch/restarts.py), within restart_window_s; one more such crash is a crash loop and stops the run."""
    restart_window_s: float = 600.0
    """The window over which max_restarts is counted (crashes older than this are forgiven)."""
    healthy_after_s: float = 60.0
    """A restarted service is healthy, and its crash count starts afresh, once the run made a learner step while
    it was up or once it stayed up this long."""
    restart_backoff_s: float = 1.0
    """Wait before restarting a crashed service; doubles with each crash in a row (0: restart at once)."""
    restart_backoff_max_s: float = 60.0
    """The longest wait before a restart."""
    hub_reconnect_s: float = 120.0
    """How long a service keeps retrying a hub that does not answer (while the launcher restarts it)."""
    stall_timeout_s: float = 900.0
    """End the run when the learner makes no step for this long (0 = never); the error says why."""
    seed: int = 0
    """Global seed."""
    prometheus: bool = True
    """Serve Prometheus metrics over HTTP on loopback: the learner's per-step gauges (rank 0) and the hub's
    accounting and rejected/refused counters, each on a free port listed in RUN_DIR/run.json under
    "metrics_endpoints"."""
    wandb_project: str = ""
    """Also log the learner's metrics to this Weights & Biases project ("" = off; needs `pip install wandb`;
    WANDB_MODE=offline keeps it local)."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"launch.max_restarts={self.max_restarts}: must be >= 0 (0 = no restarts)")
        if self.restart_window_s <= 0:
            raise ValueError(f"launch.restart_window_s={self.restart_window_s}: must be > 0 seconds")
        if self.healthy_after_s <= 0:
            raise ValueError(f"launch.healthy_after_s={self.healthy_after_s}: must be > 0 seconds")
        if self.restart_backoff_s < 0 or self.restart_backoff_max_s < self.restart_backoff_s:
            raise ValueError(f"launch.restart_backoff_s={self.restart_backoff_s}, launch.restart_backoff_max_s="
                             f"{self.restart_backoff_max_s}: need 0 <= restart_backoff_s <= restart_backoff_max_s")
        if self.hub_reconnect_s < 0:
            raise ValueError(f"launch.hub_reconnect_s={self.hub_reconnect_s}: must be >= 0 (0 = fail at once)")
        if self.wandb_project and importlib.util.find_spec("wandb") is None:
            raise ValueError(f"launch.wandb_project={self.wandb_project!r} needs the wandb package: pip install wandb, "
                             "or set launch.wandb_project=\"\" to turn W&B logging off")
        if self.placement == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("launch.placement=\"ray\" needs the ray package: pip install 'asyncrl[ray]', "
                             "or set launch.placement=\"local\"")
        if self.stall_timeout_s < 0:
            raise ValueError(f"launch.stall_timeout_s={self.stall_timeout_s}: must be >= 0 (0 = no watchdog)")
