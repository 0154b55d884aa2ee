"""Start, watch and stop the processes of one run.

    launcher ─spawn─▶ replay (or replay-0..N-1: hub.shards) ─▶ learner ranks ─▶ generators ─▶ reward workers
        │  on a Host (launch/host.py): this machine, or Ray nodes; each service binds the address of its node
        │  secret: RUN_DIR/secret (0600); each child gets its role's key in its environment
        │  feeder thread: keeps the hub's prompt queue topped up
        │  watch loop (every 0.5 s):
        │     a crashed hub, generator or reward worker is restarted (the hub from its log, on the same
        │       endpoint; the others reconnect on their own within launch.hub_reconnect_s) after a backoff
        │       (launch.restart_backoff_s doubling); a service that crashes launch.max_restarts times in a
        │       row without becoming healthy (launch/restarts.py) ends the run as a crash loop; a dead
        │       generator's leases are handed back at once (PeerDown); a crashed learner ends the run
        │     the progress watchdog ends a run with no learner step for launch.stall_timeout_s, with why
        └─ at the end: stop generators and reward workers, let the learner checkpoint and commit, then
           summary.json with the hub's final accounting (a dead hub is restarted to give it), then the hub

The run ends when every learner rank exits 0 (it ran learner.steps). Ctrl-C asks the learner to
checkpoint and stop (SIGINT to the learner ranks), then stops the rest.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

from asyncrl import records as R
from asyncrl.config.run import RunConfig
from asyncrl.net.credentials import Credentials, RunSecret, is_local
from asyncrl.net.endpoints import unix_endpoint
from asyncrl.run.feeder import Feeder
from asyncrl.net.hub_shards import metrics_key, shard_name
from asyncrl.net.peer import ENV_RECONNECT, HubPeer
from asyncrl.net.sharded_peer import ShardedPeer, hub_peer
from asyncrl.plot.evals import read_evals
from asyncrl.observe.prometheus import LOOPBACK, metrics_url
from asyncrl.run.rundir import last_metrics, write_json, write_run_json
from launch.host import Host, LocalHost
from launch.placement import Placement, nccl_env, run_placement
from launch.processes import Child, ProcessSpec, log_tail, stop
from launch.progress import Progress
from launch.restarts import RestartBudget
from launch.watchdog import ProgressWatchdog

log = logging.getLogger("launch")

HUB_READY_S = 60.0  # a (re)started hub answers within this (it replays its log first)


EXIT_CANNOT_START = 2  # a service that exits 2 cannot start as configured (e.g. a damaged journal): no restart


BASE_HOLDER = "base-holder"  # the process that owns the shared base image (generator.share_base)


class RunFailed(RuntimeError):
    pass


class Supervisor:
    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool, placement: Placement | None = None,
                 host: Host | None = None) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.placement = placement or run_placement(cfg)
        self.host = host or LocalHost(cfg.launch.host)
        self._taken: set[int] = set()
        # The hub binds its host's address, learner rank 0 its own (weights socket, both rendezvous stores);
        # Prometheus endpoints are on loopback where each runs (the hub keeps its ports across restarts).
        self.hubs = [shard_name(k, cfg.hub.shards) for k in range(cfg.hub.shards)]  # one process per hub shard
        hub_at, self.master_addr = self.host.address("replay"), self.host.address("learner-0")
        hub_ports = [self._ports(name, [hub_at, LOOPBACK]) for name in self.hubs]  # (endpoint, metrics) per shard
        weights_port, self.master_port, learner_metrics = self._ports("learner-0", [self.master_addr] * 2 + [LOOPBACK])
        shards = [self._hub_endpoint(name, hub_at, port) for name, (port, _) in zip(self.hubs, hub_ports)]
        self.endpoints: dict[str, Any] = {"replay": shards[0], "replay_shards": shards,
                                          "weights": f"tcp://{self.master_addr}:{weights_port}"}
        self.metrics_endpoints = ({**{metrics_key(k): metrics_url(m) for k, (_, m) in enumerate(hub_ports)},
                                   "learner": metrics_url(learner_metrics)} if cfg.launch.prometheus else {})
        self.secret = RunSecret.ensure(run_dir)
        self.credentials = Credentials.for_role(self.secret, "launcher")
        # This process's own peers (the feeder, the readiness probe) are given these credentials; the process
        # environment is left alone (a launcher inside another program, a bench or a test, must not change
        # which role that program's later peers prove).
        self.children: dict[str, Child] = {}
        self.budgets: dict[str, RestartBudget] = {}
        self.pending: dict[str, float] = {}  # service -> monotonic time of its restart (after the backoff)
        self.feeder: Feeder | None = None
        self.peer: HubPeer | ShardedPeer | None = None
        batch_samples = cfg.batch.prompts_per_step * cfg.batch.samples_per_prompt
        self.watchdog = ProgressWatchdog(cfg.launch.stall_timeout_s, fail_fast_samples=2 * batch_samples)

    # ------------------------------------------------------------------ specs

    def _child_env(self, role: str) -> dict[str, str]:
        return {**Credentials.for_role(self.secret, role).to_env(), ENV_RECONNECT: str(self.cfg.launch.hub_reconnect_s)}

    def _service(self, name: str, module: str, role: str, device: str | None = None, **kw: Any) -> ProcessSpec:
        args = ["--run-dir", str(self.run_dir), "--name", name, *(["--device", device] if device else [])]
        env = {**self._child_env(role), **kw.pop("env", {})}
        return ProcessSpec(name=name, module=module, args=args, env=env, role=role, **kw)

    def specs(self) -> list[ProcessSpec]:
        cfg = self.cfg
        out = [ProcessSpec(name=name, module="services.replay", restartable=True,
                           args=["--run-dir", str(self.run_dir), "--name", name]) for name in self.hubs]
        if cfg.generator.share_base:  # before the learner and generators, which map its image (not restarted)
            out.append(ProcessSpec(name=BASE_HOLDER, module="services.base_holder",
                                   args=["--run-dir", str(self.run_dir), "--name", BASE_HOLDER,
                                         "--device", self.placement.learner[0]]))
        world = cfg.learner.ranks
        gpu = nccl_env() if any(d.startswith("cuda") for d in self.placement.learner + self.placement.generators) else {}
        for rank, device in enumerate(self.placement.learner):
            env = {**gpu, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}
            out.append(self._service(f"learner-{rank}", "services.learner", "learner", device, env=env))
        for i, device in enumerate(self.placement.generators):
            out.append(self._service(f"generator-{i}", "services.generator", "generator", device, restartable=True,
                                     env=dict(gpu)))
        for i in range(cfg.reward.workers):
            out.append(self._service(f"reward-{i}", "services.reward", "reward", restartable=True))
        return out

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        if self.cfg.generator.share_base:
            from asyncrl.weights import base_image

            base_image.clear(self.run_dir)  # an earlier launch's image is gone with its holder
        self._write_run_json()
        for spec in self.specs():
            self.children[spec.name] = self.host.spawn(spec, self.run_dir / "logs")
            self.budgets[spec.name] = self._budget()
            self._write_run_json()
            if spec.name == self.hubs[-1]:
                self.peer = hub_peer(self.endpoints["replay_shards"], "launcher", timeout_s=HUB_READY_S,
                                     credentials=self.credentials, reconnect_s=0)
                self.peer.request(R.StatsRequest())  # waits until every shard answers
                self.peer.timeout_s = 3.0  # the watch loop must not stall on a dead hub
        self.feeder = Feeder(self.cfg, self.endpoints["replay_shards"], self.run_dir, credentials=self.credentials)
        self.feeder.start()

    def _budget(self) -> RestartBudget:
        c = self.cfg.launch
        return RestartBudget(c.max_restarts, c.restart_window_s, backoff_s=c.restart_backoff_s,
                             backoff_max_s=c.restart_backoff_max_s, healthy_after_s=c.healthy_after_s)

    def watch(self, progress: Progress) -> None:
        last_step = int(last_metrics(self.run_dir).get("step", 0))  # a resumed run starts past 0: not progress
        while True:
            step = int(last_metrics(self.run_dir).get("step", 0))
            if step != last_step:  # the run trains: every service up now is healthy (launch/restarts.py)
                last_step = step
                for budget in self.budgets.values():
                    budget.progress()
            # after the step is read: a service that crashed right after steps it was up for (a turn of this
            # loop can take seconds while the hub is down) is not one crash more in a row
            self._check_children()
            learners = [c for n, c in self.children.items() if n.startswith("learner")]
            if all(c.proc.poll() == 0 for c in learners):
                return
            stats = self._stats()
            progress.update(stats)
            stalled = self.watchdog.check(step, stats)
            if stalled:
                raise RunFailed(stalled)
            time.sleep(0.5)

    def interrupt(self) -> None:
        """Ctrl-C: the learner checkpoints and exits; wait for it, bounded."""
        for name, child in self.children.items():
            if name.startswith("learner") and child.proc.poll() is None:
                child.proc.signal_group(signal.SIGINT)
        deadline = time.monotonic() + 120
        for name, child in self.children.items():
            if name.startswith("learner"):
                while child.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)

    def finish(self) -> dict:
        """Stop every service but the hub at once (a learner still running checkpoints and commits), read the
        final accounting, stop the hub."""
        if self.feeder is not None:
            self.feeder.stop()
        # together: each ends on its own; the hub stays, and the base holder, whose memory the others read to the end
        stop([c for n, c in self.children.items() if n not in self.hubs and n != BASE_HOLDER])
        stats = self._final_stats()
        if self.peer is not None:
            try:
                self.peer.request(R.Shutdown(reason="run finished"))
            except Exception:  # noqa: BLE001 - the hub may already be gone
                pass
        stop([c for n, c in self.children.items() if n in self.hubs or n == BASE_HOLDER])
        if self.peer is not None:
            self.peer.close()
        self.host.close()
        accounting = stats.get("accounting") or {
            "error": "the hub did not answer at the end; its log in the run directory still holds the state: "
                     "`python -m launch --resume RUN_DIR` continues the run and reports it"}
        evals = read_evals(self.run_dir)  # held-out, strict: first and last (every round is in eval.jsonl)
        summary = {"accounting": accounting, "hub": stats,
                   "eval": {"first": evals[0], "last": evals[-1], "rounds": len(evals)} if evals else None,
                   "exit_codes": {n: c.proc.returncode for n, c in self.children.items()},
                   "restarts": {n: b.total for n, b in self.budgets.items()}}
        write_json(self.run_dir / "summary.json", summary)
        return summary

    # ------------------------------------------------------------------ helpers

    def _check_children(self) -> None:
        if self.feeder is not None and self.feeder.error is not None:
            raise RunFailed(f"the prompt feeder stopped: {self.feeder.error!r}")
        now = time.monotonic()
        for name, due in list(self.pending.items()):  # restarts whose backoff is over
            if now >= due:
                del self.pending[name]
                self.children[name] = self.host.spawn(self.children[name].spec, self.run_dir / "logs")
                self.budgets[name].started()
                self._write_run_json()
        for name, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None or (code == 0 and name.startswith("learner")) or name in self.pending:
                continue
            if not child.spec.restartable or code == EXIT_CANNOT_START:
                raise RunFailed(f"{name} exited with code {code}; last lines of {child.log_path}:\n{log_tail(child)}")
            self._restart(name, child, code)

    def _restart(self, name: str, child: Child, code: int) -> None:
        if child.spec.role == "generator":
            self._report_down(child, code)
        delay = self.budgets[name].take()
        if delay is None:
            raise RunFailed(f"{self.budgets[name].spent_message(name)}; last lines:\n{log_tail(child)}")
        log.warning("%s exited with code %s; restarting in %.1f s (%d crashes in a row allowed)", name, code, delay,
                    self.cfg.launch.max_restarts)
        self.pending[name] = time.monotonic() + delay

    def _report_down(self, child: Child, code: int) -> None:
        """Its leases go back to the queue now instead of at hub.lease_timeout_s."""
        if self.peer is None:
            return
        try:
            self.peer.request(R.PeerDown(service=child.spec.role, name=child.spec.name, reason=f"exit code {code}"))
        except Exception as e:  # noqa: BLE001 - the hub may be down too; its leases then expire as usual
            log.warning("could not report %s down to the hub: %s", child.spec.name, e)

    def _final_stats(self) -> dict:
        hubs = [n for n in self.hubs if n in self.children]
        if not hubs:
            return self._stats()
        for name in hubs:
            hub = self.children[name]
            if hub.proc.poll() is not None and self.budgets[name].take() is not None:  # no backoff at the end
                log.warning("%s is down at the end; restarting it from its log for the final accounting", name)
                self.children[name] = self.host.spawn(hub.spec, self.run_dir / "logs")
        deadline = time.monotonic() + HUB_READY_S
        while True:
            stats = self._stats()
            if stats or time.monotonic() > deadline or any(self.children[n].proc.poll() is not None for n in hubs):
                return stats

    def _stats(self) -> dict:
        if self.peer is None:
            return {}
        try:
            return self.peer.request(R.StatsRequest()).counters
        except Exception:  # noqa: BLE001 - progress must not kill the run
            return {}

    def _hub_endpoint(self, name: str, address: str, port: int) -> str:
        """Where the hub (shard) `name` binds: a Unix socket in the run directory when every peer is on this host
        (`launch.unix_sockets`), else TCP on its host's address."""
        tcp = f"tcp://{address}:{port}"
        if not (self.cfg.launch.unix_sockets and self.cfg.launch.placement == "local" and is_local(tcp)):
            return tcp
        unix = unix_endpoint(self.run_dir, name)
        if unix is None:
            log.info("no Unix socket can live in the run directory %s (a path over 107 bytes, or a file system that "
                     "refuses them); the hub listens on %s", self.run_dir, tcp)
        return unix or tcp

    def _ports(self, name: str, addresses: list[str]) -> list[int]:
        """Free ports where `name` runs, none picked before in this run (two services may share a host)."""
        while True:
            ports = self.host.free_ports(name, addresses)
            if not self._taken.intersection(ports):
                self._taken.update(ports)
                return ports

    def _write_run_json(self) -> None:
        pids = {n: c.proc.pid for n, c in self.children.items()}
        addresses = {n: self.host.address(n) for n in self.children}  # a pid is one of the process at that address
        write_run_json(self.run_dir, {"endpoints": self.endpoints, "pids": pids, "addresses": addresses,
                                               "master_port": self.master_port,
                                               "metrics_endpoints": self.metrics_endpoints})
