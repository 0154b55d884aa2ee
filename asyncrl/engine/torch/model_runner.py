"""Turns scheduled groups / sequences into packed tensors, runs the model, samples.

    prefill(groups) : prepare_prefill (the tokens after each group's prefix-cache hit) -> run_model (logits at
                      each fresh group's last prompt token) -> copy-on-write blocks -> register the full pages
                      in the prefix cache -> one logits row per sample -> sample
    decode(seqs)    : DecodeBuffers.stage (padded to a bucket size) -> CUDA graph replay, or the same
                      step eagerly (model -> lm_head -> fused sampler) -> one host copy of the results
    launch_decode   : the same step queued without waiting -> its samples on the device; run ahead of the
                      host (`src`), it takes its input ids from the previous step's samples there
                      (the engine's overlapped decode, `inflight`). A step begins with `DecodeBuffers.unpack`.
    launch_prefill  : prefill queued without waiting, its samples where a decode step's land, so the next
                      decode step can take the new sequences' first tokens from the device too

Sampling runs in the fused GPU kernel (`kernels.sampler`) when available; rows with top-k / top-p, and
the CPU, use `sampler.sample`. Both take each row's forced token (`Sequence.forced_token`, -1 = sample):
scoring runs this same path with the response's tokens in place of samples. Besides the model, the KV
cache and the static decode buffers, nothing here keeps state between steps.

fixed_batch (deterministic mode) keeps every row's arithmetic independent of the other rows: decode
runs `max_batch` rows, the prefill's lm_head runs on one row per group (a matmul's rows can differ
bitwise with its row count), and each decode row picks its sampler by its own parameters.
"""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.block_manager import BlockManager, blocks_for
from asyncrl.engine.torch.decode_graphs import DecodeBuffers, DecodeGraphs, bucket_sizes
from asyncrl.engine.torch.kv_cache import KVCache
from asyncrl.engine.torch.model.decoder import CausalLM
from asyncrl.engine.torch.paged_attention import AttentionMetadata, after_prefix_layout
from asyncrl.engine.torch.sampler import SamplingBatch, sample
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup
from asyncrl.engine.torch.kernels.sampler import sample_fused
from asyncrl.precision.fp32_logits import out_dtype_supported
from asyncrl.observe.stage import stage


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        blocks: BlockManager,
        device: torch.device,
        *,
        max_batch: int,
        max_model_len: int,
        cuda_graphs: bool,
        fixed_batch: bool,
    ) -> None:
        """fixed_batch: every decode step runs `max_batch` rows (padding included), so each row's
        arithmetic never depends on how many other sequences run (deterministic mode)."""
        self.model, self.kv_cache, self.blocks, self.device = model, kv_cache, blocks, device
        self.vocab_size = model.cfg.vocab_size
        self.fixed_batch = fixed_batch
        self.sizes = [max_batch] if fixed_batch else bucket_sizes(max_batch)
        max_blocks = blocks_for(max_model_len, blocks.block_size)
        self.buffers = DecodeBuffers(max_batch, max_blocks, kv_cache.scratch_block, blocks.block_size, device)
        self.fused_sampling = kernels.ops.enabled(model.lm_head.weight)
        if model.logits_fp32 and device.type == "cuda":
            out_dtype_supported()  # asked once here, never inside a graph capture
        self.single_pass_sizes = self._single_pass_sizes(device)
        use_graphs = cuda_graphs and device.type == "cuda" and kernels.ops.HAS_TRITON  # graphs unpack with Triton
        keys = [(s, False) for s in self.sizes] + [(s, True) for s in sorted(self.single_pass_sizes)]
        self.graphs = DecodeGraphs(self.decode_step, keys) if use_graphs else None

    # ---------------------------------------------------------------- phases

    @torch.inference_mode()
    def prefill(self, groups: list[SequenceGroup]) -> tuple[list[Sequence], torch.Tensor, torch.Tensor]:
        """Run the groups' prefill; -> (sequences that sampled, tokens [n], logprobs [n])."""
        seqs, logits = self._prefill_model(groups)
        if not seqs:
            return [], torch.empty(0, dtype=torch.int64), torch.empty(0)
        with stage("prefill.sample"):
            batch = self.prepare_sampling(seqs)
            if self.fused_sampling and not batch.needs_truncation:
                sampled = sample_fused(logits, batch.temperatures, batch.seeds, batch.steps, batch.forced)
                return seqs, *self._to_host(sampled, len(seqs))
            tokens, logprobs = sample(logits.float(), batch)
            return seqs, tokens.cpu(), logprobs.cpu()

    @torch.inference_mode()
    def launch_prefill(self, groups: list[SequenceGroup]) -> tuple[list[Sequence], torch.Tensor]:
        """`prefill` queued without waiting -> (sequences that sample, `buffers.sampled`: rows [:n] of row 0 their
        first tokens, of row 1 the logprobs, on the device), the layout of `launch_decode`'s samples, so the next
        decode step takes those sequences' input ids from there (`src`). Valid until that step's sampler writes
        `sampled`. Only when the samples `can_run_ahead` and number at most max_batch."""
        seqs, logits = self._prefill_model(groups)
        with stage("prefill.sample"):
            batch = self.prepare_sampling(seqs)
            if self.fused_sampling:
                sample_fused(logits, batch.temperatures, batch.seeds, batch.steps, batch.forced,
                             out=self.buffers.sampled)
            else:
                tokens, logprobs = sample(logits.float(), batch)
                self.buffers.sampled[:, :len(seqs)] = torch.stack((tokens.double(), logprobs.double()))
        return seqs, self.buffers.sampled

    def _prefill_model(self, groups: list[SequenceGroup]) -> tuple[list[Sequence], torch.Tensor | None]:
        """The model over the groups' new tokens (KV written, copy-on-write blocks copied, full pages cached) ->
        (the fresh groups' sequences, their first logits [num_samples, vocab]; None when all are resumed)."""
        with stage("prefill.prepare"):
            input_ids, positions, meta, last_rows = self.prepare_prefill(groups)
        fresh = [g for g in groups if not g.is_resume]
        with stage("prefill.model"):
            hidden = self.run_model(input_ids, positions, meta)
            self.kv_cache.copy_blocks([pair for g in groups for pair in g.cow_pairs])
            self.blocks.cache_prefilled(groups)
        if not fresh:
            return [], None
        with stage("prefill.sample"):  # the lm_head rows: timed with the sampling, as before the split
            return [s for g in fresh for s in g.seqs], self.prefill_logits(hidden, fresh, last_rows)

    def prefill_logits(self, hidden: torch.Tensor, fresh: list[SequenceGroup], last_rows: list[int]) -> torch.Tensor:
        """-> [num_samples, vocab] in the model dtype: each fresh group's last-row logits, once per
        sample. fixed_batch: the lm_head sees one row per group, then the row is repeated, so a
        sample's first logprob does not depend on n (scoring a subset of a group's samples)."""
        per_sample = [i for i, g in enumerate(fresh) for _ in g.seqs]
        if not self.fixed_batch:
            return self.model.compute_logits(hidden[self._long([last_rows[i] for i in per_sample])], fp32=False)
        logits = self.model.compute_logits(hidden[self._long(last_rows)], fp32=False)  # [num_groups, vocab]
        return logits[self._long(per_sample)]

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for each sequence -> (tokens [n] int64, logprobs [n] fp32), on the host."""
        n = len(seqs)
        size = self._size(n)
        self.buffers.stage(seqs, size)
        logits, sampled = self._run_decode(size)
        if sampled is not None and not self.needs_truncation(seqs):
            return self._to_host(sampled, n)
        if sampled is not None and self.fixed_batch:
            return self._sample_truncated_rows(logits, sampled, seqs)
        tokens, logprobs = sample(logits[:n].float(), self.prepare_sampling(seqs))
        return tokens.cpu(), logprobs.cpu()

    @torch.inference_mode()
    def launch_decode(self, seqs: list[Sequence], src: list[int] | None = None) -> torch.Tensor:
        """Queue one decode step for `seqs` and return without a sync -> `buffers.sampled`, [2, max_batch] float64
        on the device: rows [:n] of row 0 the tokens, of row 1 their logprobs (what `decode` would copy to the
        host); valid until the next step is launched. Only for steps that `can_run_ahead`. src: the step runs one
        token ahead of the host; sequence i's input token is in row src[i] of the previous decode step's samples
        (still in `buffers.sampled`)."""
        n = len(seqs)
        size = self._size(n)
        self.buffers.stage(seqs, size, src)
        logits, sampled = self._run_decode(size)
        if sampled is None:
            self._sample_staged(logits, n)
        return self.buffers.sampled

    def can_run_ahead(self, seqs: list[Sequence]) -> bool:
        """Whether a decode step of `seqs` can stay on the device: every row samples on the device without
        top-k / top-p (those rows sample on the host path) and none is forced (scoring); not fixed_batch
        (deterministic mode keeps the synchronous step)."""
        return not self.fixed_batch and not self.needs_truncation(seqs) and all(
            s.forced_token_ids is None for s in seqs
        )

    def _size(self, n: int) -> int:
        return self.sizes[-1] if self.fixed_batch else next(s for s in self.sizes if s >= n)

    def _single_pass_sizes(self, device: torch.device) -> set[int]:
        """Bucket sizes whose decode attention runs in one pass when every staged context is short: enough rows
        to give each SM a (row, kv head) program. None in deterministic mode (a row's bits would then depend on
        the other rows' contexts) or without the Triton kernels."""
        if self.fixed_batch or device.type != "cuda" or not kernels.ops.enabled(self.model.lm_head.weight):
            return set()
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return {s for s in self.sizes if s * self.model.cfg.num_kv_heads >= sms}

    def single_pass(self, size: int) -> bool:
        """Whether the step staged last, at `size` rows, runs its decode attention in one pass."""
        return size in self.single_pass_sizes and self.buffers.max_context <= kernels.attention.SINGLE_PASS_MAX_CONTEXT

    def _run_decode(self, size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        single = self.single_pass(size)
        if self.graphs is not None:
            return self.graphs.replay(size, single)
        return self.decode_step(size, None if self.fixed_batch else self.buffers.width, single)

    def _sample_staged(self, logits: torch.Tensor, n: int) -> None:
        """`sampler.sample` on rows [:n] with the staged parameters (no fused sampler: the CPU) into
        `buffers.sampled`, the fused sampler's layout. The same values as `decode`'s host path (no truncation,
        nothing forced)."""
        v = self.buffers.views(n)
        batch = SamplingBatch(
            temperatures=v["temperatures"], top_ps=torch.ones_like(v["temperatures"]),
            top_ks=torch.full_like(v["steps"], self.vocab_size), seeds=v["seeds"], steps=v["steps"],
            needs_truncation=False, forced=v["forced"],
        )
        tokens, logprobs = sample(logits[:n].float(), batch)
        self.buffers.sampled[:, :n] = torch.stack((tokens.double(), logprobs.double()))

    def _sample_truncated_rows(
        self, logits: torch.Tensor, sampled: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """fixed_batch with the fused sampler: rows with top-k / top-p take `sampler.sample`, the others
        keep the fused result, so a row's sampler (and its logprob's last ulp) never depends on what
        else runs. logits: [size, vocab]; sampled: [2, size]."""
        tokens, logprobs = self._to_host(sampled, len(seqs))
        rows = [i for i, s in enumerate(seqs) if self.needs_truncation([s])]
        picked = [seqs[i] for i in rows]
        row_tokens, row_logprobs = sample(logits[self._long(rows)].float(), self.prepare_sampling(picked))
        tokens[rows], logprobs[rows] = row_tokens.cpu(), row_logprobs.cpu()
        return tokens, logprobs

    def decode_step(
        self, size: int, width: int | None = None, single_pass: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decode of `size` staged rows (what a graph captures) -> (logits [size, vocab] in the
        model dtype, fused samples [2, size] or None). single_pass: see `_single_pass_sizes`."""
        self.buffers.unpack(size)
        v = self.buffers.views(size, width)
        meta = AttentionMetadata(
            is_prefill=False, slot_mapping=v["slot_mapping"], seq_lens=[1] * size,
            block_tables=v["block_tables"], context_lens=v["context_lens"], single_pass=single_pass,
        )
        hidden = self.run_model(v["input_ids"], v["positions"], meta)
        logits = self.model.compute_logits(hidden, fp32=False)  # [size, vocab]
        if not self.fused_sampling:
            return logits, None
        return logits, sample_fused(logits, v["temperatures"], v["seeds"], v["steps"], v["forced"],
                                    out=self.buffers.sampled)

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta, self.kv_cache)  # [num_tokens, hidden]

    # ---------------------------------------------------------------- inputs

    def prepare_prefill(
        self, groups: list[SequenceGroup]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """-> input_ids [num_tokens], positions [num_tokens], metadata, and for each fresh group the
        packed row of its last token. A group's first `num_cached` tokens (a prefix-cache hit) are not
        computed: their KV is in the cache, and its new tokens attend to it (`AttentionMetadata.after_prefix`)."""
        ids, slots, positions, context = [], [], [], []  # numpy parts, one per group
        seq_lens: list[int] = []
        last_rows: list[int] = []
        page = self.blocks.block_size
        total = 0
        for group in groups:
            tokens, cached = group.prefill_token_ids(), group.num_cached
            n = len(tokens)
            table = np.asarray(group.seqs[0].block_table[: -(-n // page)], dtype=np.int64)  # [blocks]
            every = (table[:, None] * page + np.arange(page)).reshape(-1)[:n]  # [n]: BlockManager.slot
            slots.append(every[cached:])
            context.append(every)
            ids.append(np.asarray(tokens[cached:], dtype=np.int64))
            positions.append(np.arange(cached, n, dtype=np.int64))
            seq_lens.append(n - cached)
            total += n - cached
            if not group.is_resume:
                last_rows.append(total - 1)
        cached_lens = [g.num_cached for g in groups]
        after_prefix = after_prefix_layout(context, cached_lens, self._to_device) if any(cached_lens) else None
        meta = AttentionMetadata(is_prefill=True, slot_mapping=self._array(slots), seq_lens=seq_lens,
                                 after_prefix=after_prefix)
        return self._array(ids), self._array(positions), meta, last_rows

    def needs_truncation(self, seqs: list[Sequence]) -> bool:
        return any(0 < s.sampling.top_k < self.vocab_size or s.sampling.top_p < 1.0 for s in seqs)

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
            forced=self._long([s.forced_token for s in seqs]),
        )

    def _array(self, parts: list[np.ndarray]) -> torch.Tensor:
        """int64 numpy parts -> one int64 tensor on the device (a 16k-token prefill's ids, slots and positions
        were ~10 ms of Python per call as lists)."""
        return torch.from_numpy(np.concatenate(parts)).to(self.device)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def _long(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    @staticmethod
    def _to_host(sampled: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        host = sampled[:, :n].cpu()  # the step's only device -> host sync
        return host[0].long(), host[1].float()
