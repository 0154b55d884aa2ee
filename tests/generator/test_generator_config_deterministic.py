"""generator.deterministic: only the torch engine has it (the learner re-scores with its code)."""

import pytest

from asyncrl.generator.config import GeneratorConfig


def test_deterministic_needs_the_torch_engine():
    assert GeneratorConfig(deterministic=True).deterministic
    with pytest.raises(ValueError, match="generator.deterministic=true needs generator.engine='torch'"):
        GeneratorConfig(engine="sglang", deterministic=True)
