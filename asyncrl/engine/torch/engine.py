"""TorchEngine: the built-in generation engine (implements `asyncrl.engine.protocol.Engine`).

One thread (the generator service) drives it:

    add(request) ──▶ Scheduler.waiting ──step()──▶ prefill new groups + decode running ──▶ finished outputs
                                          ▲
    pause ▸ begin_weight_update ▸ load_weights* ▸ end_weight_update(v) ▸ resume   (between steps)

Every sampled token is stamped with the weight version current when its step was launched. With
pause('continue') in-flight sequences keep their KV cache and continue under the new weights. With
`prefix_cache`, requests reuse full KV pages of earlier ones computed by the same weights (`prefix_cache`).
`score(groups)` runs given responses through the same steps with their tokens forced (`scoring`).

Overlapped decode (`overlap`, on by default with CUDA graphs): a decode step is launched before the previous
one's results are read, and its input tokens come from that step's samples on the device (`inflight` has the
timeline), so step() returns a sample's output one call after its last token was sampled. Anything that needs
the host state first drains the step in flight (reads and applies its results): a prefill (new or resumed
groups waiting), blocks short for the next step (then schedule_decode preempts as usual), rows with top-k /
top-p or forced tokens, and pause / abort / begin_weight_update / score / close. Tokens, logprobs, versions and
finish reasons are those of the synchronous loop; a sequence that stops at a stop token has already been
given a row in the next step, which is computed and discarded.

A prefill is overlapped the same way (`_prefill_then_decode`, timeline in `inflight`): the next decode step is
launched before the prefill's samples are read, its new rows taking their first tokens from them on the device.
"""

from __future__ import annotations

import inspect
import os
import random
import time
from collections.abc import Iterable, Mapping

import numpy as np
import torch
from asyncrl.observe.stage import stage

from asyncrl.precision import dtypes
from asyncrl.engine.torch.block_manager import BlockManager, blocks_for
from asyncrl.engine.torch.kv_cache import KVCache
from asyncrl.engine.bucket_layout import BucketLayout
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.engine.torch.model import CausalLM, load_hf_folder
from asyncrl.engine.torch.model_weights import ModelWeights
from asyncrl.engine.torch.model_runner import ModelRunner
from asyncrl.engine.protocol import (
    EngineLimits,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
    PauseMode,
)
from asyncrl.engine.torch.forced_group import ForcedGroup
from asyncrl.engine.torch.inflight import InflightStep, ResultBuffers
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.scoring import score_forced
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup, SequenceStatus
from asyncrl.records import FinishReason

_SEED_MOD = 2**63


class TorchEngine:
    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "auto",
        max_running: int = 64,
        num_kv_blocks: int | None = None,
        kv_block_size: int = 16,
        max_prefill_tokens: int = 8192,
        max_model_len: int | None = None,
        seed: int = 0,
        weight_version: int = 0,
        cuda_graphs: bool = True,
        deterministic: bool = False,
        overlap: bool | None = None,
        residual_fp32: bool = False,
        logits_fp32: bool = False,
        prefix_cache: bool = False,
        lora: LoraSpec | None = None,
        weights_dtype: str = "model",
        base_image: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """model_path: a Hugging Face causal-LM folder. dtype: "auto" (bfloat16 on CUDA, float32 on
        CPU), a name or a torch.dtype. num_kv_blocks: KV cache size in blocks of `kv_block_size`
        tokens; default: room for `max_running` sequences of min(max_model_len, 2048 CPU / 4096 CUDA)
        tokens. max_model_len: prompt + response limit; default: the model's max_position_embeddings.
        seed: draws the sampling seed of requests that give none. cuda_graphs: replay decode steps
        from CUDA graphs captured per padded batch size (CUDA only). deterministic: a sample's tokens
        and logprobs do not depend on what else runs (each group prefills alone, every decode step
        runs max_running rows), and `score` reproduces generation's logprobs bitwise; costs throughput
        at low load. Preemption recomputes a sequence's KV by prefill, so keep num_kv_blocks large
        enough that it does not happen. overlap: launch each decode step before reading the previous
        one's results (module docstring); default: on with CUDA graphs on CUDA, off otherwise (deterministic
        mode keeps the synchronous loop). residual_fp32: keep the residual stream in fp32; logits_fp32: keep the
        lm_head's output in fp32 (the learner must do the same: ModelConfig.residual_fp32 / logits_fp32).
        prefix_cache: reuse the KV of full pages across requests, within one weight version (`prefix_cache`; not in
        deterministic mode, where a hit would make a sample's numbers depend on what ran before). lora: updates
        may carry LoRA adapters only, merged from a kept pristine base (adapter_merge.py) or, with lora.apply =
        "unmerged", kept apart in the matmuls (adapter_slots.py). weights_dtype: "model"
        (matmuls in `dtype`) or "fp8" (e4m3 images of every projection, re-quantized at each update: model/fp8.py).
        base_image: the shared base (generator.share_base: asyncrl/weights/base_image.py), {HF name: tensor on
        `device`}: the model's matrices are these tensors, never copied and never written (a push that writes one
        is refused); needs LoRA adapters kept unmerged."""
        self.device = torch.device(device)
        if self.device.type == "cuda":  # Triton kernels and CUDA graphs run on the current device
            if self.device.index is None:  # "cuda": the current device, named (set_device needs an index)
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        self.dtype = dtypes.torch_dtype(dtype, self.device)
        if base_image is not None and (lora is None or lora.apply != "unmerged"):
            raise ValueError("generator.share_base needs LoRA adapters kept unmerged (learner.lora_rank > 0, "
                             "generator.lora_apply = \"unmerged\"): any other update writes the base's weights")
        model = load_hf_folder(model_path, self.dtype, self.device, image=base_image)
        self._shared = frozenset(base_image or ())  # names whose tensors are the shared image's
        model.model.residual_fp32 = residual_fp32
        model.logits_fp32 = logits_fp32
        self._setup(model, max_running, num_kv_blocks, kv_block_size, max_prefill_tokens, max_model_len, seed,
                    weight_version, cuda_graphs, deterministic, overlap, prefix_cache, lora, weights_dtype)

    @classmethod
    def from_model(cls, model: CausalLM, **options) -> TorchEngine:
        """An engine around an already built compact model (e.g. `build_from_hf` of an in-memory Hugging
        Face model, sharing its tensors); options as for the constructor, minus model_path / dtype."""
        self = cls.__new__(cls)
        self._shared = frozenset()
        p = model.lm_head.weight
        self.device, self.dtype = p.device, p.dtype
        defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()
                    if name not in ("model_path", "device", "dtype", "residual_fp32", "logits_fp32", "base_image")}
        model.model.residual_fp32 = bool(options.pop("residual_fp32", model.model.residual_fp32))
        model.logits_fp32 = bool(options.pop("logits_fp32", model.logits_fp32))
        unknown = set(options) - set(defaults)
        if unknown:
            raise TypeError(f"TorchEngine.from_model: unknown options {sorted(unknown)}")
        self._setup(model, **{**defaults, **options})
        return self

    def _setup(self, model: CausalLM, max_running, num_kv_blocks, kv_block_size, max_prefill_tokens, max_model_len,
               seed, weight_version, cuda_graphs, deterministic, overlap, prefix_cache, lora=None,
               weights_dtype="model") -> None:
        if max_running < 1 or max_prefill_tokens < 1:
            raise ValueError(f"max_running={max_running}, max_prefill_tokens={max_prefill_tokens}: both must be >= 1")
        if deterministic and (overlap or prefix_cache):
            raise ValueError(f"{'overlap' if overlap else 'prefix_cache'}=True with deterministic=True: deterministic "
                             "mode keeps the synchronous decode loop and prefills every prompt whole; leave it unset")
        self.model = model
        model.fuse_projections()
        self.weights = ModelWeights(model, lora, weights_dtype, self._shared)  # before the KV cache takes the memory
        self.adapters, self.fp8 = self.weights.adapters, self.weights.fp8
        self.arch = self.model.cfg
        self.deterministic = deterministic
        self.max_model_len = min(max_model_len or self.arch.max_position_embeddings, self.arch.max_position_embeddings)
        self.max_running = max_running
        num_blocks = num_kv_blocks or KVCache.default_num_blocks(self.arch, kv_block_size, self.dtype, self.device,
                                                                 max_running, self.max_model_len)
        self.blocks = BlockManager(num_blocks, kv_block_size, prefix_cache)
        self.kv_cache = KVCache(self.arch, num_blocks, kv_block_size, self.dtype, self.device)
        self.scheduler = Scheduler(self.blocks, max_running, max_prefill_tokens)
        self.runner = ModelRunner(
            self.model, self.kv_cache, self.blocks, self.device, max_batch=max_running,
            max_model_len=self.max_model_len, cuda_graphs=cuda_graphs, fixed_batch=deterministic,
        )
        if overlap is None:
            overlap = self.runner.graphs is not None and not deterministic
        self.overlap = overlap
        self.overlap_prefill = overlap  # `_prefill_then_decode`; benches turn it off to measure it
        self._results = ResultBuffers(max_running, self.device) if overlap else None
        self._inflight: InflightStep | None = None  # the decode step launched and not yet read
        self._ready: list[Sequence] = []  # finished by a drain outside step(): returned by the next step()
        self.eos_token_ids = frozenset(self.arch.eos_token_ids)
        self._version = weight_version
        self._seed_rng = random.Random(seed)
        self._live: dict[str, int] = {}  # request_id -> samples not yet returned
        self._paused = self._updating = self._closed = False
        # decode_ahead: decode steps launched from the previous step's samples on the device (overlap);
        # discarded_rows: rows computed for a sequence that had stopped in the step before
        # prefills_overlapped: prefills whose samples were read after the next decode step was launched
        # prefills: groups admitted; prefill_batches: admissions (each its own prefill step, the groups of one together)
        self.counters = {"prefills": 0, "prefill_batches": 0, "prefill_tokens": 0, "decode_steps": 0,
                         "tokens_generated": 0, "decode_ahead": 0, "discarded_rows": 0, "prefills_overlapped": 0}

    @property
    def weight_version(self) -> int:
        return self._version

    # ---------------------------------------------------------------- requests

    def add(self, request: GenerationRequest) -> None:
        self._check_open()
        prompt = request.prompt_token_ids.tolist()  # sequences grow by appending: Python ints inside
        self._validate(request, prompt)
        sampling = request.sampling
        seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
        now = time.perf_counter()
        seqs = [
            Sequence(request.request_id, i, prompt, sampling, (seed + i) % _SEED_MOD, now) for i in range(request.n)
        ]
        self._live[request.request_id] = request.n
        self.scheduler.add(SequenceGroup(seqs))

    def step(self) -> list[GenerationOutput]:
        """One round: prefill what can be admitted, one decode step -> the samples that finished (with overlap:
        in the decode step read in this round, launched in the previous one)."""
        self._check_open()
        if self._updating:
            raise RuntimeError("step() during a weight update: call end_weight_update(version) first")
        if self._paused or not self.has_work():
            return []
        finished, self._ready = self._ready, []
        if self._inflight is not None and not self.scheduler.waiting:  # nothing to admit: run ahead
            with stage("engine.decode_ahead"):
                ahead = self._decode_ahead()
            if ahead is not None:
                return self._outputs(finished + ahead)
        with stage("engine.drain"):
            finished += self._drain()  # admission and preemption decide on the complete host state
        with stage("engine.schedule_prefill"):
            groups = self.scheduler.schedule_prefill()
        if groups and self._overlaps_prefill(groups):
            with stage("engine.prefill_overlapped"):
                done, launched = self._prefill_then_decode(groups)
            finished += done
            if launched:
                return self._outputs(finished)
        elif groups:
            finished += self._prefill(groups)
        with stage("engine.schedule_decode"):
            seqs = self.scheduler.schedule_decode()
        if seqs:
            with stage("engine.decode"):
                finished += self._decode(seqs)
        return self._outputs(finished)

    def score(self, groups: list[ForcedGroup]) -> list[list[np.ndarray]]:
        """Logprob of every response token, as generation computes it, in input order: [group][sample]
        -> [response_len] float32. Bitwise equal to the generation logprobs in deterministic mode (same
        weights and sampling params; see `scoring`); needs an idle engine (no requests in flight)."""
        self._check_open()
        if self._paused or self._updating:
            raise RuntimeError("score() while paused or in a weight update: end the update and resume() first")
        self._ready += self._drain()
        if self.has_work():
            raise RuntimeError("score() needs an idle engine: step() until has_work() is false, or abort the "
                               "requests in flight")
        return score_forced(self, groups)

    def has_work(self) -> bool:
        """Queued or running sequences, a decode step in flight, or finished outputs not yet returned."""
        return not self._closed and (self.scheduler.has_work() or self._inflight is not None or bool(self._ready))

    def limits(self) -> EngineLimits:
        return EngineLimits(vocab_size=self.arch.vocab_size, max_model_len=self.max_model_len)

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationOutput]:
        """Also returns, first, these requests' samples that finished in the decode step in flight (their
        outputs were not returned yet), so nothing of an aborted request is left in the engine."""
        self._ready += self._drain()
        ids = None if request_ids is None else set(request_ids)
        done = [s for s in self._ready if ids is None or s.request_id in ids]
        self._ready = [s for s in self._ready if not (ids is None or s.request_id in ids)]
        now = time.perf_counter()
        removed = self.scheduler.remove(ids)
        for seq in removed:
            seq.finish(FinishReason.ABORT, now)
        return self._outputs(done + removed)

    def pause(self, mode: PauseMode) -> list[GenerationOutput]:
        if mode not in ("abort", "continue"):
            raise ValueError(f"pause mode {mode!r}: use 'abort' or 'continue'")
        self._paused = True
        if mode == "abort":
            return self.abort(None)
        self._ready += self._drain()  # the host state is complete while paused
        return []

    def resume(self) -> None:
        self._paused = False

    # ---------------------------------------------------------------- weights

    def begin_weight_update(self) -> None:
        self._check_open()
        self._ready += self._drain()  # no step runs across a weight load
        self._updating = True

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if not self._updating:
            raise RuntimeError("load_weights() outside a weight update: call begin_weight_update() first")
        self.weights.load(named_tensors)

    def load_bucket(self, flat: torch.Tensor, layout: BucketLayout) -> None:
        """Load one received bucket (uint8 [nbytes], `layout` already validated): by the plan of its layout when
        an earlier bucket had the same one, else as load_weights(unflatten(...)) does."""
        if not self._updating:
            raise RuntimeError("load_bucket() outside a weight update: call begin_weight_update() first")
        self.weights.load_bucket(flat, layout)

    def end_weight_update(self, version: int) -> None:
        if not self._updating:
            raise RuntimeError("end_weight_update() without begin_weight_update()")
        self.weights.finish()
        self._updating = False
        self._version = int(version)
        self.blocks.new_weights()

    def receiving_ranks(self) -> int:
        return 1  # this process receives and loads

    # ---------------------------------------------------------------- status

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=self.scheduler.num_waiting(),
            tokens_generated=self.counters["tokens_generated"],
            weight_version=self._version,
            prefill_tokens=self.counters["prefill_tokens"],
            prefix_cache_hit_tokens=self.blocks.hit_tokens,
        )

    def close(self) -> None:
        if self._closed:
            return
        self.abort(None)
        self._closed = True
        del self.runner, self.kv_cache, self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---------------------------------------------------------------- step phases

    def _prefill(self, groups: list[SequenceGroup]) -> list[Sequence]:
        start = self._prefill_begins(groups)
        finished = []
        for batch in ([g] for g in groups) if self.deterministic else [groups]:  # alone: no batch dependence
            seqs, tokens, logprobs = self.runner.prefill(batch)
            finished += self._append(seqs, tokens, logprobs, self._version)
        self._prefill_ends(groups, start)
        return finished

    def _overlaps_prefill(self, groups: list[SequenceGroup]) -> bool:
        """Whether the next decode step can be launched before the prefill's samples are read: overlap on, some
        group samples, and every running row can run ahead (no top-k / top-p, nothing forced)."""
        return (self.overlap_prefill and any(not g.is_resume for g in groups)
                and self.runner.can_run_ahead(self.scheduler.running))

    def _prefill_then_decode(self, groups: list[SequenceGroup]) -> tuple[list[Sequence], bool]:
        """Launch the prefill, then the next decode step, whose new rows take their first tokens from the
        prefill's samples on the device, then read those samples while the GPU decodes; the step's own results
        are read in the next round. The rows and the order are schedule_decode's after a synchronous prefill,
        plus the rows of sequences whose first token stops them (computed and discarded, as in `_decode_ahead`).
        -> (the sequences that finished, whether the step was launched). Not launched when the free blocks do
        not cover it: step() then schedules (and preempts) as the synchronous loop does."""
        start = self._prefill_begins(groups)
        seqs, sampled = self.runner.launch_prefill(groups)
        prefill = self._results.launch(seqs, sampled, self._version)  # its host copy, queued behind it
        column = {id(s): i for i, s in enumerate(seqs)}
        rows, src = [], []
        for seq in self.scheduler.running:
            i = column.get(id(seq), -1)
            if i < 0 or not self._at_length(seq, pending=1):
                rows.append(seq)
                src.append(i)
        launched = bool(rows) and self.scheduler.schedule_rows(rows, [int(i >= 0) for i in src])
        if launched:
            self._launch(rows, src)
            self.counters["prefills_overlapped"] += 1
        finished = self._read(prefill)
        self._prefill_ends(groups, start)
        return finished, launched

    def _prefill_begins(self, groups: list[SequenceGroup]) -> float:
        start = time.perf_counter()
        for seq in (s for g in groups for s in g.seqs if s.prefill_start is None):
            seq.prefill_start = start
        self.counters["prefills"] += len(groups)
        self.counters["prefill_batches"] += 1  # admissions: each a prefill step of its own
        self.counters["prefill_tokens"] += sum(len(g.prefill_token_ids()) - g.num_cached for g in groups)
        return start

    def _prefill_ends(self, groups: list[SequenceGroup], start: float) -> None:
        elapsed = time.perf_counter() - start
        for seq in (s for g in groups for s in g.seqs):
            seq.prefill_s += elapsed

    def _decode(self, seqs: list[Sequence]) -> list[Sequence]:
        """One decode step from the host's tokens: synchronous, or with overlap launched and left in flight."""
        if self.overlap and self.runner.can_run_ahead(seqs):
            self._launch(seqs)
            return []
        tokens, logprobs = self.runner.decode(seqs)
        self.counters["decode_steps"] += 1
        return self._append(seqs, tokens, logprobs, self._version)

    def _decode_ahead(self) -> list[Sequence] | None:
        """Launch the next decode step from the in-flight one's samples on the device, then read and apply
        the in-flight step's results while the GPU runs the new one. Its rows: the in-flight step's sequences
        that still run and do not end with their pending token. -> the sequences that finished; None when the
        free KV blocks do not cover the new step (nothing launched: step() drains and schedules as usual)."""
        prev = self._inflight
        src = [i for i, s in enumerate(prev.seqs) if s.status is SequenceStatus.RUNNING and not self._at_length(s, pending=1)]
        seqs = [prev.seqs[i] for i in src]
        if not self.scheduler.schedule_ahead(seqs):
            return None
        self._inflight = None
        if seqs:
            self._launch(seqs, src)
            self.counters["decode_ahead"] += 1
        return self._read(prev)

    def _launch(self, seqs: list[Sequence], src: list[int] | None = None) -> None:
        sampled = self.runner.launch_decode(seqs, src)
        self.counters["decode_steps"] += 1
        self._inflight = self._results.launch(seqs, sampled, self._version)

    def _drain(self) -> list[Sequence]:
        """Read and apply the step in flight, if any (launching nothing) -> the sequences that finished."""
        prev, self._inflight = self._inflight, None
        return [] if prev is None else self._read(prev)

    def _read(self, step: InflightStep) -> list[Sequence]:
        """Wait for a launched step and apply its tokens. A finished sequence's blocks are freed here although
        the step launched after this one may still write its pending token's KV into them: any later owner of
        those blocks writes them in a step queued after that one on the same stream, so the stale write lands
        first."""
        tokens, logprobs = step.results()
        return self._append(step.seqs, tokens, logprobs, step.version)

    def _append(
        self, seqs: list[Sequence], tokens: torch.Tensor, logprobs: torch.Tensor, version: int
    ) -> list[Sequence]:
        """Apply one token per row, stamped `version`. A row whose sequence no longer runs (it stopped in the step
        before this one, which ran ahead of it) is discarded."""
        now = time.perf_counter()
        finished = []
        running = SequenceStatus.RUNNING
        appended = 0
        for seq, token, logprob in zip(seqs, tokens.tolist(), logprobs.tolist(), strict=True):
            if seq.status is not running:
                continue
            seq.append(token, logprob, version, now)
            appended += 1
            reason = self._finish_reason(seq, token)
            if reason is not None:
                seq.finish(reason, now)
                self.scheduler.finish(seq)
                finished.append(seq)
        self.counters["tokens_generated"] += appended
        self.counters["discarded_rows"] += len(seqs) - appended
        return finished

    def _at_length(self, seq: Sequence, pending: int = 0) -> bool:
        """The length rule: max_new_tokens or max_model_len reached, counting `pending` tokens not yet appended
        (pending = 1: its token in flight is its last, whatever it is)."""
        return (seq.num_outputs + pending >= seq.sampling.max_new_tokens
                or seq.num_tokens + pending >= self.max_model_len)

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        if seq.forced_token_ids is not None:  # scoring: the forced tokens decide, not EOS or max_new_tokens
            return FinishReason.LENGTH if seq.forced_done else None
        params = seq.sampling
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return FinishReason.STOP
        if self._at_length(seq):
            return FinishReason.LENGTH
        return None

    def _outputs(self, seqs: list[Sequence]) -> list[GenerationOutput]:
        for seq in seqs:
            left = self._live.get(seq.request_id, 1) - 1
            if left > 0:
                self._live[seq.request_id] = left
            else:
                self._live.pop(seq.request_id, None)
        return [seq.to_output() for seq in seqs]

    # ---------------------------------------------------------------- checks and defaults

    def _validate(self, request: GenerationRequest, ids: list[int]) -> None:
        rid = request.request_id
        if rid in self._live:
            raise ValueError(f"request {rid!r} is already in flight: request ids must be unique")
        if not 1 <= request.n <= self.max_running:
            raise ValueError(f"request {rid!r}: n={request.n} must be in [1, max_running={self.max_running}]")
        if not ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"request {rid!r}: prompt of {len(ids)} tokens leaves no room (max_model_len={self.max_model_len})"
            )
        if min(ids) < 0 or max(ids) >= self.arch.vocab_size:
            raise ValueError(f"request {rid!r}: token ids must be in [0, {self.arch.vocab_size})")
        self._check_fits(request, len(ids))

    def _check_fits(self, request: GenerationRequest, prompt_len: int) -> None:
        size = self.blocks.block_size
        longest = min(prompt_len + request.sampling.max_new_tokens, self.max_model_len)
        at_admission = blocks_for(prompt_len, size) + request.n - 1
        if max(blocks_for(longest, size), at_admission) > self.blocks.num_blocks:
            raise ValueError(
                f"request {request.request_id!r} needs more KV blocks than the cache has "
                f"({self.blocks.num_blocks} blocks of {size} tokens): raise num_kv_blocks or shorten it"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("engine is closed")
