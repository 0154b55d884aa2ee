"""Which tree a bench figure came from: the one `commit()` every bench records.

    commit()          this checkout: "ASYNCRL_COMMIT" when set, else git's short HEAD, "+dirty" when tracked files
                      differ from it
    commit(src)       another tree (a --baseline or --before directory): its own git, never ASYNCRL_COMMIT

"+dirty" is also what a copied tree with an old .git shows (the device machine's working tree comes without the
matching history), so a figure never names a commit that is not the code that ran; the caller then names the
tree it sent in ASYNCRL_COMMIT.
"""

from __future__ import annotations

import os
import subprocess

ENV = "ASYNCRL_COMMIT"


def commit(src: str | None = None) -> str:
    """The commit of `src` (None: this checkout, where ASYNCRL_COMMIT wins), "+dirty" if its tracked files were
    changed; "unknown" outside a git checkout."""
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
