"""A process group built from a TCP rendezvous without a default group (SGLang's recipe, §4.2).

The test double's fake TP ranks and the tests' learner-side rank 0 all live in one Python process, so
every member registers its group under a process-unique `local_name`; the rendezvous keys are
namespaced by the shared `group_name`, which is what makes the members meet.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    PrefixStore,
    _new_process_group_helper,
    _world,
    rendezvous,
)


def join_group(
    *,
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    backend: str = "gloo",
    timeout_s: float = 30.0,
    local_name: str | None = None,
) -> dist.ProcessGroup:
    """Join (rank 0: host) the rendezvous at master_address:master_port; blocks until all ranks join."""
    timeout = timedelta(seconds=timeout_s)
    url = f"tcp://{master_address}:{master_port}"
    store, rank, world_size = next(rendezvous(url, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=local_name or group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}  # group rank == rank, so src=0 resolves
    return pg


def leave_group(pg: dist.ProcessGroup) -> None:
    dist.destroy_process_group(pg)
