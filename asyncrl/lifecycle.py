"""Process life cycle shared by the services: logging set-up and a stop flag set by signals.

SIGTERM (launcher stopping the run) and SIGINT (Ctrl-C forwarded to the learner) set the flag; the
service finishes its current unit of work (a decode step, a learner step + checkpoint) and leaves
through its `finally`. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import os
import threading
from pathlib import Path

from asyncrl.credentials import Credentials, RunSecret


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def install(self) -> "StopFlag":
        def handler(signum: int, _frame: object) -> None:
            if self.is_set():
                raise SystemExit(128 + signum)
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


def service_args(description: str) -> argparse.Namespace:
    """The arguments the launcher gives a device-bound service: --run-dir, --name, --device."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--run-dir", required=True, help="run directory: config.json and run.json (endpoints)")
    p.add_argument("--name", required=True, help="process name, e.g. generator-0")
    p.add_argument("--device", default="cpu", help='"cpu", "cuda:0", ...')
    return p.parse_args()
