"""`RayHost`: the services of a run on the nodes of an existing Ray cluster (launch.placement = "ray").

    launcher, on a node of the cluster ──ray.init(launch.ray_address)──► nodes ──► plan (launch.ray_plan)
        one ServiceActor per service, pinned to its planned node (hard node affinity), holding one CPU
        (and one GPU for a GPU learner rank or generator); all are up before any service starts
    address(name)   that node's IP: the service binds it (ZeroMQ, TCP stores), its peers connect to it
    free_ports      picked on that node by the service's actor
    spawn           the actor starts `python -m services.<x>` there (launch.processes.spawn), in the launch
                    directory, with the environment the supervisor gives it minus the role keys
    RayProc         the Child's Proc: poll / wait / signal through the actor; a dead actor reads as a
                    killed service (exit -9), which the supervisor restarts or reports as usual
    close           kills the actors (a service still running gets SIGTERM from its dying parent)

Nothing secret travels through Ray: every service derives its role key from RUN_DIR/secret, and on a
non-loopback address the hub requires CURVE (docs/trust.md). The run directory and the directory the
launcher runs in must be on storage every node sees at the same path (docs/ray.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from launch.placement import Placement
from launch.processes import Child, ProcessSpec
from launch.ray_actor import CREDENTIAL_ENV, ServiceActor
from launch.ray_plan import Seat, nodes_of, plan
from launch.supervisor import RunFailed

log = logging.getLogger("launch.ray")

ACTOR_START_S = 120.0  # every actor is up within this (a Ray worker process starts and imports launch)
CALL_S = 30.0  # free_ports / start / poll / signal answer within this
KILLED = -signal.SIGKILL  # the exit code of a service whose actor is gone


class RayHost:
    def __init__(self, seats: dict[str, Seat]) -> None:
        self.seats = seats
        remote = ray.remote(ServiceActor)
        self.actors = {
            name: remote.options(num_cpus=1, num_gpus=seat.gpus, max_restarts=0, scheduling_strategy=(
                NodeAffinitySchedulingStrategy(seat.node.node_id, soft=False))).remote()
            for name, seat in seats.items()}
        self._wait_ready()

    @classmethod
    def connect(cls, cfg: Any) -> RayHost:
        """Join the cluster at launch.ray_address and start a keeper per service; ValueError in one line."""
        address = cfg.launch.ray_address
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ValueError(f"launch.ray_address={address!r}: cannot join a Ray cluster ({_first_line(e)}); start one "
                             "(`ray start --head` here, `ray start --address HEAD:PORT` on the other nodes) or "
                             "give its head's HOST:PORT") from None
        try:
            return cls(plan(cfg, nodes_of(ray.nodes())))
        except BaseException:
            ray.shutdown()
            raise

    @property
    def placement(self) -> Placement:
        learner = [s.device for n, s in self.seats.items() if n.startswith("learner-")]
        generators = [s.device for n, s in self.seats.items() if n.startswith("generator-")]
        cpu = learner[0] == "cpu"
        return Placement(learner=learner, generators=generators,
                         weight_paths=["gloo" if cpu or g == "cpu" else "nccl" for g in generators])

    # ------------------------------------------------------------------ Host

    def address(self, name: str) -> str:
        return self.seats[name].node.address

    def free_ports(self, name: str, addresses: list[str]) -> list[int]:
        return ray.get(self.actors[name].free_ports.remote(addresses), timeout=CALL_S)

    def spawn(self, spec: ProcessSpec, log_dir: Path) -> Child:
        sent = dataclasses.replace(spec, env={k: v for k, v in spec.env.items() if k not in CREDENTIAL_ENV})
        actor, log_dir = self.actors[spec.name], Path(log_dir).resolve()
        try:
            pid = ray.get(actor.start.remote(sent, str(log_dir), os.getcwd()), timeout=CALL_S)
        except ray.exceptions.RayTaskError as e:  # the keeper refused, e.g. no launch directory on its node
            raise RunFailed(f"{spec.name} cannot start on Ray node {self.address(spec.name)}: {e.cause}") from None
        except ray.exceptions.RayActorError as e:
            raise RunFailed(f"{spec.name}: its keeper on Ray node {self.address(spec.name)} is gone (did the node "
                            f"die?): {_first_line(e)}") from None
        return Child(spec, RayProc(actor, pid), log_dir / f"{spec.name}.log")

    def describe(self) -> str:
        return "; ".join(f"{name} on {s.node.address}" + (f" ({s.device})" if s.device else "")
                         for name, s in self.seats.items())

    def close(self) -> None:
        for actor in self.actors.values():
            ray.kill(actor)
        ray.shutdown()

    # ------------------------------------------------------------------ helpers

    def _wait_ready(self) -> None:
        calls = {name: actor.free_ports.remote([]) for name, actor in self.actors.items()}
        ready, pending = ray.wait(list(calls.values()), num_returns=len(calls), timeout=ACTOR_START_S)
        try:
            ray.get(ready)
        except ray.exceptions.RayError as e:  # e.g. the node's Python cannot import launch
            self.close()
            raise ValueError(f"launch.placement=\"ray\": a service keeper failed to start: {_first_line(e)}") from None
        if pending:
            late = [f"{n} on {self.address(n)}" for n, ref in calls.items() if ref in pending]
            self.close()
            raise ValueError(f"launch.placement=\"ray\": no keeper started within {ACTOR_START_S:.0f} s for "
                             f"{', '.join(late)}: are those nodes' CPUs/GPUs taken by other Ray jobs?")


class RayProc:
    """A service process on a Ray node, seen through its actor (the `Proc` of a Child)."""

    def __init__(self, actor: Any, pid: int) -> None:
        self.actor, self._pid, self._code = actor, pid, None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._code

    def poll(self) -> int | None:
        if self._code is None:
            try:
                self._code = ray.get(self.actor.poll.remote(self._pid), timeout=CALL_S)
            except ray.exceptions.RayActorError:
                self._code = KILLED
            except ray.exceptions.GetTimeoutError:
                log.warning("the keeper of pid %d did not answer within %.0f s", self._pid, CALL_S)
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self._pid} on a Ray node", timeout)
            time.sleep(0.1)
        return code

    def signal_group(self, sig: int) -> None:
        try:
            ray.get(self.actor.signal.remote(self._pid, sig), timeout=CALL_S)
        except ray.exceptions.RayActorError:
            pass  # the actor is gone, and its service with it


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
