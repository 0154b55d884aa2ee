"""The compact model's view of a Hugging Face config: only what the forward pass needs.

`ArchConfig.from_hf` is the single place that decides whether an architecture is supported and
how its Hugging Face config maps onto the compact decoder (biases, q/k norm, tied head, head_dim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Architecture -> which optional pieces it uses. Biases that depend on the config are resolved in
# `from_hf` ("config" means: read `attention_bias` / `mlp_bias` from the config).
SUPPORTED_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"qkv_bias": True, "o_bias": False, "mlp_bias": False, "qk_norm": False},
    "Qwen3ForCausalLM": {"qkv_bias": "config", "o_bias": "config", "mlp_bias": False, "qk_norm": True},
    "LlamaForCausalLM": {"qkv_bias": "config", "o_bias": "config", "mlp_bias": "config", "qk_norm": False},
    "MistralForCausalLM": {"qkv_bias": False, "o_bias": False, "mlp_bias": False, "qk_norm": False},
}

# RoPE variants whose inverse frequencies do not depend on the sequence length.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(kw_only=True, slots=True, frozen=True)
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float
    eos_token_ids: tuple[int, ...]  # from config.json and generation_config.json, merged

    @classmethod
    def from_hf(cls, architecture: str, config: Any, generation_config: Any = None) -> ArchConfig:
        spec = _check_supported(architecture, config)
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(
            architecture=architecture,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=_flag(spec["qkv_bias"], config, "attention_bias"),
            o_bias=_flag(spec["o_bias"], config, "attention_bias"),
            mlp_bias=_flag(spec["mlp_bias"], config, "mlp_bias"),
            qk_norm=spec["qk_norm"],
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            rope_theta=_rope_theta(config),
            eos_token_ids=_eos_ids(config, generation_config),
        )


def _check_supported(architecture: str, config: Any) -> dict[str, Any]:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"the torch engine does not support architecture {architecture!r}; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))} (use the sglang engine for others)"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"{architecture}: hidden_act={config.hidden_act!r} is not supported (only 'silu')")
    layer_types = getattr(config, "layer_types", None) or []
    uses_window = getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types)
    if architecture == "MistralForCausalLM":
        uses_window = getattr(config, "sliding_window", None) is not None
    if uses_window:
        raise ValueError(f"{architecture}: sliding-window attention is not supported by the torch engine")
    kind = rope_type(config)
    if kind not in STATIC_ROPE_TYPES:
        raise ValueError(f"{architecture}: rope_type={kind!r} is not supported; supported: {STATIC_ROPE_TYPES}")
    return SUPPORTED_ARCHITECTURES[architecture]


def rope_type(config: Any) -> str:
    """The RoPE kind of a Hugging Face config ("default" when it names none)."""
    return str(_rope_params(config).get("rope_type", "default"))


def _flag(value: bool | str, config: Any, name: str) -> bool:
    return bool(getattr(config, name, False)) if value == "config" else bool(value)


def _rope_params(config: Any) -> dict[str, Any]:
    # transformers 5 keeps RoPE settings in `rope_parameters`; older configs used `rope_scaling`.
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def _rope_theta(config: Any) -> float:
    theta = _rope_params(config).get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    return float(theta)


def _eos_ids(config: Any, generation_config: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (config, generation_config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if int(token) not in ids:
                ids.append(int(token))
    return tuple(ids)
