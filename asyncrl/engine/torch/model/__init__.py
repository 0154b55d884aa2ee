"""Compact model code of the torch engine (Llama / Qwen2 / Qwen3 / Mistral families)."""

from asyncrl.engine.torch.model.config import SUPPORTED_ARCHITECTURES, ArchConfig
from asyncrl.engine.torch.model.decoder import CausalLM
from asyncrl.engine.torch.model.loader import adopt, build_from_hf, load_hf_folder, load_weights, parameter_index

__all__ = ["SUPPORTED_ARCHITECTURES", "ArchConfig", "CausalLM", "adopt", "build_from_hf", "load_hf_folder",
           "load_weights", "parameter_index"]
