"""Config loading: unknown keys, wrong types, overrides, and the hub's own validation."""

from __future__ import annotations

import dataclasses

import pytest

from asyncrl.config.loader import ConfigError, parse_override
from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.replay.config import HubConfig


def test_defaults_load_and_overrides_apply():
    cfg = load_run_config(None, ["hub.max_staleness=3", "hub.fsync=always", "batch.prompts_per_step=4"])
    assert cfg.hub.max_staleness == 3 and cfg.hub.fsync == "always" and cfg.batch.prompts_per_step == 4


def test_toml_file_and_override_precedence(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[hub]\nmax_staleness = 2\nlease_timeout_s = 5\n")
    cfg = load_run_config(path, ["hub.max_staleness=4"])
    assert cfg.hub.max_staleness == 4 and cfg.hub.lease_timeout_s == 5.0


@pytest.mark.parametrize("override, message", [
    ("hub.nope=1", "unknown key hub.nope"),
    ("nosection.x=1", "unknown key nosection"),
    ("hub.max_staleness=yes", "hub.max_staleness='yes': expected int"),
    ("hub.fsync=sometimes", "allowed values"),
    ("hub.max_staleness=-1", "hub.max_staleness=-1: must be >= 0"),
    ("hub.log=1", "expected bool"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_run_config(None, [override])


def test_override_syntax():
    assert parse_override("a.b=1e-5") == (["a", "b"], 1e-5)
    assert parse_override("a.b=word") == (["a", "b"], "word")
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("novalue")


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[hub\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_run_config(bad)


@pytest.mark.parametrize("field, value", [("lease_timeout_s", 0), ("max_frame_bytes", 10), ("max_queued_prompts", 0),
                                          ("score_timeout_s", 0), ("max_uncommitted_steps", 0),
                                          ("max_samples_per_prompt", 0), ("max_wait_s", 0)])
def test_hub_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"hub.{field}="):
        HubConfig(**{field: value})


def test_every_hub_field_has_a_docstring():
    import inspect

    src = inspect.getsource(HubConfig)
    for f in dataclasses.fields(HubConfig):
        after = src.split(f"    {f.name}:", 1)[1].splitlines()[1].strip()
        assert after.startswith('"""'), f"hub.{f.name} has no docstring"


def test_run_config_sections_are_fixed():
    assert [f.name for f in dataclasses.fields(RunConfig)] == [
        "model", "batch", "task", "hub", "generator", "reward", "learner", "launch", "eval"]
