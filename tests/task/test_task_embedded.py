"""The embedded model loads through the normal Hugging Face path and its tokenizer fits the task."""

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.task.config import TaskConfig
from asyncrl.task.embedded import embedded_model_path
from asyncrl.task.source import make_prompt_source


@pytest.fixture(scope="module")
def folder():
    return embedded_model_path()


def test_tokenizer_round_trips_task_strings(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    for p in itertools.islice(make_prompt_source(TaskConfig(), 1), 50):
        text = p.text + p.reward.target
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # one token per character
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok("12 - 3")["input_ids"] + [tok.eos_token_id]) == "<bos>12 - 3<eos>"


def test_model_loads_and_is_a_small_qwen2(folder):
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == "qwen2" and model.config.num_key_value_heads == 2
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(tok)
    assert 1e5 < sum(p.numel() for p in model.parameters()) < 2e6
    ids = torch.tensor([tok("37+48=")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()


def test_warm_started_model_is_right_sometimes(folder):
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [p for p in itertools.islice(make_prompt_source(TaskConfig(seed=99), 1), 64)]
    right = 0
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([tok(p.text)["input_ids"]])
            for _ in range(5):  # greedy
                nxt = model(input_ids=ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], 1)
                if nxt.item() == tok.eos_token_id:
                    break
            answer = tok.decode(ids[0, len(p.text) + 1 :], skip_special_tokens=True)
            right += answer == p.reward.target
    assert right >= 16, f"greedy accuracy {right}/64 is too low: was the warm start skipped?"
