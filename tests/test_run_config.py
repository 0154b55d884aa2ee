"""The launch surface: one config file plus --set overrides; knobs live in component sections."""

import dataclasses

import pytest

from asyncrl.config.loader import ConfigError
from asyncrl.config.run import RunConfig, load_run_config
from launch.__main__ import EMBEDDED


def test_top_level_sections_are_the_components():
    # A new knob belongs in its component's config, not in a new top-level section or the launcher.
    assert [f.name for f in dataclasses.fields(RunConfig)] == [
        "model", "batch", "task", "hub", "generator", "reward", "learner", "launch", "eval"]


def test_embedded_preset_loads_and_overrides_apply():
    cfg = load_run_config(EMBEDDED, ["learner.steps=3", "batch.prompts_per_step=2"])
    assert cfg.model.path == "embedded" and cfg.learner.steps == 3
    assert cfg.batch.samples_per_step == 2 * cfg.batch.samples_per_prompt


@pytest.mark.parametrize("override, words", [
    ("learner.stepz=3", ["learner.stepz", "allowed keys"]),
    ("hub.max_staleness=-1", ["hub.max_staleness", ">= 0"]),
    ("generator.count=0", ["generator.count"]),
    ("generator.max_running=4", ["max_running", "samples_per_prompt"]),  # contradicts batch.samples_per_prompt=8
    ("nosuch.key=1", ["nosuch"]),
])
def test_bad_values_name_the_key(override, words):
    with pytest.raises(ConfigError) as e:
        load_run_config(EMBEDDED, [override])
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("name", ["gpu-1.toml", "gpu-2.toml"])
def test_shipped_configs_load(name):
    from pathlib import Path

    cfg = load_run_config(Path(__file__).resolve().parents[1] / "configs" / name, ["model.path=/models/x"])
    assert cfg.learner.devices and cfg.generator.devices and cfg.model.path == "/models/x"


def test_checkpoint_interval_beyond_the_hubs_commit_window_is_refused_at_load():
    """learner.checkpoint_every=100 used to crash at step 129 ("128 batches delivered and not committed")."""
    import pytest

    from asyncrl.config.loader import ConfigError
    from asyncrl.config.run import load_run_config

    with pytest.raises(ConfigError) as e:
        load_run_config(None, ["learner.steps=300", "learner.checkpoint_every=100"])
    assert "learner.checkpoint_every=100" in str(e.value) and "hub.max_uncommitted_steps >= 201" in str(e.value)
    cfg = load_run_config(None, ["learner.checkpoint_every=100", "hub.max_uncommitted_steps=201"])
    assert cfg.hub.max_uncommitted_steps == 201
    # a run no longer than one interval writes only its final checkpoint: all its steps fit the window
    assert load_run_config(None, ["learner.steps=10", "learner.checkpoint_every=100"]).learner.checkpoint_every == 100
    with pytest.raises(ConfigError, match="hub.max_uncommitted_steps >= 130"):
        load_run_config(None, ["learner.steps=129", "learner.checkpoint_every=200"])


def test_hub_shards_need_a_step_they_can_split_and_the_local_placement():
    assert load_run_config(None, ["hub.shards=2"]).hub.shards == 2  # 8 prompts per step: 4 on each shard
    with pytest.raises(ValueError, match=r"batch.prompts_per_step=8 is not a multiple of hub.shards=3"):
        load_run_config(None, ["hub.shards=3"])
    with pytest.raises(ValueError, match=r"hub.shards=0: must be >= 1"):
        load_run_config(None, ["hub.shards=0"])
    with pytest.raises(ValueError, match=r"hub.shards=2 with launch.placement='ray'.*launch.placement = \"local\""):
        load_run_config(None, ["hub.shards=2", "launch.placement=ray"])
