"""Process life cycle shared by the services: logging set-up and a stop flag set by signals.

SIGTERM (launcher stopping the run) and SIGINT (Ctrl-C forwarded to the learner) set the flag; the
service finishes its current unit of work (a decode step, a learner step + checkpoint, a hub loop turn)
and leaves through its `finally`. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from asyncrl.credentials import Credentials, RunSecret


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


def service_args(description: str, *, device: bool = False, argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments the launcher gives every service: --run-dir and --name (and --device for the
    device-bound ones). Everything else comes from the run directory: config.json and run.json."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--run-dir", required=True, help="run directory: config.json and run.json (endpoints)")
    p.add_argument("--name", required=True, help="process name, e.g. generator-0")
    if device:
        p.add_argument("--device", default="cpu", help='"cpu", "cuda:0", ...')
    return p.parse_args(argv)
