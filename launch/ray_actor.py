"""`ServiceActor`: the keeper of one service's process on its Ray node (a plain class; `launch.ray_host`
makes it a Ray actor pinned to the node the plan chose, holding the service's CPU and GPU).

    RayHost ──free_ports([address, ...])──► ports free on this node
            ──start(spec, log_dir, cwd)───► `python -m services.<x>` as a child of this actor, through
                                            launch.processes.spawn (the same start as on a single host)
            ──poll(pid) / signal(pid, sig)─► the supervisor's watch loop, restarts and stop

Calls are short and answered one at a time; nothing here blocks on the service. The service's process
group gets SIGTERM when the actor's process dies (killed by `RayHost.close`, or with its driver), so no
service outlives its run.

The service proves its role with a key it derives from RUN_DIR/secret: this actor removes role keys it may
have inherited from the node's environment, and the launcher sends none through Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

from asyncrl.net.credentials import ENV_KEY, ENV_ROLE, ENV_SERVER
from launch.ports import free_ports
from launch.processes import LocalProc, ProcessSpec, spawn

CREDENTIAL_ENV = (ENV_ROLE, ENV_KEY, ENV_SERVER)


class ServiceActor:
    def __init__(self) -> None:
        for key in CREDENTIAL_ENV:
            os.environ.pop(key, None)
        self.procs: dict[int, LocalProc] = {}

    def free_ports(self, addresses: list[str]) -> list[int]:
        return free_ports(addresses)

    def start(self, spec: ProcessSpec, log_dir: str, cwd: str) -> int:
        """Start the service in `cwd` (the launch directory); its pid."""
        if not Path(cwd).is_dir():
            raise FileNotFoundError(f"the launch directory {cwd} does not exist on this node: launch from a "
                                    "directory every node of the cluster sees at the same path")
        proc = spawn(spec, Path(log_dir), cwd=cwd).proc
        self.procs[proc.pid] = proc
        return proc.pid

    def poll(self, pid: int) -> int | None:
        return self.procs[pid].poll()

    def signal(self, pid: int, sig: int) -> None:
        self.procs[pid].signal_group(sig)
