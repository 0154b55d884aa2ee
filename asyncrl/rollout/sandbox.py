"""`run_python`: the Python executor behind the tool environment, in a throwaway sandbox.

    fresh temp dir ─► unshare --user --mount --net ─► every mount read-only but the temp dir ─► python -I main.py
                      (no network: a namespace with no interface up)                      rlimits: CPU, memory,
                                                                                          file size, open files

The child starts in a new session with an empty environment, its working directory and HOME the temp
dir, and is killed with its whole process group at the wall-clock limit; the temp dir is removed
afterwards. Output is cut at `output_bytes`. Where user namespaces are not available (`unshare` missing or
not permitted) `run_python` raises SandboxUnavailable rather than run code unconfined.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Runs inside the new namespaces: the temp dir ($1) stays writable, every other mount becomes read-only.
_CONFINE = r"""
d="$1"; shift
mount --make-rprivate / 2>/dev/null
mount --bind "$d" "$d" || exit 97
awk '{print $2}' /proc/self/mounts | while read -r m; do mount -o remount,bind,ro "$m" 2>/dev/null; done
mount -o remount,bind,rw "$d" || exit 97
cd "$d" && exec "$@"
"""
CONFINE_FAILED = 97


class SandboxUnavailable(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 2
    memory_mb: int = 512
    file_mb: int = 16
    open_files: int = 64
    output_bytes: int = 8192


@dataclass(frozen=True, slots=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None: killed at the wall-clock limit
    timed_out: bool

    def summary(self) -> str:
        """What a tool answers the model: the output, or why there is none."""
        if self.timed_out:
            return "error: the program ran out of time"
        if self.exit_code:
            return f"error (exit {self.exit_code}): {self.stderr.strip()[-500:]}"
        return self.stdout.strip() or "(no output)"


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable("the Python tool needs util-linux's unshare (user, mount and network namespaces)")
    work = tempfile.mkdtemp(prefix="asyncrl-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w") as f:
            f.write(code)
        cmd = [unshare, "--user", "--map-root-user", "--mount", "--net", "sh", "-c", _CONFINE, "sh", work,
               sys.executable, "-I", "main.py"]
        result = _run(cmd, work, limits)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result.exit_code == CONFINE_FAILED or "unshare:" in result.stderr[:200]:
        raise SandboxUnavailable(f"could not confine the Python tool: {result.stderr.strip()[:200]}")
    return result


def _run(cmd: list[str], work: str, limits: SandboxLimits) -> SandboxResult:
    proc = subprocess.Popen(cmd, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "HOME": work, "PYTHONDONTWRITEBYTECODE": "1"},
                            start_new_session=True, preexec_fn=lambda: _limit(limits))
    try:
        out, err = proc.communicate(timeout=limits.wall_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    cut = limits.output_bytes
    return SandboxResult(stdout=out[:cut].decode(errors="replace"), stderr=err[:cut].decode(errors="replace"),
                         exit_code=None if timed_out else proc.returncode, timed_out=timed_out)


def _limit(limits: SandboxLimits) -> None:
    """In the child before exec: hard resource limits, inherited by everything it starts."""
    mb = 1 << 20
    for what, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb * mb),
                        (resource.RLIMIT_FSIZE, limits.file_mb * mb), (resource.RLIMIT_NOFILE, limits.open_files),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (value, value))
