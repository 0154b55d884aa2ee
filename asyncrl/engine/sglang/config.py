"""Config of the SGLang engine adapter (read by `asyncrl.engine.sglang.engine`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(kw_only=True, slots=True)
class SGLangConfig:
    base_url: str = "http://127.0.0.1:30000"
    """The running SGLang HTTP server (`python -m sglang.launch_server ... --port 30000`)."""
    api_key: str = ""
    """Sent as `Authorization: Bearer <key>` when set (server `--api-key` / `--admin-api-key`)."""
    max_in_flight: int = 64
    """Concurrent /generate calls (each carries the n samples of one prompt); more are queued here."""
    request_timeout_s: float = 30.0
    """Limit for control calls (pause, continue, flush, begin/end, version, model_info)."""
    generate_timeout_s: float = 3600.0
    """Limit for one /generate call; a call blocks in the server while generation is paused."""
    weight_update_timeout_s: float = 600.0
    """Limit for init_weights_update_group and update_weights_from_distributed, which block until the
    learner has joined the rendezvous or finished broadcasting the bucket."""
    continue_mode: Literal["retract", "in_place"] = "retract"
    """SGLang pause mode used for `pause("continue")`. "retract" frees the KV of running requests, which
    re-prefill under the new weights, and lets the prefix cache be flushed. "in_place" keeps the running
    requests' old-weight KV and forbids flushing; requests sent after the update still never reuse old-weight
    KV, because each carries a radix-cache namespace (`extra_key`) renewed at every update (docs/sglang.md)."""
    flush_timeout_s: float = 60.0
    """How long /flush_cache is retried (it fails while requests are running) before giving up."""
    abort_drain_s: float = 5.0
    """After an abort, how long to wait for the aborted /generate calls to return their partial output."""
    startup_wait_s: float = 0.0
    """Retry /model_info this long at construction while the server starts (0: one try)."""
    lora_dir: str = ""
    """Adapter pushes (learner.lora_push = "adapter"): where each version's PEFT adapter folder is written for the
    server's /load_lora_adapter to read, so a folder the server can read (same host, or a shared file system);
    "": <system temp dir>/asyncrl-sglang-lora. A version's folder is deleted once its adapter is unloaded."""
    deterministic: bool = False
    """The server runs with --enable-deterministic-inference: send one `sampling_seed` per sample."""
    extra_sampling_params: dict[str, Any] = field(default_factory=dict)
    """Merged into every request's sampling_params (e.g. {"no_stop_trim": true}). SGLang >= 0.5.22
    rejects unknown keys with HTTP 400."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"sglang.base_url={self.base_url!r}: must start with http:// or https://")
        if self.max_in_flight < 1:
            raise ValueError(f"sglang.max_in_flight={self.max_in_flight}: must be >= 1")
        for name in ("request_timeout_s", "generate_timeout_s", "weight_update_timeout_s", "flush_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sglang.{name}={getattr(self, name)}: must be > 0 seconds")
        if self.abort_drain_s < 0 or self.startup_wait_s < 0:
            raise ValueError("sglang.abort_drain_s and sglang.startup_wait_s must be >= 0 seconds")
        if self.continue_mode not in ("retract", "in_place"):
            raise ValueError(f"sglang.continue_mode={self.continue_mode!r}: must be 'retract' or 'in_place'")
        reserved = {
            "temperature",
            "top_p",
            "top_k",
            "max_new_tokens",
            "stop_token_ids",
            "ignore_eos",
            "n",
            "sampling_seed",
        }
        clash = reserved & set(self.extra_sampling_params)
        if clash:
            raise ValueError(
                f"sglang.extra_sampling_params sets {sorted(clash)}: these come from each request's "
                "SamplingParams (or deterministic=true for sampling_seed); remove them here"
            )
