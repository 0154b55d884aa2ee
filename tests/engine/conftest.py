"""Tiny random Qwen2 / Llama / Qwen3 folders (fp32, saved with save_pretrained) shared by the engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 256,
    "eos_token_id": 1, "bos_token_id": 0, "pad_token_id": 0,
    "initializer_range": 0.1,  # logits of a few units: greedy ties unlikely, fp32 parity well inside 1e-5
}


def make_tiny(folder: Path, arch: str, seed: int = 0) -> Path:
    import transformers

    torch.manual_seed(seed)
    if arch == "qwen2":
        config = transformers.Qwen2Config(**TINY, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=False)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False, attention_bias=False)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # biases and norms start at 0 / 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_factory():
    """make_tiny, for a test that needs its own variant of a tiny model."""
    return make_tiny


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny(root / arch, arch) for arch in ("qwen2", "llama", "qwen3")}


@pytest.fixture(scope="session")
def qwen2_path(tiny_models) -> Path:
    return tiny_models["qwen2"]


@pytest.fixture(scope="session")
def llama_path(tiny_models) -> Path:
    return tiny_models["llama"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread; on a loaded 2-core machine intra-op threads spin and
    make each step ~100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def triton_device(request) -> str:
    """Where a Triton kernel test runs: "cpu" in the Triton interpreter (TRITON_INTERPRET=1 set for the whole run,
    else skipped), "cuda" compiled. Without Triton both skip."""
    from asyncrl.engine.torch import kernels

    if not kernels.ops.HAS_TRITON:
        pytest.skip("needs Triton")
    if request.param == "cpu" and not kernels.ops._INTERPRET:
        pytest.skip("the kernel runs on CPU only with TRITON_INTERPRET=1 set for the whole run")
    if request.param == "cpu":
        import numpy as np
        import triton

        def version(text: str) -> tuple[int, int]:
            return tuple(int(part) for part in text.split(".")[:2])

        if version(triton.__version__) < (3, 7) and version(np.__version__) >= (2, 4):
            pytest.skip(f"Triton {triton.__version__}'s interpreter needs numpy < 2.4 (int() of 1-element arrays)")
    return request.param
