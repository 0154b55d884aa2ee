"""The engine's Triton kernels, one module per part of the step they fuse:

* `ops`: what every kernel shares (`enabled`, `HAS_TRITON`, the PDL launch switch) and the decoder's fused
  element-wise kernels: residual add + RMSNorm, SiLU * up, rotary + KV store (prefill).
* `attention`: decode attention over the paged KV cache (one pass or split over the context), rotary and the
  step's own KV store inside.
* `sampler`: the fused sampler (temperature, inverse-CDF draw, full-vocabulary logprob) on bf16 logits.
* `staging`: the decode step's first kernel, which unpacks the staged host inputs on the device.
* `fp8`: FP8 rollouts' per-row input quantizers, alone or fused into the norm and SiLU kernels.

Each has a torch counterpart used on CPU and as the tests' reference (`paged_attention`, `sampler`,
`DecodeBuffers`); without Triton (CPU-only installs) only those run.
"""

from asyncrl.engine.torch.kernels import ops  # first: the others import it
from asyncrl.engine.torch.kernels import attention, sampler, staging

__all__ = ["attention", "ops", "sampler", "staging"]
