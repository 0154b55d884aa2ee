"""records.Batch -> packed token tensors in micro-batches.

A sequence is prompt + response[:-1] (the last response token is only a target). Sequences are packed
without padding: concatenated into one row with position_ids restarting at 0 per sequence, which Hugging
Face models turn into a block-diagonal causal mask (see logprobs.py). Each micro-batch holds at most
`micro_batch_tokens` input tokens (a longer sequence goes alone); the fewest such packs are filled evenly.

Per response token t of a sequence with prompt length P, the logits at packed position start + P - 1 + t
predict it; `gather_idx` lists those positions so only response rows ever reach the lm_head.

A multi-turn sample's response interleaves the policy's turns with the environment's tokens
(`Sample.loss_mask`, 1 = the policy's). Every token is packed and attended to as the engine saw it, but
`MicroBatch.mask` is 0 on environment tokens: they get no loss weight (no gradient) and count in no
normaliser or statistic.

Nothing is written into a MicroBatch after it is built (to_device only moves it): the trainer's passes return
their results per micro-batch, `OldPass` (the weights before the update) and `LossInputs` (what the loss reads).
"""

from __future__ import annotations

import heapq

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from asyncrl import records
from asyncrl.learner.attention import cu_seqlens


@dataclass(slots=True)
class SeqRecord:
    """One trainable sample, flattened out of its group."""

    index: int  # position in the flattened batch (over all ranks)
    group: int  # group index in the batch, after filtering
    prompt: np.ndarray  # [P] int
    response: np.ndarray  # [R] int
    behav_logp: np.ndarray  # [R] float32, generator's log_softmax(z / T)
    versions: np.ndarray  # [R] int, policy version of each token
    temperature: float  # the generator's T (greedy -> 1.0, as SGLang reports raw logprobs then)
    max_new_tokens: int
    reward: float  # after shaping (overlong penalty)
    advantage: float = 0.0  # outcome-level advantage (token-level algorithms compute theirs per token later)
    loss_weight: float = 0.0  # aggregation weight of each trained token (losses.sample_weights; prepare.py)
    loss_mask: np.ndarray | None = None  # [R] int32, 1 = the policy's token, 0 = the environment's; None: all 1

    @property
    def num_input_tokens(self) -> int:
        return len(self.prompt) + len(self.response) - 1

    @property
    def num_trained_tokens(self) -> int:
        """Response tokens the loss sees: the policy's own (every token of a single-turn sample)."""
        return len(self.response) if self.loss_mask is None else int(self.loss_mask.sum())

    def trained_mask(self) -> np.ndarray:
        """[R] float32: 1.0 on the policy's tokens, 0.0 on the environment's."""
        if self.loss_mask is None:
            return np.ones(len(self.response), np.float32)
        return self.loss_mask.astype(np.float32)


def flatten_batch(batch: records.Batch) -> tuple[list[SeqRecord], int]:
    """Every scored, non-empty sample of the batch as a SeqRecord (group = index of its group).
    Returns (records, number of samples skipped: failed reward or empty response)."""
    out: list[SeqRecord] = []
    skipped = 0
    for g, group in enumerate(batch.groups):
        temp = group.prompt.sampling.temperature
        temp = 1.0 if temp < 1e-6 else temp
        for scored in group.samples:
            s = scored.sample
            if scored.status != records.ScoreStatus.OK or len(s.response_token_ids) == 0:
                skipped += 1
                continue
            _check_sample(s)
            out.append(SeqRecord(
                index=len(out), group=g, prompt=np.asarray(s.prompt_token_ids), response=np.asarray(s.response_token_ids),
                behav_logp=np.asarray(s.logprobs, dtype=np.float32), versions=np.asarray(s.versions),
                temperature=float(temp), max_new_tokens=group.prompt.sampling.max_new_tokens, reward=float(scored.reward),
                loss_mask=None if s.loss_mask is None else np.asarray(s.loss_mask),
            ))
    return out, skipped


def _check_sample(s: records.Sample) -> None:
    r = len(s.response_token_ids)
    if len(s.prompt_token_ids) == 0:
        raise ValueError(f"sample {s.prompt_id}/{s.sample_index}: empty prompt_token_ids; the learner needs the prompt")
    if len(s.logprobs) != r or len(s.versions) != r:
        raise ValueError(
            f"sample {s.prompt_id}/{s.sample_index}: {r} response tokens but {len(s.logprobs)} logprobs and "
            f"{len(s.versions)} versions; the generator must record one of each per token"
        )
    if s.loss_mask is not None:
        mask = np.asarray(s.loss_mask)
        if mask.shape != (r,) or not np.isin(mask, (0, 1)).all():
            raise ValueError(f"sample {s.prompt_id}/{s.sample_index}: loss_mask must be [{r}] of 0/1 (one per response "
                             f"token), got shape {mask.shape} with values {np.unique(mask)[:4].tolist()}")


@dataclass(slots=True)
class MicroBatch:
    """Packed sequences of one forward/backward. Shapes: T input tokens, n response tokens, s sequences."""

    input_ids: Tensor  # [1, T] int64
    position_ids: Tensor  # [1, T] int64, restarting at 0 per sequence
    gather_idx: Tensor  # [n] int64, packed position whose logits predict each response token
    targets: Tensor  # [n] int64, the response tokens
    temperature: Tensor  # [n] float32
    behav_logp: Tensor  # [n] float32
    versions: Tensor  # [n] int64
    mask: Tensor  # [n] float32: 1 on the policy's tokens; 0 on environment tokens and on a filler's tokens
    trained_idx: Tensor  # [m] int64, positions (in [n]) of the policy's tokens, sequence by sequence
    advantages: Tensor  # [n] float32, outcome-level (SeqRecord.advantage per token; 0 for token-level recipes)
    agg_weights: Tensor  # [n] float32 per-token loss weights (SeqRecord.loss_weight on trained tokens, else 0)
    seq_lens: Tensor  # [s] response lengths
    seq_index: list[int]  # SeqRecord.index per sequence (-1: filler)
    cu_seqlens: Tensor  # [s + 1] int32, input-token boundaries of the packed sequences (varlen attention)
    max_seqlen: int  # longest packed sequence (input tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


@dataclass(frozen=True, slots=True)
class OldPass:
    """One micro-batch's quantities of the weights before this step's update (no grad), as the trainer's old
    pass returns them. Shapes [n]."""

    prox_logp: Tensor | None  # the proximal ("old") policy's logprobs; None only when the update's own forward
    # is the proximal policy (prox source "update": one mini-batch), which the trainer knows before the pass
    values: Tensor | None  # the critic's values (value head only)
    ref_logp: Tensor | None  # the reference policy's logprobs (kl_coef > 0 only; with LoRA: lora_reference.py)


@dataclass(frozen=True, slots=True)
class LossInputs:
    """Everything one micro-batch's loss and statistics read besides its forward, assembled once, after the
    forward (which may be the proximal policy). Shapes [n] (response tokens of the micro-batch)."""

    mask: Tensor  # MicroBatch.mask
    agg_weights: Tensor  # MicroBatch.agg_weights
    seq_lens: Tensor  # [s] MicroBatch.seq_lens
    behav_logp: Tensor  # MicroBatch.behav_logp
    advantages: Tensor  # outcome-level (MicroBatch.advantages) or token-level (the trainer's estimator)
    old_logp: Tensor  # proximal logprobs
    is_weights: Tensor  # behaviour -> proximal importance weights
    is_dropped: Tensor  # bool
    returns: Tensor | None  # value targets (value head only)
    old_values: Tensor | None  # (value head only)
    ref_logp: Tensor | None  # (kl_coef > 0 only)


def to_device(micro_batches: list[MicroBatch], device: torch.device) -> None:
    """Move every micro-batch's tensors to `device`, in place. To a GPU they travel as one pinned host buffer per
    dtype (three copies for the whole batch), and each field becomes a view of its device buffer: a pageable
    host-to-device copy synchronises the host with the GPU, and pinning ~12 tensors per micro-batch one by one
    cost ~5 ms of host time a step (each pin asks the driver whether the memory is pinned already); numpy fills
    the buffer (torch's CPU cat runs on its OpenMP pool: on a 16-core GPU host, inside the training process, the
    three concatenations took ~33 ms a step, against ~0.4 ms in a fresh process). The copies do
    not block the host; stream order makes later kernels see the bytes, and the caching host allocator keeps
    each pinned buffer until its copy is done."""
    if device.type == "cpu":
        return  # prepare builds them on the host
    fields = [(mb, name, value) for mb in micro_batches for name in MicroBatch.__slots__
              if isinstance(value := getattr(mb, name), Tensor) and value.device.type == "cpu"]
    if device.type != "cuda":
        for mb, name, value in fields:
            setattr(mb, name, value.to(device))
        return
    by_dtype: dict[torch.dtype, list[tuple[MicroBatch, str, Tensor]]] = {}
    for field in fields:
        by_dtype.setdefault(field[2].dtype, []).append(field)
    for dtype, group in by_dtype.items():
        sizes = [value.numel() for _, _, value in group]
        host = torch.empty(sum(sizes), dtype=dtype, pin_memory=True)
        np.concatenate([value.reshape(-1).numpy() for _, _, value in group], out=host.numpy())  # one thread
        flat = host.to(device, non_blocking=True)
        for (mb, name, value), part in zip(group, flat.split(sizes)):
            setattr(mb, name, part.view(value.shape))


def pack_micro_batches(seqs: list[SeqRecord], micro_batch_tokens: int) -> list[list[SeqRecord]]:
    """The fewest bins first-fit-decreasing finds (at most micro_batch_tokens input tokens each, a longer
    sequence alone), with the tokens then spread evenly over that many bins: a pack far smaller than the
    others costs nearly a full pack's host time per layer while the GPU idles (3 packs of 22k tokens train
    faster than 32k + 32k + 3k)."""
    longest_first = sorted(seqs, key=lambda s: (-s.num_input_tokens, s.index))
    sizes = [s.num_input_tokens for s in longest_first]
    ffd = _first_fit_decreasing(longest_first, sizes, micro_batch_tokens)
    return _balanced(longest_first, sizes, len(ffd), micro_batch_tokens) or ffd


def _first_fit_decreasing(longest_first: list[SeqRecord], sizes: list[int], budget: int) -> list[list[SeqRecord]]:
    bins: list[list[SeqRecord]] = []
    room: list[int] = []
    for s, n in zip(longest_first, sizes):
        for i, free in enumerate(room):
            if n <= free:
                bins[i].append(s)
                room[i] -= n
                break
        else:
            bins.append([s])
            room.append(budget - n)
    return bins


def _balanced(longest_first: list[SeqRecord], sizes: list[int], count: int,
              budget: int) -> list[list[SeqRecord]] | None:
    """Each sequence (longest first) into the least-loaded of `count` bins; None when that breaks the budget
    (then first-fit-decreasing's bins stand)."""
    if count <= 1:
        return None
    heap = [(0, i) for i in range(count)]  # (tokens, bin)
    bins: list[list[SeqRecord]] = [[] for _ in range(count)]
    for s, n in zip(longest_first, sizes):
        load, i = heapq.heappop(heap)
        if load + n > budget:
            return None
        bins[i].append(s)
        heapq.heappush(heap, (load + n, i))
    return bins


def build_micro_batch(seqs: list[SeqRecord]) -> MicroBatch:
    """Concatenate sequences into one packed row (array ops over the whole pack, not a loop of small ones per
    sequence: this runs on the host before a step's first kernel)."""
    p_len = np.array([len(s.prompt) for s in seqs], dtype=np.int64)  # [s]
    r_len = np.array([len(s.response) for s in seqs], dtype=np.int64)  # [s]
    in_len = p_len + r_len - 1  # [s] input tokens: the last response token is only a target
    in_start = np.cumsum(in_len) - in_len  # [s]
    r_start = np.cumsum(r_len) - r_len  # [s]
    ids = np.concatenate([x for s in seqs for x in (s.prompt, s.response[:-1])]).astype(np.int64)  # [T]
    pos = np.arange(int(in_len.sum()), dtype=np.int64) - np.repeat(in_start, in_len)  # [T]
    n = int(r_len.sum())
    gather = np.repeat(in_start + p_len - 1 - r_start, r_len) + np.arange(n, dtype=np.int64)  # [n]
    mask = _trained_mask(seqs, n)  # [n]
    t = torch.from_numpy
    return MicroBatch(
        input_ids=t(ids)[None], position_ids=t(pos)[None], gather_idx=t(gather),
        targets=t(np.concatenate([s.response for s in seqs]).astype(np.int64)),
        temperature=t(np.repeat(np.array([s.temperature for s in seqs], np.float32), r_len)),
        behav_logp=t(np.concatenate([s.behav_logp for s in seqs]).astype(np.float32)),
        versions=t(np.concatenate([s.versions for s in seqs]).astype(np.int64)),
        mask=t(mask), trained_idx=t(np.flatnonzero(mask).astype(np.int64)),
        advantages=t(np.repeat(np.array([s.advantage for s in seqs], np.float32), r_len)),
        agg_weights=t(np.repeat(np.array([s.loss_weight for s in seqs], np.float32), r_len)) * t(mask),
        seq_lens=t(r_len.copy()), seq_index=[s.index for s in seqs],
        cu_seqlens=cu_seqlens(in_len.tolist()), max_seqlen=int(in_len.max()),
    )


def _trained_mask(seqs: list[SeqRecord], n: int) -> np.ndarray:
    """[n] float32 over the pack's response tokens: 1 where the policy's token trains."""
    if all(s.loss_mask is None for s in seqs):
        return np.ones(n, np.float32)
    return np.concatenate([s.trained_mask() for s in seqs])


def filler_micro_batch() -> MicroBatch:
    """A two-token micro-batch with zero loss weight (no trained token): a rank with fewer micro-batches runs
    these so that every rank makes the same FSDP collectives."""
    return build_micro_batch([SeqRecord(
        index=-1, group=-1, prompt=np.zeros(1, np.int64), response=np.zeros(2, np.int64),
        behav_logp=np.zeros(2, np.float32), versions=np.zeros(2, np.int64), temperature=1.0,
        max_new_tokens=2, reward=0.0, loss_mask=np.zeros(2, np.int32),
    )])
