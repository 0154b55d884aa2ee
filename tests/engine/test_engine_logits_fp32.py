"""model.logits_fp32 in the engines: the torch engine's logits are the lm_head's fp32 output (prefill and
decode, sampled and scored), and the SGLang adapter refuses a server whose --enable-fp32-lm-head differs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import drain, engine, request

from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.engine.torch.forced_group import ForcedGroup
from tests.doubles.sglang_double import SGLangDouble


def test_compute_logits_keeps_the_fp32_output(qwen2_path):
    eng = engine(qwen2_path, dtype="bfloat16", logits_fp32=True)
    model = eng.model
    assert model.logits_fp32
    hidden = torch.randn(3, model.cfg.hidden_size).bfloat16() * 30
    w = model.lm_head.weight
    assert torch.equal(model.compute_logits(hidden, fp32=False), hidden.float() @ w.float().t())
    model.logits_fp32 = False
    assert torch.equal(model.compute_logits(hidden, fp32=False), hidden @ w.t())  # the default: rounded


def test_engine_generates_and_scores_with_fp32_logits(qwen2_path):
    """bf16 on CPU: the option changes the logprobs (no rounding of the logits), not the engine's contract; a
    deterministic engine's scores still reproduce its sampling logprobs bitwise."""
    reqs = [request("a", [5, 6, 7, 8], n=2, temperature=1.0, seed=3, max_new_tokens=12, ignore_eos=True)]
    base = drain(engine(qwen2_path, dtype="bfloat16"), {0: reqs})
    eng = engine(qwen2_path, dtype="bfloat16", logits_fp32=True, deterministic=True)
    outs = drain(eng, {0: reqs})
    assert base.keys() == outs.keys()
    for k in outs:
        assert len(outs[k].token_ids) == 12 and np.isfinite(outs[k].logprobs).all()
    assert any(not np.array_equal(base[k].logprobs, outs[k].logprobs) for k in base)
    group = ForcedGroup(prompt_token_ids=np.array([5, 6, 7, 8]), sampling=reqs[0].sampling,
                        response_token_ids=[outs[("a", i)].token_ids for i in range(2)])
    scored = eng.score([group])
    for i in range(2):
        np.testing.assert_array_equal(scored[0][i], outs[("a", i)].logprobs)
    assert eng.blocks.num_free == eng.blocks.num_blocks


@pytest.mark.parametrize("served", [False, True])
def test_sglang_adapter_checks_the_servers_lm_head(served):
    with SGLangDouble(enable_fp32_lm_head=served) as d:
        cfg = SGLangConfig(base_url=d.url, request_timeout_s=10.0)
        with SGLangEngine(cfg, logits_fp32=served):
            pass
        fix = "restart the server with --enable-fp32-lm-head" if not served else "restart it without the flag"
        with pytest.raises(ValueError, match=f"model.logits_fp32={str(not served).lower()} .*{fix}"):
            SGLangEngine(cfg, logits_fp32=not served)
