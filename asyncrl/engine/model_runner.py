"""Turns scheduled groups / sequences into packed tensors, runs the model, samples.

    prefill(groups) : prepare_prefill -> run_model (logits at each fresh group's last prompt token)
                      -> copy-on-write blocks -> one logits row per sample -> sample
    decode(seqs)    : prepare_decode  -> run_model (one token per sequence) -> sample

Everything here is per step and stateless apart from the model and the KV cache; a CUDA-graph
runner can replace `run_model` for decode since `prepare_decode` yields fixed-rank tensors.
"""

from __future__ import annotations

import torch

from asyncrl.engine.block_manager import BlockManager
from asyncrl.engine.kv_cache import KVCache
from asyncrl.engine.model.decoder import CausalLM
from asyncrl.engine.paged_attention import AttentionMetadata
from asyncrl.engine.sampler import SamplingBatch, sample
from asyncrl.engine.sequence import Sequence, SequenceGroup


class ModelRunner:
    def __init__(self, model: CausalLM, kv_cache: KVCache, blocks: BlockManager, device: torch.device) -> None:
        self.model, self.kv_cache, self.blocks, self.device = model, kv_cache, blocks, device
        self.vocab_size = model.cfg.vocab_size

    # ---------------------------------------------------------------- phases

    @torch.inference_mode()
    def prefill(self, groups: list[SequenceGroup]) -> tuple[list[Sequence], torch.Tensor, torch.Tensor]:
        """Run the groups' prefill; -> (sequences that sampled, tokens [n], logprobs [n])."""
        input_ids, positions, meta, last_rows = self.prepare_prefill(groups)
        fresh = [g for g in groups if not g.is_resume]
        hidden = self.run_model(input_ids, positions, meta)
        self.kv_cache.copy_blocks([pair for g in groups for pair in g.cow_pairs])
        if not fresh:
            return [], torch.empty(0, dtype=torch.int64), torch.empty(0)
        seqs = [s for g in fresh for s in g.seqs]
        rows = torch.tensor([last_rows[i] for i, g in enumerate(fresh) for _ in g.seqs], device=self.device)
        logits = self.model.compute_logits(hidden[rows])  # [num_samples, vocab]; one row per sample
        tokens, logprobs = sample(logits, self.prepare_sampling(seqs))
        return seqs, tokens, logprobs

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids, positions, meta = self.prepare_decode(seqs)
        logits = self.model.compute_logits(self.run_model(input_ids, positions, meta))  # [batch, vocab]
        return sample(logits, self.prepare_sampling(seqs))

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta, self.kv_cache)  # [num_tokens, hidden]

    # ---------------------------------------------------------------- inputs

    def prepare_prefill(
        self, groups: list[SequenceGroup]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """-> input_ids [num_tokens], positions [num_tokens], metadata, and for each fresh group the
        packed row of its last token."""
        ids: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        last_rows: list[int] = []
        for group in groups:
            tokens, owner = group.prefill_token_ids(), group.seqs[0]
            slots.extend(self.blocks.slot(owner, p) for p in range(len(tokens)))
            ids.extend(tokens)
            seq_lens.append(len(tokens))
            if not group.is_resume:
                last_rows.append(len(ids) - 1)
        positions = [p for n in seq_lens for p in range(n)]
        meta = AttentionMetadata(is_prefill=True, slot_mapping=self._long(slots), seq_lens=seq_lens)
        return self._long(ids), self._long(positions), meta, last_rows

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """-> input_ids [batch] (each sequence's last token), positions [batch], metadata."""
        positions = [s.num_tokens - 1 for s in seqs]
        width = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        meta = AttentionMetadata(
            is_prefill=False,
            slot_mapping=self._long([self.blocks.slot(s, p) for s, p in zip(seqs, positions, strict=True)]),
            seq_lens=[1] * len(seqs),
            block_tables=self._long(tables),  # [batch, max_blocks]
            context_lens=self._long([s.num_tokens for s in seqs]),  # [batch]
        )
        return self._long([s.last_token for s in seqs]), self._long(positions), meta

    def prepare_sampling(self, seqs: list[Sequence]) -> SamplingBatch:
        params = [s.sampling for s in seqs]
        top_ks = [p.top_k if 0 < p.top_k < self.vocab_size else self.vocab_size for p in params]
        top_ps = [p.top_p for p in params]
        return SamplingBatch(
            temperatures=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=self.device),
            top_ps=torch.tensor(top_ps, dtype=torch.float32, device=self.device),
            top_ks=self._long(top_ks),
            seeds=self._long([s.seed for s in seqs]),
            steps=self._long([s.num_outputs for s in seqs]),
            needs_truncation=any(k < self.vocab_size for k in top_ks) or any(p < 1.0 for p in top_ps),
        )

    def _long(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)
