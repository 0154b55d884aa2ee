"""Small drivers shared by the engine tests."""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.engine.protocol import GenerationOutput, GenerationRequest
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.records import SamplingParams


def engine(path, **kw) -> TorchEngine:
    kw.setdefault("num_kv_blocks", 256)
    kw.setdefault("kv_block_size", 4)
    kw.setdefault("max_running", 16)
    return TorchEngine(path, **kw)


def request(rid: str, prompt: list[int], n: int = 1, **sampling) -> GenerationRequest:
    sampling.setdefault("max_new_tokens", 12)
    return GenerationRequest(request_id=rid, prompt_token_ids=np.asarray(prompt, np.int32),
                             sampling=SamplingParams(**sampling), n=n)


def drain(eng: TorchEngine, arrivals: dict[int, list[GenerationRequest]] | None = None, max_steps: int = 10_000):
    """Step until idle, adding `arrivals[k]` before step k. -> {(request_id, sample_index): output}."""
    arrivals = dict(arrivals or {})
    outs: dict[tuple[str, int], GenerationOutput] = {}
    for step in range(max_steps):
        for req in arrivals.pop(step, []):
            eng.add(req)
        if not arrivals and not eng.has_work():
            return outs
        for out in eng.step():
            outs[(out.request_id, out.sample_index)] = out
    raise AssertionError("engine did not finish")


def hf_logprobs(hf_model, prompt: list[int], tokens, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token under a full Hugging Face forward."""
    ids = torch.tensor([prompt + [int(t) for t in tokens]], device=hf_model.device)
    with torch.no_grad():
        logits = hf_model(ids).logits[0].float().cpu()  # [len, vocab]
    lp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)[len(prompt) - 1 : -1]
    return lp.gather(-1, torch.as_tensor(tokens, dtype=torch.long)[:, None])[:, 0]
