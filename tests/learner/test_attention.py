"""The learner's varlen attention as a Hugging Face attention implementation: packed rows attend per
sequence (the CPU path: one causal SDPA per sequence), plain calls (with or without padding) match sdpa."""

import numpy as np
import pytest
import torch
from learner_helpers import make_batch
from transformers import AutoModelForCausalLM

from asyncrl.learner import attention
from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch
from asyncrl.learner.logprobs import reference_logprobs
from asyncrl.learner.model import PolicyModel


@pytest.fixture(scope="module")
def models(tiny_model):
    name = attention.register()
    load = lambda impl: AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=impl).eval()
    return load(name), load("sdpa")


def test_packed_varlen_equals_per_sequence_forward(models):
    varlen, _ = models
    policy = PolicyModel(varlen, value_head=False, chunk_tokens=5).eval()
    seqs, _ = flatten_batch(make_batch(seed=7, groups=3, n=3, temperature=0.9))
    mb = build_micro_batch(seqs)
    with torch.no_grad():
        logp, _, _ = policy(mb.input_ids, mb.position_ids, mb.gather_idx, mb.targets, mb.temperature,
                            mb.cu_seqlens, mb.max_seqlen)
    full = [torch.from_numpy(np.concatenate([s.prompt, s.response]).astype(np.int64)) for s in seqs]
    ref = torch.cat(reference_logprobs(varlen, full, [len(s.prompt) for s in seqs], temperature=0.9))
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
    assert mb.cu_seqlens.tolist()[-1] == mb.num_tokens and mb.max_seqlen == max(s.num_input_tokens for s in seqs)


def test_plain_calls_match_sdpa_with_and_without_padding(models):
    varlen, sdpa = models
    ids = torch.randint(0, varlen.config.vocab_size, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            a, b = varlen(input_ids=ids, **kwargs).logits, sdpa(input_ids=ids, **kwargs).logits
            torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=0)


def test_cu_seqlens():
    assert attention.cu_seqlens([3, 1, 4]).tolist() == [0, 3, 4, 8]
    assert attention.cu_seqlens([3]).dtype == torch.int32
