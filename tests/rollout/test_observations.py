"""ObservationEncoder with a real Hugging Face tokenizer and a ChatML template (built here, byte-level)."""

from __future__ import annotations

import numpy as np
import pytest
from rollout_fakes import byte_tokenizer

from asyncrl.rollout.chat import ObservationEncoder, ObservationError
from asyncrl.rollout.environment import Observation

# SmolLM2-style: a default system prompt when none is given, ChatML turns.
CHATML = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer(CHATML)


def test_message_after_a_stopped_turn_is_the_templates_own_next_turn(tokenizer):
    enc = ObservationEncoder(tokenizer)
    eos = tokenizer.eos_token_id
    ids = enc.encode(Observation(message={"role": "user", "content": "higher"}), eos, len(tokenizer))
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    # the episode so far + the appended ids == what the template renders for the whole conversation
    convo = [{"role": "user", "content": "guess"}, {"role": "assistant", "content": "50"},
             {"role": "user", "content": "higher"}]
    full = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    start = tokenizer.apply_chat_template(convo[:1], tokenize=False, add_generation_prompt=True)
    assert start + "50<|im_end|>" + text == full
    assert [t for t in ids if t == tokenizer.convert_tokens_to_ids("<|im_start|>")]  # special tokens as such


def test_a_turn_cut_at_its_length_gets_the_closing_token(tokenizer):
    ids = ObservationEncoder(tokenizer).encode(Observation(message={"role": "tool", "content": "7"}), 65, None)
    assert tokenizer.decode(ids, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>tool\n7")


def test_token_and_text_observations(tokenizer):
    enc = ObservationEncoder(tokenizer)
    assert list(enc.encode(Observation(token_ids=[5, 6]), None, 100)) == [5, 6]
    assert tokenizer.decode(enc.encode(Observation(text=" again"), None, None)) == " again"
    assert enc.encode(Observation(token_ids=[]), None, 10).dtype == np.int32


@pytest.mark.parametrize("obs, why", [
    (Observation(), "exactly one"),
    (Observation(text="a", token_ids=[1]), "exactly one"),
    (Observation(token_ids=[1000]), "in \\[0, 100\\)"),
    (Observation(token_ids=[[1]]), "flat list"),
    (Observation(message={"role": "user"}), "'content'"),
    ("not an observation", "must be an Observation"),
])
def test_bad_observations_are_refused(tokenizer, obs, why):
    with pytest.raises(ObservationError, match=why):
        ObservationEncoder(tokenizer).encode(obs, None, 100)
