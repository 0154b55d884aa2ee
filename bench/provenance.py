"""Which tree a bench figure came from: the one `commit()` every bench records.

    commit()          this checkout (HERE): "ASYNCRL_COMMIT" when set, else git's short HEAD, "+dirty" when tracked
                      files differ from it
    commit(src)       the tree at src: this checkout's answer when src is HERE, else its own git (a --baseline or
                      --before directory is never named by ASYNCRL_COMMIT)

"+dirty" is also what a copied tree with an old .git shows (the device machine's working tree comes without the
matching history), so a figure never names a commit that is not the code that ran; the caller then names the
tree it sent in ASYNCRL_COMMIT.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV = "ASYNCRL_COMMIT"
HERE = str(Path(__file__).resolve().parents[1])  # this checkout's root


def commit(src: str | None = None) -> str:
    """The commit of `src` (None or HERE: this checkout, where ASYNCRL_COMMIT wins), "+dirty" if its tracked files
    were changed; "unknown" outside a git checkout."""
    if src is not None and str(Path(src).resolve()) == HERE:
        src = None
    if src is None and os.environ.get(ENV):
        return os.environ[ENV]
    try:
        head = _git(src, "rev-parse", "--short", "HEAD")
        changed = _git(src, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if changed else "")


def _git(src: str | None, *args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=src).stdout.strip()
