"""PolicyModel's packed forward hands decoders that accept a prepared mask mapping (Qwen2) an empty one, so
no mask is built (HF's packing scan synchronises the GPU), and falls back once for decoders that do not
(Llama); both give the per-sequence logprobs."""

import numpy as np
import pytest
import torch
from learner_helpers import make_batch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from asyncrl.learner import attention
from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch
from asyncrl.learner.logprobs import reference_logprobs
from asyncrl.learner.model import PolicyModel

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


@pytest.mark.parametrize("config, premasked", [(Qwen2Config(**SMALL), True), (LlamaConfig(**SMALL), False)])
def test_packed_forward_with_and_without_a_mask_mapping(config, premasked):
    torch.manual_seed(0)
    config._attn_implementation = attention.register()
    hf = AutoModelForCausalLM.from_config(config).eval()
    policy = PolicyModel(hf, value_head=False, chunk_tokens=7).eval()
    seqs, _ = flatten_batch(make_batch(seed=3, groups=2, n=3))
    for s in seqs:  # the helper's batch uses a larger vocabulary
        s.prompt, s.response = s.prompt % 64, s.response % 64
    mb = build_micro_batch(seqs)
    with torch.no_grad():
        for _ in range(2):  # the second call takes the path the first one chose
            logp, _, _ = policy(mb.input_ids, mb.position_ids, mb.gather_idx, mb.targets, mb.temperature,
                                mb.cu_seqlens, mb.max_seqlen)
            assert policy._premasked is premasked
            full = [torch.from_numpy(np.concatenate([s.prompt, s.response]).astype(np.int64)) for s in seqs]
            ref = torch.cat(reference_logprobs(hf, full, [len(s.prompt) for s in seqs], temperature=1.0))
            torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
