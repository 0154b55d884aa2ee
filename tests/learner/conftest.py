import pytest
from learner_helpers import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Qwen2 (hidden 64, 2 layers, vocab 32, tied embeddings) saved with save_pretrained."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
