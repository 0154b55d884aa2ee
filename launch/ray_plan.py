"""Which Ray node runs each service of a run, chosen from the nodes' CPUs and GPUs before anything starts.

    plan(cfg, [Node("n1", "10.0.0.1", cpus=32, gpus=8), Node("n2", "10.0.0.2", cpus=32, gpus=8)])
      learner ranks  one GPU each, packed: a rank goes where the previous one went while a GPU is left there
                     (FSDP ranks talk the most), else to the node with the most GPUs left
      generators     one GPU each, each on the node with the most GPUs left (they spread)
      hub, reward    nothing but their CPU, each on the node with the most CPUs left
      -> {"replay": Seat(n2, ""), "learner-0": Seat(n1, "cuda:0"), ..., "generator-0": Seat(n2, "cuda:0"), ...}

Every service takes one CPU of its node. Learner ranks and generators run on CPU (one CPU each, and the
choice above made among CPUs) when the cluster has no GPU, or when learner.devices / generator.devices are
all "cpu". A GPU service's device is "cuda:0": Ray gives its actor one GPU through CUDA_VISIBLE_DEVICES,
which the service inherits. Host-local device lists ("cuda:3") mean nothing across nodes and are refused.

The counts are the nodes' totals (the cluster is taken to be free for this run); a cluster too small for
the config is a ValueError naming the key and what is missing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    address: str  # the node's IP as Ray knows it (what its services bind)
    cpus: float
    gpus: float


@dataclass(frozen=True, slots=True)
class Seat:
    node: Node
    device: str  # "cpu", "cuda:0" (learner ranks, generators) or "" (hub, reward workers)

    @property
    def gpus(self) -> int:
        return 1 if self.device.startswith("cuda") else 0


def plan(cfg: Any, nodes: list[Node]) -> dict[str, Seat]:
    """A seat per service name ("replay", "learner-<i>", "generator-<i>", "reward-<i>"), in start order."""
    if not nodes:
        raise ValueError("launch.placement=\"ray\": the Ray cluster has no live node")
    free = {n.node_id: {"CPU": n.cpus, "GPU": n.gpus} for n in nodes}
    learner_kind = _kind("learner.devices", cfg.learner.devices, nodes)
    generator_kind = _kind("generator.devices", cfg.generator.devices, nodes)
    seats: dict[str, Seat] = {}
    previous: Node | None = None
    for rank in range(cfg.learner.ranks):
        previous = _take(free, nodes, learner_kind, f"learner-{rank}", "lower learner.ranks", prefer=previous)
        seats[f"learner-{rank}"] = Seat(previous, _device(learner_kind))
    for i in range(cfg.generator.count):
        seats[f"generator-{i}"] = Seat(_take(free, nodes, generator_kind, f"generator-{i}", "lower generator.count"),
                                       _device(generator_kind))
    seats["replay"] = Seat(_take(free, nodes, "CPU", "the hub", "use fewer services"), "")
    for i in range(cfg.reward.workers):
        seats[f"reward-{i}"] = Seat(_take(free, nodes, "CPU", f"reward-{i}", "lower reward.workers"), "")
    order = ["replay", *(f"learner-{r}" for r in range(cfg.learner.ranks)),
             *(f"generator-{i}" for i in range(cfg.generator.count)),
             *(f"reward-{i}" for i in range(cfg.reward.workers))]  # the supervisor's start order
    return {name: seats[name] for name in order}


def _kind(field: str, devices: list[str], nodes: list[Node]) -> str:
    """"GPU" or "CPU": what one learner rank (or generator) takes."""
    if devices and all(d == "cpu" for d in devices):
        return "CPU"
    if devices:
        raise ValueError(f"{field}={devices}: with launch.placement=\"ray\" leave it empty (one GPU of its node "
                         "each, or CPU when the cluster has no GPU) or set every entry to \"cpu\"")
    return "GPU" if any(n.gpus >= 1 for n in nodes) else "CPU"


def _device(kind: str) -> str:
    return "cuda:0" if kind == "GPU" else "cpu"


def _take(free: dict[str, dict[str, float]], nodes: list[Node], kind: str, what: str, fix: str,
          prefer: Node | None = None) -> Node:
    """Reserve one `kind` (and one CPU) for `what` on `prefer` if it fits, else on the node with most `kind` left."""
    fits = [n for n in nodes if free[n.node_id][kind] >= 1 and free[n.node_id]["CPU"] >= 1]
    if not fits:
        left = ", ".join(f"{n.address}: {free[n.node_id]['CPU']:g} CPU {free[n.node_id]['GPU']:g} GPU" for n in nodes)
        raise ValueError(f"launch.placement=\"ray\": no Ray node has a {kind}{' and a CPU' if kind == 'GPU' else ''} "
                         f"left for {what} (left after the services placed before it: {left}); {fix} or add nodes "
                         "to the cluster")
    node = prefer if prefer in fits else max(fits, key=lambda n: free[n.node_id][kind])  # first of equals wins
    free[node.node_id]["CPU"] -= 1
    if kind == "GPU":
        free[node.node_id]["GPU"] -= 1
    return node


def nodes_of(ray_nodes: list[dict[str, Any]]) -> list[Node]:
    """`Node`s from `ray.nodes()`: the live ones, by address (ray.nodes() has no stable order; ties in the
    plan go to the first node, so the same cluster gets the same plan)."""
    nodes = [Node(n["NodeID"], n["NodeManagerAddress"], float(n["Resources"].get("CPU", 0)),
                  float(n["Resources"].get("GPU", 0))) for n in ray_nodes if n.get("Alive")]
    return sorted(nodes, key=lambda n: (_sortable(n.address), n.node_id))


def _sortable(address: str) -> tuple[int, int | str]:
    try:
        ip = ipaddress.ip_address(address)
        return ip.version, int(ip)
    except ValueError:
        return 9, address  # a host name, after every IP
