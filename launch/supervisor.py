"""Start, watch and stop the processes of one run.

    launcher ─spawn─▶ replay ─▶ learner ranks ─▶ generators ─▶ reward workers
        │  feeder thread: keeps the hub's prompt queue topped up
        │  watch loop: restart crashed generators / reward workers (up to launch.max_restarts);
        │              a crashed hub or learner ends the run with its log tail
        └─ at the end: summary.json with the hub's final accounting

The run ends when every learner rank exits 0 (it ran learner.steps). Ctrl-C asks the learner to
checkpoint and stop (SIGINT to the learner ranks), then stops the rest.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import torch

from asyncrl.config.run import RunConfig
from asyncrl.feeder import Feeder
from asyncrl.peer import HubPeer
from asyncrl import records as R
from launch.processes import Child, ProcessSpec, log_tail, spawn, stop
from launch.progress import Progress
from asyncrl.rundir import write_json
from launch.run_dir import free_port

log = logging.getLogger("launch")


class RunFailed(RuntimeError):
    pass


def default_device(i: int) -> str:
    if torch.cuda.is_available():
        return f"cuda:{i % torch.cuda.device_count()}"
    return "cpu"


class Supervisor:
    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        host = cfg.launch.host
        self.endpoints = {"replay": f"tcp://{host}:{free_port(host)}", "weights": f"tcp://{host}:{free_port(host)}"}
        self.master_port = free_port(host)
        self.children: dict[str, Child] = {}
        self.feeder: Feeder | None = None
        self.peer: HubPeer | None = None

    # ------------------------------------------------------------------ specs

    def _common(self, name: str) -> list[str]:
        return ["--run-dir", str(self.run_dir), "--name", name]

    def specs(self) -> list[ProcessSpec]:
        cfg = self.cfg
        out = [ProcessSpec(name="replay", module="services.replay",
                           args=["--run-dir", str(self.run_dir), "--endpoint", self.endpoints["replay"]])]
        world = cfg.learner.ranks
        for rank in range(world):
            device = cfg.learner.devices[rank] if cfg.learner.devices else default_device(rank)
            env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": cfg.launch.host, "MASTER_PORT": str(self.master_port)}
            out.append(ProcessSpec(name=f"learner-{rank}", module="services.learner",
                                   args=[*self._common(f"learner-{rank}"), "--device", device], env=env))
        for i in range(cfg.generator.count):
            device = cfg.generator.devices[i] if cfg.generator.devices else default_device(i)
            out.append(ProcessSpec(name=f"generator-{i}", module="services.generator",
                                   args=[*self._common(f"generator-{i}"), "--device", device], restartable=True))
        for i in range(cfg.reward.workers):
            out.append(ProcessSpec(name=f"reward-{i}", module="services.reward",
                                   args=["--run-dir", str(self.run_dir), "--name", f"reward-{i}"], restartable=True))
        return out

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        self._write_run_json()
        for spec in self.specs():
            self.children[spec.name] = spawn(spec, self.run_dir / "logs")
            self._write_run_json()
            if spec.name == "replay":
                self.peer = HubPeer(self.endpoints["replay"], "launcher", timeout_s=60.0)
                self.peer.request(R.StatsRequest())  # waits until the hub answers
                self.peer.timeout_s = 10.0
        self.feeder = Feeder(self.cfg, self.endpoints["replay"], self.run_dir)
        self.feeder.start()

    def watch(self, progress: Progress) -> None:
        while True:
            self._check_children()
            learners = [c for n, c in self.children.items() if n.startswith("learner")]
            if all(c.proc.poll() == 0 for c in learners):
                return
            progress.update(self._stats())
            time.sleep(0.5)

    def interrupt(self) -> None:
        """Ctrl-C: the learner checkpoints and exits; wait for it, bounded."""
        for name, child in self.children.items():
            if name.startswith("learner") and child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 120
        for name, child in self.children.items():
            if name.startswith("learner"):
                while child.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)

    def finish(self) -> dict:
        stats = self._stats()
        if self.feeder is not None:
            self.feeder.stop()
        if self.peer is not None:
            try:
                self.peer.request(R.Shutdown(reason="run finished"))
            except Exception:  # noqa: BLE001 - the hub may already be gone
                pass
        order = ["generator", "reward", "learner", "replay"]
        for prefix in order:
            stop([c for n, c in self.children.items() if n.startswith(prefix)])
        if self.peer is not None:
            self.peer.close()
        summary = {"accounting": stats.get("accounting", {}), "hub": stats,
                   "exit_codes": {n: c.proc.returncode for n, c in self.children.items()},
                   "restarts": {n: c.restarts for n, c in self.children.items()}}
        write_json(self.run_dir / "summary.json", summary)
        return summary

    # ------------------------------------------------------------------ helpers

    def _check_children(self) -> None:
        if self.feeder is not None and self.feeder.error is not None:
            raise RunFailed(f"the prompt feeder stopped: {self.feeder.error!r}")
        for name, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None or (code == 0 and name.startswith("learner")):
                continue
            if not child.spec.restartable:
                raise RunFailed(f"{name} exited with code {code}; last lines of {child.log_path}:\n{log_tail(child)}")
            if child.restarts >= self.cfg.launch.max_restarts:
                raise RunFailed(f"{name} crashed {child.restarts + 1} times (launch.max_restarts="
                                f"{self.cfg.launch.max_restarts}); last lines:\n{log_tail(child)}")
            log.warning("%s exited with code %s; restarting (%d/%d)", name, code, child.restarts + 1,
                        self.cfg.launch.max_restarts)
            fresh = spawn(child.spec, self.run_dir / "logs")
            fresh.restarts = child.restarts + 1
            self.children[name] = fresh
            self._write_run_json()

    def _stats(self) -> dict:
        if self.peer is None:
            return {}
        try:
            return self.peer.request(R.StatsRequest()).counters
        except Exception:  # noqa: BLE001 - progress must not kill the run
            return {}

    def _write_run_json(self) -> None:
        pids = {n: c.proc.pid for n, c in self.children.items()}
        write_json(self.run_dir / "run.json", {"endpoints": self.endpoints, "pids": pids,
                                               "master_port": self.master_port})
