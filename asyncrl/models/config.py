"""Which model every component loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    path: str = "embedded"
    """A Hugging Face causal-LM folder, a .gguf file (or a folder holding exactly one and no config.json),
    or "embedded" for the tiny built-in model (built on first use). A GGUF is dequantized once into an fp32
    Hugging Face folder beside it, X.gguf -> X.hf, reused while the file is unchanged (docs/models.md)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of the engine and the learner (the learner's master weights stay fp32): "auto" is bfloat16
    on GPU, float32 on CPU. "float16" makes engine and learner logprobs agree ~8x closer at the same speed, with
    dynamic loss scaling in the learner (docs/learner.md, "Training in fp16")."""
    residual_fp32: bool = False
    """Keep the residual stream (what each layer adds into and the norms read) in fp32 in both the torch engine
    and the learner, instead of rounding it to the compute dtype after every add: less rounding noise on each
    side, so closer engine and learner logprobs (docs/learner.md). No effect in float32. The torch engine
    only: an SGLang server rounds its stream, so the learner must too."""

    logits_fp32: bool = False
    """Keep the lm_head's output (the logits) in fp32 in the engine and the learner instead of rounding it to the
    compute dtype: a trained model's logits reach 20-40, where one bf16 step is 0.125-0.25, so the two sides'
    logprobs can differ by a step when their hidden states differ by a hair. Measured, a small part of the gap
    (~7 %, at ~1 % engine and learner time; docs/learner.md). With SGLang, the server must run with
    --enable-fp32-lm-head (checked at startup). No effect in float32."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError('model.path is empty: give a Hugging Face folder, a .gguf file or "embedded"')


def resolve_model_path(cfg: ModelConfig) -> str:
    """The folder every component loads: "embedded" is built on first use, a GGUF converted on first use
    (the launcher's preflight does it before any process starts, so its children find the cache)."""
    if cfg.path == "embedded":
        from asyncrl.task.embedded import embedded_model_path

        return str(embedded_model_path())
    from asyncrl.models.gguf import converted, find_gguf

    gguf = find_gguf(cfg.path)
    return str(converted(gguf)) if gguf is not None else cfg.path
