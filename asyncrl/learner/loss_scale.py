"""Dynamic loss scaling for fp16 compute (`model.dtype = "float16"`).

fp16 has three more mantissa bits than bf16 (so engine and learner logprobs agree ~8x closer: docs/learner.md,
"Training in fp16") but a narrow exponent: activation gradients of a token-mean loss over thousands of tokens
fall below fp16's smallest normal number (6e-5) and lose their bits. The loss is therefore multiplied by a
scale S before backward, so every fp16 gradient is S times larger, and the fp32 master gradients are divided
by S again before the update. S adapts (the scheme of Micikevicius et al. 2018, "Mixed Precision Training"):

    overflow   some gradient is inf/NaN: the optimizer step is skipped (weights and AdamW moments untouched)
               and S halves
    growth     after `growth_interval` steps in a row without overflow, S doubles

Everything stays on the device (no host sync in the step): the overflow flag comes from the global gradient
norm the clip computes anyway, the fused AdamW reads it as its `found_inf` (a no-op update when set) and
divides by S through its `grad_scale`, and S is updated by `torch._amp_update_scale_`, the kernel behind
`torch.amp.GradScaler`. bf16 and fp32 need none of this: `LossScale(enabled=False)` multiplies by nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
MIN_SCALE = 1.0  # an overflow at S <= 1 is the true gradients' or the forward's (past fp16's 65504), not S's


class LossScale:
    def __init__(self, device: torch.device, *, enabled: bool, init: float = 2.0**16,
                 growth_interval: int = 200) -> None:
        """init, growth_interval: validated by LearnerConfig (loss_scale_init, loss_scale_growth_interval)."""
        self.enabled = enabled
        self.growth_interval = growth_interval
        self.scale = torch.full((), init if enabled else 1.0, dtype=torch.float32, device=device)  # S, 0-d
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)  # 1.0: this step overflowed
        self.skipped = torch.zeros((), dtype=torch.float32, device=device)  # overflowed steps since the start
        self._clean_steps = torch.zeros((), dtype=torch.int32, device=device)  # steps since the last overflow

    def scaled(self, loss: Tensor) -> Tensor:
        """The loss to call backward on."""
        return loss * self.scale if self.enabled else loss

    def unscale_norm(self, scaled_norm: Tensor) -> Tensor:
        """The global norm of the scaled gradients -> the true norm; records whether they overflowed."""
        if not self.enabled:
            return scaled_norm
        self.found_inf.copy_((~torch.isfinite(scaled_norm)).float())
        return scaled_norm / self.scale

    def update(self) -> None:
        """After the optimizer step: back off on overflow, grow after a clean window."""
        if not self.enabled:
            return
        self.skipped += self.found_inf
        torch._amp_update_scale_(self.scale, self._clean_steps, self.found_inf, GROWTH_FACTOR, BACKOFF_FACTOR,
                                 self.growth_interval)

    def check(self, scale: float) -> None:
        """After each step, with the scale read on the host: an overflow that backed S off to below 1 happened
        at S <= 1, where no scaling is to blame; fail clearly instead of halving S towards 0."""
        if self.enabled and scale < MIN_SCALE and self.found_inf.item():
            raise FloatingPointError(
                f"fp16 loss scale fell to {scale:g} (< {MIN_SCALE:g}) after {self.skipped.item():.0f} overflowed "
                "updates: this model's fp16 forward or backward leaves fp16's range (|x| > 65504) at any scale. "
                'Train it with model.dtype = "bfloat16" (bf16 has fp32\'s exponent range)')

    def state_dict(self) -> dict[str, float | int]:
        """Host values (a checkpoint's; reads the device)."""
        return {"scale": self.scale.item(), "clean_steps": int(self._clean_steps.item()), "skipped": self.skipped.item()}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        if not self.enabled or not state:
            return
        self.scale.fill_(float(state["scale"]))
        self._clean_steps.fill_(int(state["clean_steps"]))
        self.skipped.fill_(float(state["skipped"]))
