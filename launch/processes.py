"""Child processes of a run: spawn with a log file each, poll, stop politely then firmly.

A `Child` holds a `Proc`: `LocalProc` for a process this launcher started, or a handle to one a Ray actor
started on another node (`launch.ray_host.RayProc`); both signal the whole process group of the service.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(kw_only=True)
class ProcessSpec:
    name: str  # "replay", "generator-0", "reward-1", "learner-0", ...
    module: str  # python -m <module>
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    restartable: bool = False
    role: str = ""  # what it proves to the hub: "generator", "reward", "learner", "launcher" (the hub: "")


class Proc(Protocol):
    """A started service process, on this host or another: what the supervisor needs of it."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; subprocess.TimeoutExpired when it runs past `timeout`."""

    def signal_group(self, sig: int) -> None:
        """Send `sig` to its process group (the service and anything it started); gone already: nothing."""


class LocalProc:
    """A process of this host (`Popen`), started in a session of its own."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout=timeout)

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class Child:
    spec: ProcessSpec
    proc: Proc
    log_path: Path
    restarts: int = 0


def _in_child(parent: int) -> None:
    """Before exec: no signal blocked and SIGINT not ignored (a blocked mask and an ignored disposition both
    survive exec: a Ray worker that starts a service blocks SIGINT, and a launcher started as a shell
    script's background job ignores it; either would keep Ctrl-C from reaching the learner); and, on Linux,
    SIGTERM when the parent dies, even by SIGKILL (no orphans)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python then installs its KeyboardInterrupt handler
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the launcher's own SIGTERM / Ctrl-C handling still stops the children
    if os.getppid() != parent:  # the launcher died between fork and prctl: no signal will ever come
        os._exit(1)


# Idle OpenMP threads spin a short while, then sleep (libgomp spins 300,000 turns by default; a user's own setting
# wins). A run's services share the host's cores with each other and with whatever else runs there, and threads
# that spin starve them. Measured on a 2-core VM (2026-12-04, the embedded default): beside a second run, 40 steps
# did not finish in 300 s with the default spin, took 34 s with 10,000 and 17 s with OMP_WAIT_POLICY=PASSIVE;
# alone, 200 steps took 24 s with the default and with 10,000, but 47 s with PASSIVE.
CHILD_ENV_DEFAULTS = {"GOMP_SPINCOUNT": "10000"}


def spawn(spec: ProcessSpec, log_dir: Path, cwd: str | None = None) -> Child:
    """`python -m spec.module` on this host, its output in log_dir/<name>.log (cwd: default this process's)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    env = {**CHILD_ENV_DEFAULTS, **os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", spec.module, *spec.args], stdout=logf, stderr=subprocess.STDOUT, env=env,
            stdin=subprocess.DEVNULL, start_new_session=True,  # Ctrl-C reaches the launcher only
            preexec_fn=functools.partial(_in_child, os.getpid()), cwd=cwd,
        )
    return Child(spec, LocalProc(proc), log_path)


def stop(children: list[Child], grace_s: float = 20.0) -> None:
    """SIGTERM everyone, wait up to grace_s, then SIGKILL what is left."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.signal_group(signal.SIGKILL)
            child.proc.wait()


def log_tail(child: Child, lines: int = 15) -> str:
    try:
        return "\n".join(child.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
