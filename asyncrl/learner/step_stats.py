"""Per-step training statistics, accumulated on the device (no host sync inside the micro-batch loop) and
reduced over learner ranks once at the end of the step.

Sums are over trained response tokens (MicroBatch.mask > 0: neither a multi-turn sample's environment
tokens nor a filler's) unless named otherwise; the loss terms are per mini-batch values
(each already carries its global normaliser). `behav_prox_logp_absdiff` is |proximal - behaviour| logprob,
the training-inference mismatch of the run: mean over tokens and p99 (each rank's p99, the largest over
ranks).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from asyncrl.learner import fsdp
from asyncrl.learner.batch_tensors import MicroBatch

_PER_TOKEN = {"entropy": "entropy", "clip_frac": "clip_frac", "kl": "kl", "value_clip_frac": "value_clip_frac",
              "is_weight": "is_weight_mean"}
_LOSSES = ("loss", "pg_loss", "kl_loss", "value_loss")


class StepStats:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, Tensor] = defaultdict(lambda: torch.zeros((), device=device))
        self.maxes: dict[str, Tensor] = defaultdict(lambda: torch.full((), -torch.inf, device=device))
        self.absdiff: list[Tensor] = []  # [n_i] per micro-batch, NaN at untrained (environment, filler) tokens

    def add_terms(self, terms: dict[str, Tensor]) -> None:
        """Loss terms of one micro-batch (scalars with grad; detached here)."""
        for k, v in terms.items():
            self.sums[k] += v.detach()

    def add_tokens(self, mb: MicroBatch, entropy: Tensor, clipped: Tensor) -> None:
        """Token statistics of one micro-batch: entropy [n], clipped [n] bool."""
        m = mb.mask  # [n]
        s = self.sums
        s["n"] += m.sum()
        s["entropy"] += (entropy * m).sum()
        s["clip_frac"] += (clipped.float() * m).sum()
        s["adv"] += (mb.advantages * m).sum()
        s["adv_sq"] += (mb.advantages ** 2 * m).sum()
        s["is_weight"] += (mb.is_weights * m).sum()
        s["is_dropped"] += (mb.is_dropped.float() * m).sum()
        diff = (mb.old_logp - mb.behav_logp).abs()  # [n]
        s["behav_prox_absdiff"] += (diff * m).sum()
        self.absdiff.append(torch.where(m > 0, diff, torch.nan))  # NaN when untrained: a boolean index would sync
        self._max("adv_max", mb.advantages, m)
        self._max("adv_neg_min", -mb.advantages, m)
        self._max("is_weight_max", mb.is_weights, m)

    def add_masked_sum(self, key: str, values: Tensor, mask: Tensor) -> None:
        self.sums[key] += (values.float() * mask).sum()

    def _max(self, key: str, values: Tensor, mask: Tensor) -> None:
        masked = torch.where(mask > 0, values, torch.full_like(values, -torch.inf))
        self.maxes[key] = torch.maximum(self.maxes[key], masked.max() if masked.numel() else self.maxes[key])

    def reduce(self, mini_batches: int) -> dict[str, float]:
        """All-reduce over ranks (collective) -> metrics, identical on every rank."""
        self.maxes["absdiff_p99"] = self._p99()
        s = _reduced(self.sums, "sum")
        mx = _reduced(self.maxes, "max")
        out: dict[str, float] = {}
        for k in _LOSSES:
            if k in s:
                out[k] = s[k] / max(mini_batches, 1)
        n = max(s.get("n", 0.0), 1.0)
        for k, name in _PER_TOKEN.items():
            if k in s:
                out[name] = s[k] / n
        if "n" in s:
            mean = s["adv"] / n
            out.update(adv_mean=mean, adv_std=max(s["adv_sq"] / n - mean * mean, 0.0) ** 0.5,
                       adv_max=mx["adv_max"], adv_min=-mx["adv_neg_min"], is_weight_max=mx["is_weight_max"],
                       is_dropped_frac=s["is_dropped"] / n, behav_prox_logp_absdiff=s["behav_prox_absdiff"] / n,
                       behav_prox_logp_absdiff_p99=max(mx["absdiff_p99"], 0.0), trained_tokens=s["n"])
        return out

    def _p99(self) -> Tensor:
        diffs = torch.cat(self.absdiff) if self.absdiff else torch.zeros(0, device=self.device)
        if diffs.numel() == 0:
            return torch.zeros((), device=self.device)
        p99 = torch.nanquantile(diffs.float()[: 1 << 24], 0.99)  # quantile's input limit is 2^24 elements
        return torch.nan_to_num(p99, nan=0.0)  # every token filler


def _reduced(values: dict[str, Tensor], op: str) -> dict[str, float]:
    keys = sorted(values)
    if not keys:
        return {}
    return dict(zip(keys, fsdp.all_reduce(torch.stack([values[k] for k in keys]), op).tolist()))
