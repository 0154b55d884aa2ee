"""The learner's Trainer: owns the policy (FSDP2), the frozen reference model (only when kl_coef > 0; with LoRA
the policy itself with its adapters off, lora_reference.py), the optimizer and the schedule; one `train_step` per
hub batch.

One learner step, on every rank (each gets the whole batch; prepare.py deals whole groups to ranks):

    prepare      host: one SampleTable of the batch's samples, mapped column -> column (shaping, group
                 filter, outcome advantages, loss weights) -> packed micro-batches (prepare.py)
    to_device    every micro-batch's tensors to the device, once
    old pass     no grad, only where needed; returns one OldPass per micro-batch: old values (ppo), reference
                 logprobs (kl), and proximal logprobs when there are several mini-batches. With one
                 mini-batch the proximal policy IS the current weights, so its logprobs are the training
                 forward's own, detached (the same kernels on the same weights give the same numbers) and the
                 pass is skipped (`_prox_source` = "update"): ~1/4 of a step
    advantages   reinforce_pp / ppo: per-token returns over the packed trained tokens, on the device, whitened
                 over all ranks; returned per micro-batch
    update       per mini-batch: forward -> LossInputs (importance weights) -> loss + backward per
                 micro-batch, clip, AdamW step

Every rank runs the same number of micro-batches (fillers pad the short ones), so FSDP's collectives
line up. Losses carry the global normaliser (losses.sample_weights) and are scaled by world size
because FSDP averages gradients over ranks: the update equals the single-process update on the batch.
Compute runs in bf16 on GPU through FSDP2's mixed precision (a lone process joins a one-rank group; in fp16
with dynamic loss scaling, loss_scale.py, when model.dtype = "float16"),
attention is variable-length over the pack (attention.py) and the lm_head is fused with the logprob
(linear_logprob.py). With `lora_rank > 0` (lora.py) the base is frozen in the compute dtype and only the
adapters and the `lora_trainable` base tensors (the norms) are optimised and checkpointed; the weight push gets
them, or the merged weights under the base's names.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from asyncrl.observe.stage import stage  # named ranges in bench.learner --profile

from asyncrl import records

from asyncrl.models import peft_adapter
from asyncrl.precision import dtypes
from asyncrl.learner import advantages as adv
from asyncrl.learner import attention
from asyncrl.learner import checkpoint as ckpt
from asyncrl.learner import export as exp
from asyncrl.learner import fsdp, lean_attention, lora, losses, optim, residual_stream
from asyncrl.learner.batch_tensors import LossInputs, MicroBatch, OldPass, to_device
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.lora_reference import LoraReference
from asyncrl.learner.loss_scale import LossScale
from asyncrl.learner.model import PolicyModel, load_hf
from asyncrl.learner.prepare import PreparedBatch, prepare_batch
from asyncrl.learner.rescorer import Rescorer
from asyncrl.learner.step_stats import StepStats

_LOSS_SCALE_KEY = "learner_loss_scale"  # fp16's loss scale state rides in the checkpoint's extra dict


class Trainer:
    def __init__(self, cfg: LearnerConfig, model_path: str, *, dtype: str = "auto",
                 device: str | torch.device | None = None, seed: int = 0, rescorer: Rescorer | None = None,
                 residual_fp32: bool = False, logits_fp32: bool = False,
                 base_image: dict[str, torch.Tensor] | None = None) -> None:
        """rescorer: deterministic mode's source of proximal logprobs (rescorer.py); None: the policy's forward.
        residual_fp32: an fp32 residual stream in the decoder (residual_stream.py; ModelConfig.residual_fp32).
        logits_fp32: the lm_head's output in fp32 (asyncrl/precision/fp32_logits.py; ModelConfig.logits_fp32).
        base_image: with LoRA on one rank, the shared base (generator.share_base; asyncrl/weights/base_image.py)
        whose views the frozen matrices become (`shared`: their names), on this device and in the compute dtype."""
        self.cfg = cfg
        self.residual_fp32, self.logits_fp32 = residual_fp32, logits_fp32
        self.rescorer = rescorer
        self.model_path = model_path
        device = fsdp.dist_info(device).device
        self.dtype = dtypes.torch_dtype(dtype, device)  # forward/backward run in it
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.set_num_threads(cfg.resolved_host_threads)  # process-wide: see LearnerConfig.host_threads
        if self.dtype != torch.float32 and not dist.is_initialized():
            fsdp.init_single_rank(device)
        self.dist = fsdp.dist_info(device)
        self.attn = attention.resolve(cfg.attn_implementation, device)
        torch.manual_seed(seed)
        self.lora: dict[str, lora.LoraLinear] = {}  # module path -> adapter module (lora_rank > 0)
        self.lora_trainable: list[str] = []  # HF names of the base parameters trained beside the adapters
        self.base_image, self.shared = base_image, frozenset[str]()  # shared: the matrices that are image views
        if base_image is not None and (not cfg.lora_rank or cfg.ranks != 1):
            raise ValueError("generator.share_base needs LoRA (learner.lora_rank > 0) and one learner rank")
        self.policy = self._build(model_path, cfg.recipe.value_head, trainable=True)
        self.policy.train()  # every module (from_pretrained leaves the HF model in eval); _update keeps it so
        # KL reference: a second, frozen model; with LoRA none, the policy in reference mode (`lora_ref`)
        self.ref = self._build(model_path, False, trainable=False) if cfg.kl_coef > 0 and not self.lora else None
        # Captured while FSDP2 holds the masters (fp32 DTensors); on one rank the modules' own parameters are the
        # unsharded compute-dtype copy from the first forward on (fsdp.ComputeCopy).
        self.masters = list(self.policy.hf.named_parameters())
        self.lora_ref = (LoraReference(self.policy, self.lora.values(), self.masters, self.lora_trainable)
                         if cfg.kl_coef > 0 and self.lora else None)
        self.compute_copy = fsdp.ComputeCopy(self.policy)
        self.optimizer = optim.build_optimizer(self.policy.parameters(), cfg)
        self.scheduler = optim.build_scheduler(self.optimizer, cfg)
        self.loss_scale = LossScale(self.dist.device, enabled=self.dtype == torch.float16, init=cfg.loss_scale_init,
                                    growth_interval=cfg.loss_scale_growth_interval)
        self.checkpoints = ckpt.CheckpointWriter()
        self.version = 0  # policy version of the current weights (generators stamp tokens with it)
        self.step = 0  # last completed learner step

    def _build(self, path: str, value_head: bool, trainable: bool) -> PolicyModel:
        hf = load_hf(path, self.attn)
        if trainable and self.cfg.lora_rank:
            self.lora = lora.apply(hf, self.cfg.lora_targets, self.cfg.lora_rank, self.cfg.lora_alpha,
                                   self.cfg.lora_dropout)
            self.lora_trainable = lora.trainable_paths(hf, self.cfg.lora_trainable, self.cfg.lora_targets)
            if self.base_image is not None:  # before the move to the device: the image is there already
                self.shared = lora.adopt_base(hf, self.base_image, self.lora_trainable, self.dtype, self.dist.device)
        if self.attn == attention.NAME:  # token-major attention forward for packed rows (same parameters)
            lean_attention.install(hf)
        if self.residual_fp32:
            residual_stream.install(hf)
        if trainable and self.cfg.activation_checkpointing:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.cfg.compile:
            for layer in fsdp.decoder_layers(hf):
                layer.compile(dynamic=True)
        model = PolicyModel(hf, value_head, self.cfg.logprob_chunk_tokens, self.logits_fp32).to(self.dist.device)
        model.requires_grad_(trainable)
        if trainable and self.lora:  # before sharding: FSDP2 reads requires_grad and dtypes when it wraps
            lora.freeze_base(hf, self.dtype, self.lora_trainable)
        if self.dist.sharded:
            fsdp.shard(model, hf, self.dtype, self.dist.device)
        return model

    # ------------------------------------------------------------------ the step

    def train_step(self, batch: records.Batch) -> dict[str, float]:
        """One learner step on `batch` (the same whole batch on every rank). Returns metrics, identical on
        every rank."""
        t0 = time.perf_counter()
        with stage("prepare"):
            prep = prepare_batch(batch, self.cfg, self.dist.rank, self.dist.world_size, self.version)
        with stage("to_device"):
            to_device(prep.micro_batches(), self.dist.device)
        source = self._prox_source(prep)
        with stage("old_pass"):
            olds = self._old_pass(prep, batch, source)  # [micro-batch]
        advantages = self._advantages(prep, olds)  # [micro-batch] -> (advantages [n], returns [n] | None)
        stats = StepStats(self.dist.device)
        with stage("update"):
            grad_norms = self._update(prep, olds, advantages, source == "update", stats)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        self.version += 1
        self.step = batch.step
        with stage("stats"):
            metrics = {**prep.metrics, **stats.reduce(len(prep.mini_batches))}
            grad_norm = _largest_norm(grad_norms, self.loss_scale.enabled)
            if self.loss_scale.enabled:
                metrics.update(loss_scale=self.loss_scale.scale.item(), skipped_updates=self.loss_scale.skipped.item())
                self.loss_scale.check(metrics["loss_scale"])
        metrics.update(grad_norm=grad_norm, lr=lr, optimizer_steps=float(len(grad_norms)),
                       policy_version=float(self.version), step_time_s=time.perf_counter() - t0)
        return metrics

    def _forward(self, model: PolicyModel, mb: MicroBatch) -> tuple[Tensor, Tensor, Tensor | None]:
        varlen = (mb.cu_seqlens, mb.max_seqlen) if self.attn == attention.NAME else (None, 0)
        with fsdp.autocast(self.dist, self.dtype):
            return model(mb.input_ids, mb.position_ids, mb.gather_idx, mb.targets, mb.temperature, *varlen)

    def _prox_source(self, prep: PreparedBatch) -> str:
        """Where this step's proximal logprobs come from: "behaviour" (no off-policy correction), "rescorer"
        (deterministic mode), "update" (the update's own forward, detached: see `_prox_from_update`) or "pass"
        (the old pass's forward; always with a value head, whose pass runs anyway)."""
        if self.cfg.off_policy == "none":
            return "behaviour"
        if self.rescorer is not None:
            return "rescorer"
        return "update" if self._prox_from_update(prep) and not self.cfg.recipe.value_head else "pass"

    def _prox_from_update(self, prep: PreparedBatch) -> bool:
        """The proximal logprobs can come from the update's own forward: one mini-batch (so its forward runs
        on the weights before this step), and nothing reads them before the update (KL-in-reward does)."""
        return (self.cfg.off_policy != "none" and len(prep.mini_batches) == 1
                and not (self.cfg.kl_in_reward and self.cfg.kl_coef > 0))

    @torch.no_grad()
    def _old_pass(self, prep: PreparedBatch, batch: records.Batch, source: str) -> list[OldPass]:
        """Quantities of the weights before this step's update, one OldPass per micro-batch (no grad)."""
        rescored = self._rescore(prep, batch) if source == "rescorer" else None
        forward = source == "pass" or self.cfg.recipe.value_head
        if forward:  # eval() / train() walk every module: ~2 ms of host time before the step's first kernel
            self.policy.eval()
        mbs = prep.micro_batches()
        refs = self._ref_logprobs(mbs)  # [micro-batch] of [n] or None
        return [self._old(mb, source, forward, rescored, ref) for mb, ref in zip(mbs, refs)]

    def _old(self, mb: MicroBatch, source: str, forward: bool, rescored: dict[int, np.ndarray] | None,
             ref: Tensor | None) -> OldPass:
        logp, _, values = self._forward(self.policy, mb) if forward else (None, None, None)
        prox = {"behaviour": mb.behav_logp, "pass": logp, "update": None}.get(source)
        if rescored is not None:
            prox = _packed_logprobs(mb, rescored)
        return OldPass(prox_logp=prox, values=values, ref_logp=ref)

    def _ref_logprobs(self, mbs: list[MicroBatch]) -> list[Tensor | None]:
        """The reference policy's logprobs [n] of every micro-batch (kl_coef > 0; else Nones): the frozen reference
        model's, or with LoRA the policy's own in reference mode (adapters off, pristine norms: lora_reference.py)."""
        if self.ref is not None:
            self.ref.eval()
            return [self._forward(self.ref, mb)[0] for mb in mbs]
        if self.lora_ref is None:
            return [None] * len(mbs)
        with self.lora_ref.mode():
            return [self._forward(self.policy, mb)[0] for mb in mbs]

    def _rescore(self, prep: PreparedBatch, batch: records.Batch) -> dict[int, np.ndarray]:
        """Deterministic mode: this rank's samples scored by the generator's engine code on these weights."""
        self.rescorer.load(self.named_full_tensors(), self.version)
        mine = [prep.seqs[i] for mb in prep.micro_batches() for i in mb.seq_index if i >= 0]
        return self.rescorer.score(mine, [group.prompt.sampling for group in batch.groups])

    def _advantages(self, prep: PreparedBatch, olds: list[OldPass]) -> list[tuple[Tensor, Tensor | None]]:
        """Per micro-batch (advantages [n], returns [n] or None): the prepared outcome-level ones, or the
        token-level estimator's."""
        if not self.cfg.recipe.token_level:
            return [(mb.advantages, None) for mb in prep.micro_batches()]
        return self._token_advantages(prep, olds)

    def _token_advantages(self, prep: PreparedBatch, olds: list[OldPass]) -> list[tuple[Tensor, Tensor]]:
        """Token-level recipes (reinforce_pp, ppo): per-token rewards (+ KL-in-reward) -> returns / GAE over the
        trained tokens of this rank's micro-batches, packed end to end (environment tokens left out), whitened
        over all ranks; on the device."""
        cfg, mbs = self.cfg, prep.micro_batches()
        rows = [i for mb in mbs for i in mb.seq_index if i >= 0]  # this rank's samples, in pack order
        lens = torch.from_numpy(prep.table.trained_len[rows])  # [B] host
        rewards = adv.host_to(self.dist.device, torch.from_numpy(prep.table.reward[rows].astype(np.float32)))  # [B]
        kl = values = None
        if cfg.kl_in_reward and cfg.kl_coef > 0:
            kl = _trained([losses.kl_k1(o.prox_logp, o.ref_logp) for o in olds], mbs, self.dist.device)  # [N]
        if cfg.recipe.value_head:
            values = _trained([o.values for o in olds], mbs, self.dist.device)  # [N]
        token_rewards = adv.packed_token_rewards(rewards, lens, kl, cfg.kl_coef)  # [N]
        a, ret = adv.packed_estimator(cfg.recipe.advantage)(token_rewards, lens, values, cfg.gamma, cfg.gae_lambda,
                                                            reduce=fsdp.all_reduce)  # [N], [N]
        counts = [len(mb.trained_idx) for mb in mbs]
        return [(_scattered(mb, pa), _scattered(mb, pr)) for mb, pa, pr in zip(mbs, a.split(counts), ret.split(counts))]

    def _update(self, prep: PreparedBatch, olds: list[OldPass], advantages: list[tuple[Tensor, Tensor | None]],
                prox_from_update: bool, stats: StepStats) -> list[Tensor]:
        """Forward + backward of every micro-batch, one optimizer step per mini-batch. Returns the grad norms
        (0-d device tensors, read once with the step's other metrics)."""
        grad_norms = []
        if not self.policy.training:
            self.policy.train()
        per_mb = iter(zip(olds, advantages))
        for mbs in prep.mini_batches:
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                fsdp.accumulating(self.policy, last=i == len(mbs) - 1)
                self._backward(mb, *next(per_mb), prox_from_update, stats)
            with stage("optimizer"):
                grad_norms.append(optim.clip_grad_norm(self._trainable(), self.cfg.max_grad_norm, self.optimizer,
                                                       self.loss_scale))
                optim.step(self.optimizer, self.loss_scale)
                self.compute_copy.refresh()
        return grad_norms

    def _trainable(self) -> list[Tensor]:
        """The fp32 masters the optimizer updates (their gradients are the reduced ones)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _backward(self, mb: MicroBatch, old: OldPass, advantages: tuple[Tensor, Tensor | None], prox_from_update: bool,
                  stats: StepStats) -> None:
        cfg = self.cfg
        with stage("forward"):
            logp, entropy, values = self._forward(self.policy, mb)
        x = self._loss_inputs(mb, old, advantages, logp.detach() if prox_from_update else old.prox_logp)
        pg, clipped = losses.policy_loss(logp, x.old_logp, x.advantages, x.seq_lens, cfg, x.mask)
        token_loss = x.is_weights * pg  # [n]
        terms = {"pg_loss": losses.aggregate(token_loss, x.agg_weights)}
        if x.ref_logp is not None:
            kl = losses.kl_k3(logp, x.ref_logp, clamp=cfg.kl_clamp)
            stats.add_masked_sum("kl", kl.detach(), x.mask)
            if not cfg.kl_in_reward:
                token_loss = token_loss + cfg.kl_coef * kl
                terms["kl_loss"] = losses.aggregate(cfg.kl_coef * kl, x.agg_weights)
        if values is not None:
            vl, vclipped = losses.value_loss(values, x.old_values, x.returns, cfg.value_clip)
            token_loss = token_loss + cfg.value_coef * vl
            terms["value_loss"] = losses.aggregate(vl, x.agg_weights)
            stats.add_masked_sum("value_clip_frac", vclipped, x.mask)
        loss = losses.aggregate(token_loss, x.agg_weights)
        with stage("backward"):
            self.loss_scale.scaled(loss * self.dist.world_size).backward()
        stats.add_terms({"loss": loss, **terms})
        stats.add_tokens(x, entropy, clipped)

    def _loss_inputs(self, mb: MicroBatch, old: OldPass, advantages: tuple[Tensor, Tensor | None],
                     prox_logp: Tensor | None) -> LossInputs:
        """The loss's inputs for `mb`, with the behaviour -> proximal importance weights of `prox_logp` [n]."""
        assert prox_logp is not None, "the old pass returns proximal logprobs unless the update supplies them"
        cfg = self.cfg
        is_weights, is_dropped = losses.importance_weights(
            prox_logp, mb.behav_logp, cfg.resolved_off_policy, cfg.importance_cap, low=cfg.correction.low,
            level=cfg.correction.level, seq_lens=mb.seq_lens, mask=mb.mask)
        return LossInputs(mask=mb.mask, agg_weights=mb.agg_weights, seq_lens=mb.seq_lens, behav_logp=mb.behav_logp,
                          advantages=advantages[0], old_logp=prox_logp, is_weights=is_weights, is_dropped=is_dropped,
                          returns=advantages[1], old_values=old.values, ref_logp=old.ref_logp)

    # ------------------------------------------------------------------ weights, checkpoints, export

    def named_full_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(Hugging Face name, full tensor) of every policy parameter, in a fixed order: the weight push, the
        rescorer and the export read it. Every rank must iterate it (DTensor.full_tensor() is a collective);
        tied weights appear once. fp32 masters; with LoRA the merged weights (fp32, W + scale * B @ A from
        the frozen base, fresh each call) under the base's names, the rest of the base in the compute dtype."""
        full = ((name, fsdp.full_tensor(p.detach())) for name, p in self.masters)
        return lora.merged_tensors(full, self.lora) if self.lora else full

    def adapter_tensors(self) -> dict[str, Tensor]:
        """LoRA: {"<HF module path>.lora_A" / ".lora_B", or the HF name of a `lora_trainable` base parameter: full
        fp32 tensor on the host}, what an adapter push carries (collective)."""
        return {name: t.cpu() for name, t in lora.adapter_push(self.masters)}

    def save_checkpoint(self, run_dir: str | Path, extra: dict[str, Any] | None = None,
                        background: bool = False) -> Path | None:
        """Atomic checkpoint of the whole learner state at `self.step` (collective: every rank calls it).
        With `background`, returns after the snapshot (`self.checkpoints.finished()` reports the write), or
        None when skipped because the previous write is still going."""
        extra = dict(extra or {})
        if self.loss_scale.enabled:
            extra[_LOSS_SCALE_KEY] = self.loss_scale.state_dict()
        taken = self.checkpoints.save(run_dir, model=self.policy, optimizer=self.optimizer, scheduler=self.scheduler,
                                      step=self.step, policy_version=self.version, extra=extra,
                                      keep=self.cfg.keep_checkpoints, background=background)
        return Path(run_dir) / "checkpoints" / f"step-{self.step:08d}" if taken else None

    def reserve_checkpoint_buffers(self) -> None:
        """Allocate the checkpoint's pinned host buffers now (call after the first step) instead of inside
        the first checkpoint's stall (collective-free; a no-op off GPU or with several ranks)."""
        self.checkpoints.reserve(self.policy, self.optimizer)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint (collective); returns its `extra` dict (e.g. the hub's commit point)."""
        meta = ckpt.load_checkpoint(path, model=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)
        self.step, self.version = meta.step, meta.policy_version
        extra = dict(meta.extra)
        self.loss_scale.load_state_dict(extra.pop(_LOSS_SCALE_KEY, {}))
        return extra

    def export(self, out_dir: str | Path) -> Path:
        """Plain Hugging Face folder of the current policy (collective; rank 0 writes). With LoRA it holds the
        merged weights, and <out_dir>/adapter the adapters alone in PEFT's layout."""
        adapter = None
        if self.lora:
            cfg = self.cfg
            config = peft_adapter.peft_config(cfg.lora_targets, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout,
                                              self.model_path)
            tensors = self.adapter_tensors()
            adapters = {k: v for k, v in tensors.items() if lora.is_adapter(k)}
            state = {**peft_adapter.peft_state_dict(adapters), **lora.peft_saved(tensors, self.lora_trainable)}
            config["modules_to_save"] = lora.peft_modules_to_save(self.lora_trainable)
            adapter = peft_adapter.PeftAdapter(state, config)
        return exp.export_hf(self.named_full_tensors(), self.policy.hf.config, self.model_path, out_dir,
                             write=self.dist.rank == 0, adapter=adapter)


def _largest_norm(grad_norms: list[Tensor], loss_scaled: bool) -> float:
    """The step's reported grad_norm: the largest over its optimizer steps. With fp16 loss scaling an
    overflowed (skipped) update's norm is inf by design and counted in `skipped_updates` instead."""
    if not grad_norms:
        return 0.0
    norms = torch.stack(grad_norms)
    if loss_scaled:
        norms = torch.where(torch.isfinite(norms), norms, torch.zeros_like(norms))
    return norms.max().item()


def _trained(per_mb: list[Tensor], mbs: list[MicroBatch], device: torch.device) -> Tensor:
    """Per-micro-batch token tensors [n_i] -> their trained tokens, packed end to end [N]."""
    return torch.cat([torch.zeros(0, device=device)] + [x[mb.trained_idx].float() for x, mb in zip(per_mb, mbs)])


def _scattered(mb: MicroBatch, trained: Tensor) -> Tensor:
    """Values of the micro-batch's trained tokens [m] -> [n], 0 on its other tokens."""
    return torch.zeros_like(mb.behav_logp).index_copy(0, mb.trained_idx, trained)


def _packed_logprobs(mb: MicroBatch, rescored: dict[int, np.ndarray]) -> Tensor:
    """Per-sequence logprobs -> [n] in the micro-batch's token order (a filler sequence keeps its behaviour
    logprobs: its mask is 0)."""
    parts, start = [], 0
    for length, index in zip(mb.seq_lens.tolist(), mb.seq_index):
        parts.append(torch.from_numpy(rescored[index]) if index >= 0 else mb.behav_logp[start:start + length].cpu())
        start += length
    return torch.cat(parts).to(mb.behav_logp.device)
