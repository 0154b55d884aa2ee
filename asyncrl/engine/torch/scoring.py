"""Forced-token scoring: the logprobs of given responses, computed by generation's own steps.

    ForcedGroup ──check──▶ SequenceGroup of forced Sequences ──▶ scheduler ──▶ engine.step() until idle
                                 (prefill of the prompt, then decode steps fed the forced tokens) ──▶ logprobs

A response becomes a `Sequence` whose `forced_token_ids` both samplers take instead of sampling; a
forced token's logprob is read from the same log_softmax(logits / T) as a sampled token's. It ends
when its tokens are used up (not at EOS, stop tokens or max_new_tokens).

Deterministic mode (each group prefills alone, its lm_head row computed once for all samples, every
decode step runs max_running rows): a response this engine generated scores bitwise equal to the
logprobs recorded when it was generated (same weights and sampling params), whatever else is scored
with it, whichever subset of its group's samples. Otherwise rows run in batches of other sizes than
at generation, so the logprobs agree only up to matmul rounding. Bitwise equality also needs what
generation ran with: the device and dtype, and on CPU the torch thread count (matmuls round with it).
Preemption (KV cache too small for what is scored at once) recomputes KV by prefill and breaks it too:
give the cache room for max_running sequences. The engine's counters count scoring's work too.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from asyncrl.engine.torch.block_manager import BlockManager, blocks_for
from asyncrl.engine.torch.forced_group import ForcedGroup
from asyncrl.engine.torch.model.config import ArchConfig
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup


class _Engine(Protocol):
    """What scoring uses of `TorchEngine` (named here so this module does not import the engine, which
    imports it)."""

    scheduler: Scheduler
    blocks: BlockManager
    arch: ArchConfig
    max_running: int
    max_model_len: int

    def step(self) -> list: ...


_UNUSED_SEED = 0  # a forced row draws noise like any row, but never uses it


def score_forced(engine: _Engine, groups: list[ForcedGroup]) -> list[list[np.ndarray]]:
    """-> [group][sample] -> [response_len] float32, in input order. The engine must be idle
    (`TorchEngine.score` checks); it is idle again afterwards, its KV blocks freed, also on error."""
    for index, group in enumerate(groups):
        check(engine, group, index)
    now = time.perf_counter()
    seq_groups = [_sequence_group(f"score/{i}", group, now) for i, group in enumerate(groups)]
    for seq_group in seq_groups:
        engine.scheduler.add(seq_group)
    try:
        while engine.scheduler.has_work():
            engine.step()
    finally:
        engine.scheduler.remove(None)
    return [[_logprobs(seq) for seq in seq_group.seqs] for seq_group in seq_groups]


def check(engine: _Engine, group: ForcedGroup, index: int) -> None:
    """Reject what the engine could not score as it generates: too many samples, ids outside the
    vocabulary, a prompt + response longer than max_model_len or than the KV cache."""
    where = f"score: group {index}"
    if not isinstance(group, ForcedGroup):
        raise TypeError(f"{where}: a ForcedGroup, not {type(group).__name__}")
    if group.n > engine.max_running:
        raise ValueError(f"{where}: {group.n} responses, more than max_running={engine.max_running}: split the group")
    vocab = engine.arch.vocab_size
    for name, ids in [("prompt", group.prompt_token_ids)] + [
        (f"response {i}", r) for i, r in enumerate(group.response_token_ids)
    ]:
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"{where}: {name} has token ids outside [0, {vocab})")
    prompt_len = len(group.prompt_token_ids)
    longest = prompt_len + max(len(r) for r in group.response_token_ids)
    if longest > engine.max_model_len:
        raise ValueError(
            f"{where}: prompt + response is {longest} tokens, more than max_model_len={engine.max_model_len}"
        )
    size, num_blocks = engine.blocks.block_size, engine.blocks.num_blocks
    if max(blocks_for(longest, size), blocks_for(prompt_len, size) + group.n - 1) > num_blocks:
        raise ValueError(f"{where} needs more KV blocks than the cache has ({num_blocks} blocks of {size} tokens)")


def _sequence_group(request_id: str, group: ForcedGroup, now: float) -> SequenceGroup:
    prompt = group.prompt_token_ids.tolist()  # Python ints, as `TorchEngine.add` keeps them
    return SequenceGroup([
        Sequence(request_id, i, prompt, group.sampling, _UNUSED_SEED, now, forced_token_ids=r.tolist())
        for i, r in enumerate(group.response_token_ids)
    ])


def _logprobs(seq: Sequence) -> np.ndarray:
    assert seq.output_token_ids == seq.forced_token_ids, "a forced sequence took a token it was not given"
    return np.asarray(seq.logprobs, dtype=np.float32)  # as `Sequence.to_output` converts them
