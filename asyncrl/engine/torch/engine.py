"""TorchEngine: the built-in generation engine (implements `asyncrl.engine.protocol.Engine`).

One thread (the generator service) drives it:

    add(request) ──▶ Scheduler.waiting ──step()──▶ prefill new groups + decode running ──▶ finished outputs
                                          ▲
    pause ▸ begin_weight_update ▸ load_weights* ▸ end_weight_update(v) ▸ resume   (between steps)

Every sampled token is stamped with the weight version current when its step was launched. With
pause('continue') in-flight sequences keep their KV cache and continue under the new weights. With
`prefix_cache`, requests reuse full KV pages of earlier ones computed by the same weights (`prefix_cache`).
`score(groups)` runs given responses through the same steps with their tokens forced (`scoring`).

Each step() is one round of `StepLoop` (step_loop.py): admit and prefill, then one decode step, overlapped with
the next round's launch when `overlap` is on (on by default with CUDA graphs); anything that needs the complete
host state (pause, abort, begin_weight_update, score, close) first drains the step in flight.
"""

from __future__ import annotations

import inspect
import os
import random
import time
from collections.abc import Iterable, Mapping

import numpy as np
import torch

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
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.scoring import score_forced
from asyncrl.engine.torch.step_loop import StepLoop
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup
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
        self.loop = StepLoop(self.runner, self.scheduler, max_running=max_running, max_model_len=self.max_model_len,
                             eos_token_ids=frozenset(self.arch.eos_token_ids), deterministic=deterministic,
                             overlap=overlap, version=weight_version, device=self.device)
        self._ready: list[Sequence] = []  # finished by a drain outside step(): returned by the next step()
        self._seed_rng = random.Random(seed)
        self._live: dict[str, int] = {}  # request_id -> samples not yet returned
        self._paused = self._updating = self._closed = False

    @property
    def overlap(self) -> bool:
        return self.loop.overlap

    @property
    def overlap_prefill(self) -> bool:
        """Whether a prefill is overlapped with the next decode step (StepLoop); benches turn it off to measure it."""
        return self.loop.overlap_prefill

    @overlap_prefill.setter
    def overlap_prefill(self, on: bool) -> None:
        self.loop.overlap_prefill = on

    @property
    def counters(self) -> dict[str, int]:
        """The step loop's counts: prefills, decode steps, tokens generated, ... (StepLoop.counters)."""
        return self.loop.counters

    @property
    def weight_version(self) -> int:
        return self.loop.version

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
        """One round of the step loop: prefill what can be admitted, one decode step -> the samples that finished
        (with overlap: in the decode step read in this round, launched in the previous one)."""
        self._check_open()
        if self._updating:
            raise RuntimeError("step() during a weight update: call end_weight_update(version) first")
        if self._paused or not self.has_work():
            return []
        finished, self._ready = self._ready, []
        return self._outputs(finished + self.loop.round())

    def score(self, groups: list[ForcedGroup]) -> list[list[np.ndarray]]:
        """Logprob of every response token, as generation computes it, in input order: [group][sample]
        -> [response_len] float32. Bitwise equal to the generation logprobs in deterministic mode (same
        weights and sampling params; see `scoring`); needs an idle engine (no requests in flight)."""
        self._check_open()
        if self._paused or self._updating:
            raise RuntimeError("score() while paused or in a weight update: end the update and resume() first")
        self._ready += self.loop.drain()
        if self.has_work():
            raise RuntimeError("score() needs an idle engine: step() until has_work() is false, or abort the "
                               "requests in flight")
        return score_forced(self, groups)

    def has_work(self) -> bool:
        """Queued or running sequences, a decode step in flight, or finished outputs not yet returned."""
        return not self._closed and (self.scheduler.has_work() or self.loop.inflight is not None or bool(self._ready))

    def limits(self) -> EngineLimits:
        return EngineLimits(vocab_size=self.arch.vocab_size, max_model_len=self.max_model_len)

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationOutput]:
        """Also returns, first, these requests' samples that finished in the decode step in flight (their
        outputs were not returned yet), so nothing of an aborted request is left in the engine."""
        self._ready += self.loop.drain()
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
        self._ready += self.loop.drain()  # the host state is complete while paused
        return []

    def resume(self) -> None:
        self._paused = False

    # ---------------------------------------------------------------- weights

    def begin_weight_update(self) -> None:
        self._check_open()
        self._ready += self.loop.drain()  # no step runs across a weight load
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
        self.loop.version = int(version)
        self.blocks.new_weights()

    def receiving_ranks(self) -> int:
        return 1  # this process receives and loads

    # ---------------------------------------------------------------- status

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=self.scheduler.num_waiting(),
            tokens_generated=self.counters["tokens_generated"],
            weight_version=self.loop.version,
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

    # ---------------------------------------------------------------- outputs

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
