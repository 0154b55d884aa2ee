"""Packed, fused logprobs equal a plain per-sequence HF forward's log_softmax(logits / T); the fused
lm_head + logprob function equals autograd through F.linear + log_softmax, in values and gradients."""

import numpy as np
import pytest
import torch
from learner_helpers import make_batch
from transformers import AutoModelForCausalLM

from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch
from asyncrl.learner.linear_logprob import linear_logprob
from asyncrl.learner.logprobs import reference_logprobs
from asyncrl.learner.model import PolicyModel


def _policy(path, chunk):
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    return PolicyModel(hf, value_head=False, chunk_tokens=chunk).eval()


def test_packed_equals_per_sequence(tiny_model):
    policy = _policy(tiny_model, chunk=5)
    seqs, _ = flatten_batch(make_batch(seed=1, groups=2, n=3, temperature=0.7))
    mb = build_micro_batch(seqs)
    with torch.no_grad():
        logp, entropy, _ = policy(mb.input_ids, mb.position_ids, mb.gather_idx, mb.targets, mb.temperature)
    full = [torch.from_numpy(np.concatenate([s.prompt, s.response]).astype(np.int64)) for s in seqs]
    ref = torch.cat(reference_logprobs(policy.hf, full, [len(s.prompt) for s in seqs], temperature=0.7))
    assert logp.shape == ref.shape == (sum(len(s.response) for s in seqs),)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
    assert (entropy > 0).all() and (entropy <= np.log(32) + 1e-4).all()


def test_greedy_temperature_means_raw_logits(tiny_model):
    seqs, _ = flatten_batch(make_batch(seed=2, groups=1, n=1, temperature=0.0))
    assert seqs[0].temperature == 1.0  # SGLang reports log_softmax(raw logits) for greedy requests


def _autograd_reference(h, w, targets, temp, softcap=None):
    logits = h @ w.t()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    lp = torch.log_softmax(logits / temp[:, None], -1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("keep_bytes", [0, 1 << 30])  # 0: chunked, logits recomputed in backward
def test_fused_equals_autograd_values_and_grads(softcap, keep_bytes):
    torch.manual_seed(0)
    n, hdim, vocab = 7, 8, 11
    h = torch.randn(n, hdim, dtype=torch.float64)
    w = torch.randn(vocab, hdim, dtype=torch.float64)
    targets = torch.randint(0, vocab, (n,))
    temp = torch.tensor([0.8, 1.0, 0.5, 1.3, 0.8, 1.0, 2.0], dtype=torch.float64)
    g = torch.arange(n, dtype=torch.float64) - 2.0
    results = []
    for fused in (True, False):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        if fused:
            lp, ent = linear_logprob(hh, ww, targets, temp, chunk=3, softcap=softcap, keep_bytes=keep_bytes)
        else:
            lp, ent = _autograd_reference(hh, ww, targets, temp, softcap)
        (lp * g).sum().backward()
        results.append((lp.detach().double(), ent.detach().double(), hh.grad, ww.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_fused_empty():
    h = torch.zeros(0, 4, requires_grad=True)
    lp, ent = linear_logprob(h, torch.randn(5, 4), torch.zeros(0, dtype=torch.long), torch.ones(0))
    assert lp.shape == ent.shape == (0,)
