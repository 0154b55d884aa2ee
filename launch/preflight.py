"""Checks that need the file system, run before any process starts: each failure is one line naming the key.

    load config -> preflight(cfg) -> placement (devices) -> run directory -> start processes

`ConfigError`s from here name the config key and the fix; the launcher prints them and exits 2.
Devices are checked by `launch.placement`; what the run directory must or must not hold by
`launch.run_dir`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from asyncrl.config.loader import ConfigError
from asyncrl.config.run import RunConfig
from launch.task_check import check_task_source


def preflight(cfg: RunConfig) -> None:
    check_model(cfg.model.path)
    check_lora_targets(cfg)
    check_task_files(cfg)
    check_task_source(cfg, cfg.eval.heldout_count())  # the feeder builds it only after the hub is up
    check_environment(cfg)


def check_lora_targets(cfg: RunConfig) -> None:
    """learner.lora_targets name linear layers the model has, and learner.lora_trainable modules with parameters
    (read from its config.json, no weights)."""
    if cfg.learner.lora_rank <= 0:
        return
    from asyncrl.models.config import resolve_model_path
    from asyncrl.learner.lora import check_targets

    try:
        check_targets(resolve_model_path(cfg.model), cfg.learner.lora_targets, cfg.learner.lora_trainable)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_environment(cfg: RunConfig) -> None:
    """generator.rollout.environment imports, has reset/step and takes its options (one is built here and
    dropped: an option it lacks or refuses is one line now, not every episode failed later); the environment
    reward needs an environment."""
    rollout = cfg.generator.rollout
    if rollout.multi_turn:
        from asyncrl.rollout.environment import EnvironmentLoadError, load_environment

        try:
            factory = load_environment(rollout.environment)
        except EnvironmentLoadError as e:
            raise ConfigError(str(e)) from None
        try:
            factory(**rollout.options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"generator.rollout.options of {rollout.environment}: {str(e)[:300]}") from None
    kinds = {c.kind for c in cfg.reward.components}
    if "environment" in kinds and not rollout.multi_turn:
        raise ConfigError("reward.components: kind 'environment' scores the environment's reward, but "
                          "generator.rollout.environment is not set; set it or use another reward kind")


def check_model(path: str) -> None:
    """model.path is "embedded", a folder whose config.json transformers can read, or a GGUF, converted
    here (once) so that every process finds its Hugging Face folder ready."""
    if path == "embedded":
        return
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigError(f'model.path={path!r} does not exist: give a Hugging Face model folder, a .gguf file '
                          'or "embedded"')
    folder = _converted_gguf(path) or folder
    if not folder.is_dir():
        raise ConfigError(f"model.path={path!r} is a file but not a .gguf: give a Hugging Face model folder or a "
                          ".gguf file")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError ... for a bad folder
        raise ConfigError(f"model.path={path!r}: transformers cannot load its config.json ({_first_line(e)}); "
                          "point it at a Hugging Face model folder") from None


def _converted_gguf(path: str) -> Path | None:
    """The Hugging Face folder of the GGUF that `path` names (converted now if needed), or None for no GGUF."""
    from asyncrl.models.gguf import GGUFError, converted, find_gguf

    try:
        gguf = find_gguf(path)
        return converted(gguf, say=lambda line: print(line, file=sys.stderr)) if gguf is not None else None
    except (GGUFError, OSError) as e:
        raise ConfigError(f"model.path={path!r}: {_first_line(e)}; fix or re-fetch the file "
                          "(python -m asyncrl.models list), or give a Hugging Face model folder") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_task_files(cfg: RunConfig) -> None:
    """Every file the task names exists."""
    for key in ("path",):
        value = getattr(cfg.task, key, "")
        if value and not Path(value).expanduser().exists():
            raise ConfigError(f"task.{key}={value!r} does not exist: fix the path (relative paths start at the "
                              f"directory you launch from, {Path.cwd()})")
