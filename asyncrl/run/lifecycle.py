"""Process life cycle shared by the services: logging set-up and a stop flag set by signals.

SIGTERM (launcher stopping the run) and SIGINT (Ctrl-C forwarded to the learner) set the flag; the
service finishes its current unit of work (a decode step, a learner step + checkpoint, a hub loop turn)
and leaves through its `finally`. A second signal exits at once; one within REPEAT_S of the first is the
same stop delivered twice (the parent-death signal and a process-group kill arrive ms apart) and is ignored.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config.run import RunConfig
from asyncrl.net.credentials import Credentials, RunSecret
from asyncrl.run.rundir import load_config, read_run_json


REPEAT_S = 0.5


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        self._event.set()
        for callback in self._callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Also call `callback` when the flag is set (at once if it is already), e.g. a loop's own stop()
        that only flips a field; it may run inside a signal handler."""
        self._callbacks.append(callback)
        if self.is_set():
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def install(self) -> "StopFlag":
        first: list[float] = []  # when the first signal came

        def handler(signum: int, _frame: object) -> None:
            # Plain assignments before anything that takes a lock: a signal can interrupt this handler, and
            # a nested Event.set() would deadlock on the Event's lock (seen: a hub hung for minutes).
            now = time.monotonic()
            if first:
                if now - first[0] >= REPEAT_S:
                    raise SystemExit(128 + signum)
                return  # the same stop delivered twice: the parent-death signal and a group kill, ms apart
            first.append(now)
            self.signal = signum
            self.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        return self


def adopt_credentials(run_dir: str | Path, role: str) -> None:
    """A service started by hand (no key from the launcher in its environment) proves `role` with the run
    directory's secret (created if this process comes before the hub: the first creator wins, atomically);
    HubPeer reads the credentials from the environment."""
    if Credentials.from_env() is None:
        os.environ.update(Credentials.for_role(RunSecret.ensure(run_dir), role).to_env())


def setup_logging(name: str, level: int = logging.INFO) -> logging.Logger:
    logging.basicConfig(stream=sys.stderr, level=level,
                        format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s")
    return logging.getLogger(name)


@dataclass(frozen=True, slots=True)
class ServiceStart:
    """What every service has once started: its arguments, logger, stop flag, the run's config and run.json."""

    args: argparse.Namespace
    log: logging.Logger
    stop: StopFlag
    cfg: RunConfig
    run: dict[str, Any]  # run.json: endpoints, metrics_endpoints, addresses, pids


def start_service(description: str, role: str | None, *, device: bool = False,
                  argv: list[str] | None = None) -> ServiceStart:
    """Every service's first steps, in one order: arguments (--run-dir, --name[, --device]), logging, the
    stop flag (SIGTERM/SIGINT), the run's config.json and run.json, and, for a role that talks to the hub,
    credentials proving it (the hub itself passes None: it holds the secret)."""
    args = service_args(description, device=device, argv=argv)
    log = setup_logging(args.name)
    # Registered first, so it runs after every other exit handler: the interpreter's last collections then
    # skip the objects torch and transformers made (about 1 s of every service's exit, measured on 2 cores).
    # Each service closes what it owns in its own `finally` before this.
    atexit.register(gc.freeze)
    stop = StopFlag().install()
    cfg, run = load_config(args.run_dir), read_run_json(args.run_dir)
    if role is not None:
        adopt_credentials(args.run_dir, role)
    return ServiceStart(args=args, log=log, stop=stop, cfg=cfg, run=run)


def service_args(description: str, *, device: bool = False, argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments the launcher gives every service: --run-dir and --name (and --device for the
    device-bound ones). Everything else comes from the run directory: config.json and run.json."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--run-dir", required=True, help="run directory: config.json and run.json (endpoints)")
    p.add_argument("--name", required=True, help="process name, e.g. generator-0")
    if device:
        p.add_argument("--device", default="cpu", help='"cpu", "cuda:0", ...')
    return p.parse_args(argv)
