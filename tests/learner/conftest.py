import pytest
from learner_helpers import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Qwen2 (hidden 64, 2 layers, vocab 32, tied embeddings) saved with save_pretrained."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """A bf16 Trainer outside the launcher joins a one-rank process group of its own; later tests (e.g. the
    weight-group tests, which check that no default group exists) must not inherit it."""
    import torch.distributed as dist

    existed = dist.is_available() and dist.is_initialized()
    yield
    if not existed and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
