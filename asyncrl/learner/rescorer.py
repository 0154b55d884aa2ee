"""Deterministic mode's proximal logprobs: the learner re-scores a batch with the generator's own engine code.

With `generator.deterministic = true` the torch engine is batch-invariant (each group prefills alone, every
decode step runs max_running rows), so a sample's logprobs depend only on its tokens and the weights. The
learner's own forward (packed micro-batches, other GEMM shapes, bf16 roundings in other places) cannot give
those bits. So the old-logprob pass asks a `TorchEngine` of its own instead: built with the generator's
settings (model, dtype, max_running, deterministic; on CPU the generators' thread count), loaded with exactly
what the weight push sends (the fp32 masters cast to the compute dtype), and fed each response's tokens
instead of sampling them (`TorchEngine.score`). For every token generated on the learner's current weights
(all tokens of the first step; all tokens when training is synchronous) the proximal logprob then equals the
behaviour logprob bit for bit: the decoupled importance weight is exactly 1 and `behav_prox_logp_absdiff`
exactly 0.

Cost: scoring runs the engine's decode loop over every response, about what generating them took, on the
learner's device, plus the engine's weights and KV cache (sized here for max_running sequences of the
longest sample, not the engine's default of most of the free memory).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from asyncrl import records
from asyncrl.engine.torch.block_manager import blocks_for
from asyncrl.engine.torch.forced_group import ForcedGroup
from asyncrl.generator.build import CPU_THREADS
from asyncrl.generator.config import GeneratorConfig
from asyncrl.learner.batch_tensors import SeqRecord
from asyncrl.learner.config import LearnerConfig
from asyncrl.models.config import ModelConfig

KV_BLOCK = 16  # the engine's default block size (what the generator's engine runs with)


class Rescorer:
    def __init__(self, model_path: str, *, device: torch.device, dtype: str, max_running: int,
                 max_tokens: int, residual_fp32: bool = False, logits_fp32: bool = False) -> None:
        """max_tokens: the longest prompt + response to score (sizes the KV cache for max_running of them);
        residual_fp32, logits_fp32: as the generators' engines (ModelConfig)."""
        from asyncrl.engine.torch.engine import TorchEngine

        self.engine = TorchEngine(model_path, device=device, dtype=dtype, max_running=max_running,
                                  num_kv_blocks=max_running * blocks_for(max_tokens, KV_BLOCK),
                                  kv_block_size=KV_BLOCK, deterministic=True, residual_fp32=residual_fp32,
                                  logits_fp32=logits_fp32)
        self.version: int | None = None

    def load(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """The learner's weights of `version`, cast as the push casts them (a no-op when already loaded). Every
        learner rank must call it: the iterator's full_tensor() is a collective."""
        if version == self.version:
            for _ in named_tensors:  # still join the collectives
                pass
            return
        engine = self.engine
        engine.begin_weight_update()
        engine.load_weights((name, t.detach().to(engine.device, engine.dtype)) for name, t in named_tensors)
        engine.end_weight_update(version)
        self.version = version

    def score(self, seqs: list[SeqRecord], sampling: list[records.SamplingParams]) -> dict[int, np.ndarray]:
        """SeqRecord.index -> logprob per response token [R] float32. `sampling[s.group]` is what sample s was
        generated with; a group's samples are scored together (they share the prompt's prefill)."""
        by_group: dict[int, list[SeqRecord]] = {}
        for s in seqs:
            by_group.setdefault(s.group, []).append(s)
        members = [part for group in by_group.values() for part in _chunks(group, self.engine.max_running)]
        forced = [ForcedGroup(prompt_token_ids=part[0].prompt, response_token_ids=[s.response for s in part],
                              sampling=sampling[part[0].group]) for part in members]
        with _threads(CPU_THREADS if self.engine.device.type == "cpu" else None):
            scored = self.engine.score(forced)
        return {s.index: lp for part, lps in zip(members, scored) for s, lp in zip(part, lps)}

    def close(self) -> None:
        self.engine.close()


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `count` meanwhile (None: unchanged)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _chunks(seqs: list[SeqRecord], size: int) -> list[list[SeqRecord]]:
    return [seqs[i:i + size] for i in range(0, len(seqs), size)]


def build_rescorer(cfg: LearnerConfig, model: ModelConfig, generator: GeneratorConfig, model_path: str,
                   device: str) -> Rescorer | None:
    """Deterministic mode (generator.deterministic): an engine like the generators' for the proximal logprobs."""
    if not generator.deterministic or cfg.off_policy == "none":
        return None
    positions = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings", 4096)
    return Rescorer(model_path, device=torch.device(device), dtype=model.dtype,
                    max_running=generator.max_running, max_tokens=min(int(positions), 4096),
                    residual_fp32=model.residual_fp32, logits_fp32=model.logits_fp32)
