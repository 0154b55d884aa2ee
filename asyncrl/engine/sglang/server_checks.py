"""What the SGLang adapter checks of the server it is pointed at, before the first request: that the server
computes what the learner assumes. `/server_info` lists every server argument; an argument a server version lacks
reads as its default. Each check raises one ValueError that names our key and the server flag that must agree."""

from __future__ import annotations

from typing import Any


def check_logits(info: dict[str, Any], logits_fp32: bool, base_url: str) -> None:
    """The server rounds its logits as the learner does: --enable-fp32-lm-head <=> model.logits_fp32."""
    served = bool(info.get("enable_fp32_lm_head", False))
    if served != logits_fp32:
        fix = "restart the server with --enable-fp32-lm-head" if logits_fp32 else "restart it without the flag"
        raise ValueError(
            f"model.logits_fp32={str(logits_fp32).lower()} but the SGLang server at {base_url} runs "
            f"{'with' if served else 'without'} --enable-fp32-lm-head: the learner's logprobs would be computed "
            f"from other logits than the samples'; {fix} or set model.logits_fp32 = {str(served).lower()}")


def check_weights_dtype(info: dict[str, Any], weights_dtype: str, base_url: str) -> None:
    """FP8 rollouts on SGLang are the server's own: generator.weights_dtype = "fp8" <=> --quantization fp8 (the
    server quantizes what it loads, pushed weights included). Any other server quantization is refused: the
    learner's correction defaults are chosen for bf16 or fp8 rollouts only."""
    served = info.get("quantization") or None
    want = "fp8" if weights_dtype == "fp8" else None
    if served != want:
        now = f"--quantization {served}" if served else "no --quantization"
        fix = "restart the server with --quantization fp8" if want else "restart it without --quantization"
        other = "\"fp8\"" if served == "fp8" else "\"model\""
        raise ValueError(
            f"generator.weights_dtype={weights_dtype!r} but the SGLang server at {base_url} runs with {now}: the "
            f"samples' precision would not be the one the learner corrects for; {fix}"
            + (f" or set generator.weights_dtype = {other}" if served in (None, "fp8") else ""))
