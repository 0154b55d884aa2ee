"""Per-step training statistics, accumulated on the device (no host sync inside the micro-batch loop) and
reduced over learner ranks once at the end of the step.

Sums are over trained response tokens (LossInputs.mask > 0: neither a multi-turn sample's environment
tokens nor a filler's) unless named otherwise; the loss terms are per mini-batch values
(each already carries its global normaliser). `behav_prox_logp_absdiff` is |proximal - behaviour| logprob,
the training-inference mismatch of the run: mean over tokens and p99 (each rank's p99, the largest over
ranks). The same mismatch as divergences of the behaviour policy from the proximal one, with r = pi_prox /
pi_behav per trained token and log r bounded to +-LOG_RATIO_BOUND: `behav_prox_kl_k1` = mean(-log r),
`behav_prox_kl_k3` = mean(r - 1 - log r) (both estimate KL(behav || prox) from the behaviour's samples),
`behav_prox_chi2` = mean(r^2) - 1, and the quantiles `behav_prox_ratio_p01/p50/p99` of r (each rank's:
p01 the smallest over ranks, p99 the largest, p50 the mean). `is_dropped_frac` is the masked fraction.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from asyncrl.learner import fsdp
from asyncrl.learner.batch_tensors import LossInputs
from asyncrl.learner.losses import LOG_RATIO_BOUND

_PER_TOKEN = {"entropy": "entropy", "clip_frac": "clip_frac", "kl": "kl", "value_clip_frac": "value_clip_frac",
              "is_weight": "is_weight_mean", "mm_k1": "behav_prox_kl_k1", "mm_k3": "behav_prox_kl_k3"}
_QUANTILES = (0.01, 0.5, 0.99)  # behav_prox_ratio_p01 / p50 / p99
_LOSSES = ("loss", "pg_loss", "kl_loss", "value_loss")


class StepStats:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, Tensor] = defaultdict(lambda: torch.zeros((), device=device))
        self.maxes: dict[str, Tensor] = defaultdict(lambda: torch.full((), -torch.inf, device=device))
        self.log_ratios: list[Tensor] = []  # [n_i] per micro-batch, NaN at untrained (environment, filler) tokens

    def add_terms(self, terms: dict[str, Tensor]) -> None:
        """Loss terms of one micro-batch (scalars with grad; detached here)."""
        for k, v in terms.items():
            self.sums[k] += v.detach()

    def add_tokens(self, x: LossInputs, entropy: Tensor, clipped: Tensor) -> None:
        """Token statistics of one micro-batch from its loss inputs: entropy [n], clipped [n] bool."""
        m = x.mask  # [n]
        s = self.sums
        s["n"] += m.sum()
        s["entropy"] += (entropy * m).sum()
        s["clip_frac"] += (clipped.float() * m).sum()
        s["adv"] += (x.advantages * m).sum()
        s["adv_sq"] += (x.advantages ** 2 * m).sum()
        s["is_weight"] += (x.is_weights * m).sum()
        s["is_dropped"] += (x.is_dropped.float() * m).sum()
        log_r = x.old_logp - x.behav_logp  # [n] log pi_prox / pi_behav
        s["behav_prox_absdiff"] += (log_r.abs() * m).sum()
        self.log_ratios.append(torch.where(m > 0, log_r, torch.nan))  # NaN when untrained: a boolean index would sync
        self._add_mismatch(log_r, m)
        self._max("adv_max", x.advantages, m)
        self._max("adv_neg_min", -x.advantages, m)
        self._max("is_weight_max", x.is_weights, m)

    def _add_mismatch(self, log_r: Tensor, m: Tensor) -> None:
        """Sums of the behaviour-vs-proximal divergence estimators over trained tokens.  [n], [n]"""
        d = log_r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [n]
        r = torch.exp(d)
        self.sums["mm_k1"] += (-d * m).sum()
        self.sums["mm_k3"] += ((r - 1.0 - d) * m).sum()
        self.sums["mm_r2"] += (r * r * m).sum()

    def add_masked_sum(self, key: str, values: Tensor, mask: Tensor) -> None:
        self.sums[key] += (values.float() * mask).sum()

    def _max(self, key: str, values: Tensor, mask: Tensor) -> None:
        masked = torch.where(mask > 0, values, torch.full_like(values, -torch.inf))
        self.maxes[key] = torch.maximum(self.maxes[key], masked.max() if masked.numel() else self.maxes[key])

    def reduce(self, mini_batches: int) -> dict[str, float]:
        """All-reduce over ranks (collective) -> metrics, identical on every rank."""
        self._quantiles()
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
                       behav_prox_logp_absdiff_p99=max(mx["absdiff_p99"], 0.0), trained_tokens=s["n"],
                       behav_prox_chi2=s["mm_r2"] / n - 1.0, **_ratio_quantiles(s, mx))
        return out

    def _quantiles(self) -> None:
        """This rank's p99 of |log r| and quantiles of r over its trained tokens, into the values to reduce (a
        rank without trained tokens adds none; every rank sets the same keys, for the collective)."""
        x = torch.cat(self.log_ratios) if self.log_ratios else torch.zeros(0, device=self.device)
        x = x.float()[: 1 << 24]  # [tokens], NaN where untrained; quantile's input limit is 2^24 elements
        if x.numel() == 0:
            x = torch.full((1,), torch.nan, device=self.device)
        self.maxes["absdiff_p99"] = torch.nan_to_num(torch.nanquantile(x.abs(), 0.99), nan=0.0)  # NaN: all filler
        q = torch.nanquantile(torch.exp(x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)),
                              torch.tensor(_QUANTILES, device=x.device))  # [3], NaN when no token trained
        has = ~torch.isnan(q[1])
        self.maxes["ratio_p01_neg"] = torch.where(has, -q[0], -torch.inf)
        self.maxes["ratio_p99"] = torch.where(has, q[2], -torch.inf)
        self.sums["ratio_p50"] += torch.where(has, q[1], 0.0)
        self.sums["ratio_ranks"] += has.float()

def _ratio_quantiles(s: dict[str, float], mx: dict[str, float]) -> dict[str, float]:
    """The reduced ratio quantiles (1.0, no mismatch measured, when no rank had a trained token)."""
    if not s.get("ratio_ranks"):
        return dict.fromkeys(("behav_prox_ratio_p01", "behav_prox_ratio_p50", "behav_prox_ratio_p99"), 1.0)
    return {"behav_prox_ratio_p01": -mx["ratio_p01_neg"], "behav_prox_ratio_p50": s["ratio_p50"] / s["ratio_ranks"],
            "behav_prox_ratio_p99": mx["ratio_p99"]}


def _reduced(values: dict[str, Tensor], op: str) -> dict[str, float]:
    keys = sorted(values)
    if not keys:
        return {}
    return dict(zip(keys, fsdp.all_reduce(torch.stack([values[k] for k in keys]), op).tolist()))
