"""Records: their own validation (ValueErrors that name the field)."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl import records as R


def test_prompt_needs_exactly_one_of_text_or_tokens():
    with pytest.raises(ValueError, match="exactly one of token_ids or text"):
        R.Prompt(prompt_id="a", n=1)
    with pytest.raises(ValueError, match="exactly one"):
        R.Prompt(prompt_id="a", n=1, text="x", token_ids=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="n=0"):
        R.Prompt(prompt_id="a", n=0, text="x")


@pytest.mark.parametrize("kw, field", [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                                       ({"top_k": 0}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens")])
def test_sampling_params_name_the_bad_field(kw, field):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        R.SamplingParams(**kw)


def test_sample_states_cover_the_life_cycle():
    assert [s.value for s in R.SampleState] == ["queued", "leased", "generated", "scored", "delivered", "trained",
                                                 "dropped", "filtered", "failed"]
