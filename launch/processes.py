"""Child processes of a run: spawn with a log file each, poll, stop politely then firmly."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(kw_only=True)
class ProcessSpec:
    name: str  # "replay", "generator-0", "reward-1", "learner-0", ...
    module: str  # python -m <module>
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    restartable: bool = False
    role: str = ""  # what it proves to the hub: "generator", "reward", "learner", "launcher" (the hub: "")


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen
    log_path: Path
    restarts: int = 0


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the launcher dies, even by SIGKILL (no orphans)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own SIGTERM / Ctrl-C handling still stops the children


def spawn(spec: ProcessSpec, log_dir: Path) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", spec.module, *spec.args], stdout=logf, stderr=subprocess.STDOUT, env=env,
            stdin=subprocess.DEVNULL, start_new_session=True,  # Ctrl-C reaches the launcher only
            preexec_fn=_die_with_parent,
        )
    return Child(spec, proc, log_path)


def stop(children: list[Child], grace_s: float = 20.0) -> None:
    """SIGTERM everyone, wait up to grace_s, then SIGKILL what is left."""
    for child in children:
        if child.proc.poll() is None:
            _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(child, signal.SIGKILL)
            child.proc.wait()


def _signal(child: Child, sig: int) -> None:
    try:
        os.killpg(child.proc.pid, sig)
    except ProcessLookupError:
        pass


def log_tail(child: Child, lines: int = 15) -> str:
    try:
        return "\n".join(child.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
