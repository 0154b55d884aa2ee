"""The learner's Trainer: owns the policy (FSDP2), the frozen reference model (only when kl_coef > 0), the
optimizer and the schedule; one `train_step` per hub batch.

One learner step, on every rank (each gets the whole batch; prepare.py deals whole groups to ranks):

    prepare      host: rewards -> shaping -> filter -> outcome advantages -> packed micro-batches
    to_device    every micro-batch's tensors to the device, once
    old pass     no grad, only where needed: old values (ppo), reference logprobs (kl), and proximal
                 logprobs when there are several mini-batches. With one mini-batch the proximal policy IS
                 the current weights, so its logprobs are the training forward's own, detached (the same
                 kernels on the same weights give the same numbers) and the pass is skipped: ~1/4 of a step
    advantages   reinforce_pp / ppo: per-token returns, whitened over all ranks
    update       per mini-batch: forward + loss + backward per micro-batch, clip, AdamW step

Every rank runs the same number of micro-batches (fillers pad the short ones), so FSDP's collectives
line up. Losses carry the global normaliser (losses.aggregation_weights) and are scaled by world size
because FSDP averages gradients over ranks: the update equals the single-process update on the batch.
Compute runs in bf16 on GPU through FSDP2's mixed precision (a lone process joins a one-rank group; in fp16
with dynamic loss scaling, loss_scale.py, when model.dtype = "float16"),
attention is variable-length over the pack (attention.py) and the lm_head is fused with the logprob
(linear_logprob.py). With `lora_rank > 0` (lora.py) the base is frozen in the compute dtype and only the
adapters are optimised and checkpointed; the weight push gets the merged weights under the base's names.
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
from asyncrl.stage import stage  # named ranges in bench.learner --profile

from asyncrl import dtypes, records
from asyncrl.learner import advantages as adv
from asyncrl.learner import attention
from asyncrl.learner import checkpoint as ckpt
from asyncrl.learner import export as exp
from asyncrl.learner import fsdp, lean_attention, lora, losses, optim, residual_stream
from asyncrl.learner.batch_tensors import MicroBatch, to_device
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.loss_scale import LossScale
from asyncrl.learner.model import PolicyModel, load_hf
from asyncrl.learner.prepare import PreparedBatch, prepare_batch
from asyncrl.learner.rescorer import Rescorer
from asyncrl.learner.step_stats import StepStats

_LOSS_SCALE_KEY = "learner_loss_scale"  # fp16's loss scale state rides in the checkpoint's extra dict


class Trainer:
    def __init__(self, cfg: LearnerConfig, model_path: str, *, dtype: str = "auto",
                 device: str | torch.device | None = None, seed: int = 0, rescorer: Rescorer | None = None,
                 residual_fp32: bool = False, logits_fp32: bool = False) -> None:
        """rescorer: deterministic mode's source of proximal logprobs (rescorer.py); None: the policy's forward.
        residual_fp32: an fp32 residual stream in the decoder (residual_stream.py; ModelConfig.residual_fp32).
        logits_fp32: the lm_head's output in fp32 (asyncrl/fp32_logits.py; ModelConfig.logits_fp32)."""
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
        self.policy = self._build(model_path, cfg.recipe.value_head, trainable=True)
        self.policy.train()  # every module (from_pretrained leaves the HF model in eval); _update keeps it so
        self.ref = self._build(model_path, False, trainable=False) if cfg.kl_coef > 0 else None
        # Captured while FSDP2 holds the masters (fp32 DTensors); on one rank the modules' own parameters are the
        # unsharded compute-dtype copy from the first forward on (fsdp.ComputeCopy).
        self.masters = list(self.policy.hf.named_parameters())
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
            lora.freeze_base(hf, self.dtype)
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
            to_device(list(self._micro_batches(prep)), self.dist.device)
        with stage("old_pass"):
            self._old_pass(prep, batch)
        if self.cfg.recipe.token_level:
            self._token_advantages(prep)
        stats = StepStats(self.dist.device)
        with stage("update"):
            grad_norms = self._update(prep, stats)
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

    @staticmethod
    def _micro_batches(prep: PreparedBatch) -> Iterator[MicroBatch]:
        for mbs in prep.mini_batches:
            yield from mbs

    def _forward(self, model: PolicyModel, mb: MicroBatch) -> tuple[Tensor, Tensor, Tensor | None]:
        varlen = (mb.cu_seqlens, mb.max_seqlen) if self.attn == attention.NAME else (None, 0)
        with fsdp.autocast(self.dist, self.dtype):
            return model(mb.input_ids, mb.position_ids, mb.gather_idx, mb.targets, mb.temperature, *varlen)

    @torch.no_grad()
    def _old_pass(self, prep: PreparedBatch, batch: records.Batch) -> None:
        """Quantities of the weights before this step's update, per micro-batch (no grad)."""
        rescored = self._rescore(prep, batch) if self.rescorer is not None and self.cfg.off_policy != "none" else None
        deferred = rescored is None and self._prox_from_update(prep)
        need_prox = (self.cfg.off_policy != "none" and not deferred and rescored is None) or self.cfg.recipe.value_head
        if need_prox:  # eval() / train() walk every module: ~2 ms of host time before the step's first kernel
            self.policy.eval()
        for mb in self._micro_batches(prep):
            mb.old_logp = None if deferred else mb.behav_logp
            if need_prox:
                logp, _, values = self._forward(self.policy, mb)
                mb.old_values = values
                if self.cfg.off_policy != "none":
                    mb.old_logp = logp
            if rescored is not None:
                mb.old_logp = _packed_logprobs(mb, rescored)
            if mb.old_logp is not None:
                self._set_importance(mb)
            if self.ref is not None:
                self.ref.eval()
                mb.ref_logp = self._forward(self.ref, mb)[0]

    def _rescore(self, prep: PreparedBatch, batch: records.Batch) -> dict[int, np.ndarray]:
        """Deterministic mode: this rank's samples scored by the generator's engine code on these weights."""
        self.rescorer.load(self.named_full_tensors(), self.version)
        mine = [prep.seqs[i] for mb in self._micro_batches(prep) for i in mb.seq_index if i >= 0]
        return self.rescorer.score(mine, [group.prompt.sampling for group in batch.groups])

    def _prox_from_update(self, prep: PreparedBatch) -> bool:
        """The proximal logprobs can come from the update's own forward: one mini-batch (so its forward runs
        on the weights before this step), and nothing reads them before the update (KL-in-reward does)."""
        return (self.cfg.off_policy != "none" and len(prep.mini_batches) == 1
                and not (self.cfg.kl_in_reward and self.ref is not None))

    def _set_importance(self, mb: MicroBatch) -> None:
        cfg = self.cfg
        mb.is_weights, mb.is_dropped = losses.importance_weights(
            mb.old_logp, mb.behav_logp, cfg.off_policy, cfg.importance_cap, low=cfg.correction.low,
            level=cfg.correction.level, seq_lens=mb.seq_lens, mask=mb.mask)

    def _token_advantages(self, prep: PreparedBatch) -> None:
        """Token-level recipes (reinforce_pp, ppo): per-token rewards (+ KL-in-reward) -> returns / GAE, whitened
        globally."""
        seq_parts: list[tuple[MicroBatch, int, int, int]] = []  # (mb, start, length, seq index)
        for mb in self._micro_batches(prep):
            start = 0
            for length, index in zip(mb.seq_lens.tolist(), mb.seq_index):
                seq_parts.append((mb, start, length, index))
                start += length
        real = [p for p in seq_parts if p[3] >= 0]
        # each sequence's trained tokens (loss_mask 1) in order, as one row: environment tokens are skipped
        host_mask = {id(mb): mb.mask.cpu() for mb, *_ in real}  # one copy per micro-batch
        trained = [s + torch.nonzero(host_mask[id(mb)][s:s + n] > 0).squeeze(-1) for mb, s, n, _ in real]  # [n_i]
        width = max((len(t) for t in trained), default=1)
        mask = torch.zeros(len(real), width)  # [B, L]
        kl = torch.zeros(len(real), width)
        values = torch.zeros(len(real), width)
        for i, ((mb, s, n, _), t) in enumerate(zip(real, trained)):
            mask[i, :len(t)] = 1.0
            if self.cfg.kl_in_reward and mb.ref_logp is not None:
                kl[i, :len(t)] = losses.kl_k1(mb.old_logp[t], mb.ref_logp[t]).cpu()
            if mb.old_values is not None:
                values[i, :len(t)] = mb.old_values[t].float().cpu()
        rewards = torch.tensor([prep.seqs[p[3]].reward for p in real], dtype=torch.float32)
        token_rewards = adv.outcome_token_rewards(rewards, mask, kl if self.cfg.kl_in_reward else None, self.cfg.kl_coef)
        fn = adv.estimator(self.cfg.recipe.advantage)
        a, ret = fn(token_rewards, mask, values, self.cfg.gamma, self.cfg.gae_lambda, reduce=fsdp.all_reduce)
        for mb in {id(p[0]): p[0] for p in seq_parts}.values():
            mb.advantages = torch.zeros_like(mb.behav_logp)
            mb.returns = torch.zeros_like(mb.behav_logp)
        for i, ((mb, s, n, _), t) in enumerate(zip(real, trained)):
            mb.advantages[t.to(mb.advantages.device)] = a[i, :len(t)].to(mb.advantages.device)
            mb.returns[t.to(mb.returns.device)] = ret[i, :len(t)].to(mb.returns.device)

    def _update(self, prep: PreparedBatch, stats: StepStats) -> list[Tensor]:
        """Forward + backward of every micro-batch, one optimizer step per mini-batch. Returns the grad norms
        (0-d device tensors, read once with the step's other metrics)."""
        grad_norms = []
        if not self.policy.training:
            self.policy.train()
        for mbs in prep.mini_batches:
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                fsdp.accumulating(self.policy, last=i == len(mbs) - 1)
                self._backward(mb, stats)
            with stage("optimizer"):
                grad_norms.append(optim.clip_grad_norm(self._trainable(), self.cfg.max_grad_norm, self.optimizer,
                                                       self.loss_scale))
                optim.step(self.optimizer, self.loss_scale)
                self.compute_copy.refresh()
        return grad_norms

    def _trainable(self) -> list[Tensor]:
        """The fp32 masters the optimizer updates (their gradients are the reduced ones)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _backward(self, mb: MicroBatch, stats: StepStats) -> None:
        cfg = self.cfg
        with stage("forward"):
            logp, entropy, values = self._forward(self.policy, mb)
        if mb.old_logp is None:  # proximal = these weights (one mini-batch): this forward's own logprobs
            mb.old_logp = logp.detach()
            self._set_importance(mb)
        pg, clipped = losses.policy_loss(logp, mb.old_logp, mb.advantages, mb.seq_lens, cfg, mb.mask)
        token_loss = mb.is_weights * pg  # [n]
        terms = {"pg_loss": losses.aggregate(token_loss, mb.agg_weights)}
        if self.ref is not None:
            kl = losses.kl_k3(logp, mb.ref_logp, clamp=cfg.kl_clamp)
            stats.add_masked_sum("kl", kl.detach(), mb.mask)
            if not cfg.kl_in_reward:
                token_loss = token_loss + cfg.kl_coef * kl
                terms["kl_loss"] = losses.aggregate(cfg.kl_coef * kl, mb.agg_weights)
        if values is not None:
            vl, vclipped = losses.value_loss(values, mb.old_values, mb.returns, cfg.value_clip)
            token_loss = token_loss + cfg.value_coef * vl
            terms["value_loss"] = losses.aggregate(vl, mb.agg_weights)
            stats.add_masked_sum("value_clip_frac", vclipped, mb.mask)
        loss = losses.aggregate(token_loss, mb.agg_weights)
        with stage("backward"):
            self.loss_scale.scaled(loss * self.dist.world_size).backward()
        stats.add_terms({"loss": loss, **terms})
        stats.add_tokens(mb, entropy, clipped)

    # ------------------------------------------------------------------ weights, checkpoints, export

    def named_full_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(Hugging Face name, full tensor) of every policy parameter, in a fixed order: the weight push, the
        rescorer and the export read it. Every rank must iterate it (DTensor.full_tensor() is a collective);
        tied weights appear once. fp32 masters; with LoRA the merged weights (fp32, W + scale * B @ A from
        the frozen base, fresh each call) under the base's names, the rest of the base in the compute dtype."""
        full = ((name, fsdp.full_tensor(p.detach())) for name, p in self.masters)
        return lora.merged_tensors(full, self.lora) if self.lora else full

    def adapter_tensors(self) -> dict[str, Tensor]:
        """LoRA: {"<HF module path>.lora_A" / ".lora_B": full fp32 tensor on the host} (collective)."""
        return {name: fsdp.full_tensor(p.detach()).cpu() for name, p in self.masters if lora.is_adapter(name)}

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
            config = lora.peft_config(cfg.lora_targets, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout,
                                      self.model_path)
            adapter = exp.PeftAdapter(lora.peft_state_dict(self.adapter_tensors()), config)
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


def _packed_logprobs(mb: MicroBatch, rescored: dict[int, np.ndarray]) -> Tensor:
    """Per-sequence logprobs -> [n] in the micro-batch's token order (a filler sequence keeps its behaviour
    logprobs: its mask is 0)."""
    parts, start = [], 0
    for length, index in zip(mb.seq_lens.tolist(), mb.seq_index):
        parts.append(torch.from_numpy(rescored[index]) if index >= 0 else mb.behav_logp[start:start + length].cpu())
        start += length
    return torch.cat(parts).to(mb.behav_logp.device)
