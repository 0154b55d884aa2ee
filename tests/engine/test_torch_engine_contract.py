"""Contract: every engine (TorchEngine; SGLangEngine over the SGLang test double) satisfies the Engine
Protocol (methods, signatures, return types, the generate / pause / update / close cycle)."""

from __future__ import annotations

import inspect

import pytest
from engine_helpers import drain, engine, request

from asyncrl.engine.torch.model.config import ArchConfig
from asyncrl.engine.protocol import Engine, EngineStats, GenerationOutput
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.engine.torch.engine import TorchEngine
from tests.doubles.sglang_double import SGLangDouble

ENGINES = {"torch": TorchEngine, "sglang": SGLangEngine}


def _protocol_methods() -> list[str]:
    return [n for n, v in vars(Engine).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]


@pytest.fixture(params=sorted(ENGINES))
def backend(request, qwen2_path):
    """(engine, load): `load` runs one (empty) weight load the way that backend receives weights."""
    if request.param == "torch":
        eng = engine(qwen2_path)
        yield eng, lambda: eng.load_weights([])
        return
    with SGLangDouble(vocab_size=97) as double:
        eng = SGLangEngine(SGLangConfig(base_url=double.url, request_timeout_s=10.0, generate_timeout_s=20.0))
        yield eng, lambda: None  # SGLang's own ranks receive (test_sglang_weights.py); load_weights refuses
        eng.close()


@pytest.mark.parametrize("cls", [TorchEngine, SGLangEngine], ids=["torch", "sglang"])
def test_signatures_match_the_protocol(cls):
    for name in _protocol_methods():
        ours, theirs = getattr(cls, name), getattr(Engine, name)
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
            continue
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name


def test_instance_is_an_engine_and_runs_the_cycle(backend):
    eng, load = backend
    assert isinstance(eng, Engine)
    assert isinstance(eng.stats(), EngineStats) and isinstance(eng.weight_version, int)
    outs = drain(eng, {0: [request("c", [4, 5, 6], n=2, max_new_tokens=3)]})
    assert all(isinstance(o, GenerationOutput) for o in outs.values()) and len(outs) == 2
    assert eng.pause("continue") == [] and eng.pause("abort") == []
    eng.resume()
    eng.begin_weight_update()
    load()
    eng.end_weight_update(1)
    assert eng.weight_version == 1
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
