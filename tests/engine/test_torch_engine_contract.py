"""Contract: TorchEngine satisfies the Engine Protocol (methods, signatures, return types)."""

from __future__ import annotations

import inspect

import pytest
from engine_helpers import drain, engine, request

from asyncrl.engine.torch.model.config import ArchConfig
from asyncrl.engine.protocol import Engine, EngineStats, GenerationOutput
from asyncrl.engine.torch.engine import TorchEngine


def _protocol_methods() -> list[str]:
    return [n for n, v in vars(Engine).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]


def test_signatures_match_the_protocol():
    for name in _protocol_methods():
        ours, theirs = getattr(TorchEngine, name), getattr(Engine, name)
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
            continue
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name


def test_instance_is_an_engine_and_runs_the_cycle(qwen2_path):
    eng = engine(qwen2_path)
    assert isinstance(eng, Engine)
    assert isinstance(eng.stats(), EngineStats) and isinstance(eng.weight_version, int)
    outs = drain(eng, {0: [request("c", [4, 5, 6], n=2, max_new_tokens=3)]})
    assert all(isinstance(o, GenerationOutput) for o in outs.values()) and len(outs) == 2
    assert eng.pause("continue") == [] and eng.pause("abort") == []
    eng.resume()
    eng.begin_weight_update()
    eng.load_weights([])
    eng.end_weight_update(1)
    eng.close()
    eng.close()  # idempotent
    assert not eng.has_work()
    with pytest.raises(RuntimeError, match="closed"):
        eng.add(request("late", [1, 2]))


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM.*Qwen2ForCausalLM"):
        ArchConfig.from_hf("GPT2LMHeadModel", object())


def test_unsupported_architecture_folder_is_rejected(tmp_path):
    import transformers

    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        TorchEngine(tmp_path)
