"""Checks that need the file system, run before any process starts: each failure is one line naming the key.

    load config -> preflight(cfg) -> placement (devices) -> run directory -> start processes

`ConfigError`s from here name the config key and the fix; the launcher prints them and exits 2.
Devices are checked by `launch.placement`; what the run directory must or must not hold by
`launch.run_dir`.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.config.loader import ConfigError
from asyncrl.config.run import RunConfig


def preflight(cfg: RunConfig) -> None:
    check_model(cfg.model.path)
    check_task_files(cfg)


def check_model(path: str) -> None:
    """model.path is "embedded" or a folder whose config.json transformers can read."""
    if path == "embedded":
        return
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f'model.path={path!r} does not exist: give a Hugging Face model folder or "embedded"')
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError ... for a bad folder
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"model.path={path!r}: transformers cannot load its config.json ({first}); "
                          "point it at a Hugging Face model folder") from None


def check_task_files(cfg: RunConfig) -> None:
    """Every file the task names exists."""
    for key in ("path",):
        value = getattr(cfg.task, key, "")
        if value and not Path(value).expanduser().exists():
            raise ConfigError(f"task.{key}={value!r} does not exist: fix the path (relative paths start at the "
                              f"directory you launch from, {Path.cwd()})")
