"""Where the services of a run start: this machine (`LocalHost`) or the nodes of a Ray cluster (`RayHost`).

    supervisor ──address(name)──► the address service `name` binds, and its peers connect to
               ──free_ports(name, [address, ...])──► ports that are free where that service runs
               ──spawn(spec, log_dir)──► a Child whose Proc the watch loop polls and signals
               ──close()──► nothing of the run is left running on the host

The supervisor knows only this protocol; restarts, budgets, the watchdog and the stop order are the same
on every host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from launch.ports import free_ports
from launch.processes import Child, ProcessSpec, spawn


class Host(Protocol):
    def address(self, name: str) -> str:
        """The address service `name` binds."""

    def free_ports(self, name: str, addresses: list[str]) -> list[int]:
        """One free port per address where service `name` runs, all different."""

    def spawn(self, spec: ProcessSpec, log_dir: Path) -> Child:
        """Start the service (again, on a restart) where it is placed."""

    def describe(self) -> str:
        """Which node runs what, for the launch banner ("" when everything runs here)."""

    def close(self) -> None:
        """Release what the host holds for the run (called once the services are stopped)."""


class LocalHost:
    """Every service on this machine, binding `launch.host`."""

    def __init__(self, host: str) -> None:
        self.host = host

    def address(self, name: str) -> str:
        return self.host

    def free_ports(self, name: str, addresses: list[str]) -> list[int]:
        return free_ports(addresses)

    def spawn(self, spec: ProcessSpec, log_dir: Path) -> Child:
        return spawn(spec, log_dir)

    def describe(self) -> str:
        return ""

    def close(self) -> None:
        pass
