"""Config of the generator service (read by `asyncrl.generator`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.rollout.config import RolloutConfig


@dataclass(kw_only=True, slots=True)
class GeneratorConfig:
    engine: Literal["torch", "sglang"] = "torch"
    """Inference backend: the built-in torch engine or SGLang."""
    count: int = 1
    """Generator processes."""
    max_running: int = 64
    """Sequences decoded together (engine batch capacity)."""
    kv_cache_tokens: int = 0
    """Torch engine: tokens of KV cache to allocate; 0: auto = max_running x min(model length, 4096 on a GPU, 2048
    on CPU), at most 90 % of the free GPU memory, or 10 % of the available RAM on CPU. Set it when several runs or
    processes share one GPU (the auto size takes it)."""
    inflight_update: Literal["continue", "abort"] = "continue"
    """On a weight update, in-flight requests continue under the new weights (versions recorded per
    token) or are aborted and their prompts returned to the hub."""
    devices: list[str] = field(default_factory=list)
    """Device per generator ("cpu", "cuda:0", ...); default: cpu, or cuda:0 when CUDA is present."""
    heartbeat_s: float = 2.0
    """Seconds between heartbeats to the hub."""
    seed: int = 0
    """Base seed of sampling (each prompt and sample derives its own)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How a prompt becomes samples: one model turn (default), or episodes against an environment
    (docs/rollouts.md)."""
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    """How to reach the SGLang server when engine = "sglang"."""
    deterministic: bool = False
    """Torch engine: batch-invariant generation (each group prefills alone, every decode step runs max_running
    rows), and the learner takes its proximal logprobs from the same engine code (asyncrl/learner/rescorer.py),
    so they equal the behaviour logprobs bit for bit for every token generated on the learner's current weights
    (importance weight exactly 1). Costs generation throughput at low load and, in the learner, an engine pass
    over every batch. Needs learner.off_policy other than "none" to change the learner."""
    weights_dtype: Literal["model", "fp8"] = "model"
    """Precision of the rollouts' matmuls. model: model.dtype. fp8: e4m3 weights with a scale per output channel
    and inputs quantized per token for every projection (norms, embeddings and the lm_head stay in model.dtype),
    re-quantized from each pushed version: torch engine on a GPU of compute capability >= 8.9 (CPU for tests);
    SGLang: the server must run with --quantization fp8. The learner stays in model.dtype, and learner.off_policy
    = "auto" then truncates the importance weight (docs/algorithms.md, "FP8 rollouts"). docs/engine-perf.md has
    its speed."""
    lora_apply: Literal["merge", "unmerged"] = "merge"
    """Torch engine, LoRA adapter pushes (learner.lora_rank > 0, learner.lora_push resolving to "adapter"): how
    the engine applies each version's adapters. merge: W = W0 + scale * B @ A into its weights from a kept copy
    of the base (one more copy of every targeted weight; the engine stops while it merges, ~40-50 ms a push at
    7B on an H200). unmerged: the weights stay the base and every projection adds scale * (x A^T) B^T, the
    learner's own form (no second copy; a push only copies the adapters; two small matmuls beside each
    projection in every step: a decode step 1.28x as long at 7B, batch 128, on an H100). Not with
    weights_dtype = "fp8", deterministic mode or learner.lora_push = "merged". docs/lora.md compares them."""
    share_base: bool = False
    """Torch engine with LoRA adapters kept unmerged (learner.lora_rank > 0, lora_apply = "unmerged"), one learner
    rank, every generator on the learner's device: hold the frozen base once on that device instead of once per
    process. A base holder process (started first, stopped last; the run ends if it dies) keeps its matrices in one
    image the learner and the generators map (CUDA IPC on a GPU, a shared file mapping on the CPU), so each of them
    keeps only the norms, adapters and KV of its own. learner.lora_trainable must name vectors only (the default,
    the norms). docs/lora.md ("One copy of the base") has what it saves."""
    prefix_cache: bool = True
    """Torch engine: keep the KV of full 16-token pages after a request ends and reuse it for a later request whose
    tokens start the same way, computed by the same weights (a weight update forgets every page): an episode's
    next turn then prefills only its new tokens, a re-leased prompt nothing but its last page. It uses only
    otherwise free KV blocks (evicted least recently used first) and costs a hash per page of each prompt. A hit's
    logprobs equal an uncached run's up to rounding (the prefill computes fewer rows). Off in deterministic mode,
    whose numbers must not depend on what ran before. The SGLang engine has the server's radix cache instead."""
    ipc_staging: bool = False
    """Torch engine on the learner's GPU (weight pushes by CUDA IPC): copy each pushed bucket out of the learner's
    buffer on a side stream and ack it, then load it without waiting for the engine's stream, so a push does not
    wait for the decode step in flight. The paused time is then the host's work; the loads (and a LoRA merge)
    still run before the next step, on the GPU. Costs one bucket-sized buffer per bucket in flight. At 7B with
    unmerged adapters the generator paused 12.7 ms a push on an H200 (18.1 ms unstaged on an H100, docs/lora.md).
    No effect on NCCL or gloo pushes."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"generator.count={self.count}: must be >= 1")
        if self.max_running < 1:
            raise ValueError(f"generator.max_running={self.max_running}: must be >= 1")
        if self.kv_cache_tokens < 0:
            raise ValueError(f"generator.kv_cache_tokens={self.kv_cache_tokens}: must be >= 0 (0: auto)")
        if self.deterministic and self.engine != "torch":
            raise ValueError(
                f"generator.deterministic=true needs generator.engine='torch' (now {self.engine!r}): the learner "
                "re-scores with the torch engine's code; for SGLang's own mode set generator.sglang.deterministic"
            )
        if self.devices and len(self.devices) != self.count:
            raise ValueError(
                f"generator.devices has {len(self.devices)} entries but generator.count={self.count}: give one per generator"
            )
