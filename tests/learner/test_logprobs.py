"""Packed, chunked logprobs equal a plain per-sequence HF forward's log_softmax(logits / T)."""

import numpy as np
import torch
from learner_helpers import make_batch
from transformers import AutoModelForCausalLM

from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch
from asyncrl.learner.logprobs import chunked_logprobs, reference_logprobs
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


def test_chunked_equals_unchunked_values_and_grads():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    h = torch.randn(7, 8, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    temp = torch.full((7,), 0.8)
    outs = []
    for chunk in (1, 3, 100):
        head.zero_grad()
        h.grad = None
        lp, ent = chunked_logprobs(h, head, targets, temp, chunk_tokens=chunk)
        (lp * torch.arange(7)).sum().backward()
        outs.append((lp.detach(), ent, h.grad.clone(), head.weight.grad.clone()))
    full = torch.log_softmax(head(h.detach()) / 0.8, -1)
    torch.testing.assert_close(outs[-1][0], full.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(outs[-1][1], -(full.exp() * full).sum(-1))
    for other in outs[:-1]:
        for a, b in zip(other, outs[-1]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_chunked_empty_keeps_graph():
    head = torch.nn.Linear(4, 5)
    lp, _ = chunked_logprobs(torch.zeros(0, 4, requires_grad=True), head, torch.zeros(0, dtype=torch.long),
                               torch.ones(0))
    assert lp.shape == (0,) and lp.requires_grad
