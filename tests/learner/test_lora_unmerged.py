"""Adapter pushes kept unmerged in the torch engine's matmuls (generator.lora_apply = "unmerged", adapter_slots.py):
the engine never rewrites a weight and keeps no pristine copy, computes the base until the first push, and scores
a trained learner's versions as the merging engine does (fp32: to rounding); a joiner's base push lands in the
weights; bad pushes are one-line errors; the settings it cannot serve are refused before anything starts."""

import numpy as np
import pytest
import torch
from learner_helpers import make_batch
from safetensors.torch import load_file
from test_lora_push import LORA, SPEC, params, same_bits, scores, update

from asyncrl.config.run import RunConfig
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.generator.config import GeneratorConfig
from asyncrl.learner import lora
from asyncrl.learner.config import DEFAULT_LORA_TARGETS, LearnerConfig
from asyncrl.learner.service import push_dtype
from asyncrl.learner.trainer import Trainer

UNMERGED = LoraSpec(SPEC.targets, SPEC.scale, LORA["lora_rank"], "unmerged")


def test_unmerged_engine_scores_each_version_as_the_merging_engine_and_never_rewrites_a_weight(tiny_model):
    trainer = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="float32")
    unmerged = TorchEngine(tiny_model, max_running=4, lora=UNMERGED, deterministic=True)
    merging = TorchEngine(tiny_model, max_running=4, lora=SPEC, deterministic=True)
    plain = TorchEngine(tiny_model, max_running=4, deterministic=True)
    disk = load_file(tiny_model / "model.safetensors")
    assert unmerged.adapters.pristine_bytes == 0 and merging.adapters.pristine_bytes > 0
    assert sorted(unmerged.adapters.slots) == sorted(merging.adapters.targets)
    for x, y in zip(scores(unmerged), scores(plain), strict=True):  # B starts at zero: the base, bit for bit
        assert np.array_equal(x, y)
    for version in range(1, 4):
        trainer.train_step(make_batch(seed=version, step=version))
        adapters = list(lora.adapter_push(trainer.masters))
        update(unmerged, adapters, version)
        update(merging, adapters, version)
        got = params(unmerged)
        for path in unmerged.adapters.slots:  # the targeted weights stay the disk's base
            assert same_bits(got[f"{path}.weight"], disk[f"{path}.weight"]), (version, path)
        for name in trainer.lora_trainable:  # trained norms are loaded as they are, as the merging engine does
            assert same_bits(got[name], dict(adapters)[name]), (version, name)
        shift = 0.0
        for x, y, z in zip(scores(unmerged), scores(merging), scores(plain), strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=2e-5)  # W x + s B (A x) against (W + s B A) x in fp32
            shift = max(shift, float(np.abs(y - z).max()))
        assert shift > 1e-3, shift  # the adapters moved the scores past that tolerance: the test is not a no-op


def test_a_joiners_base_lands_in_the_weights_and_the_adapters_add_to_it(tiny_model):
    engine = TorchEngine(tiny_model, max_running=4, lora=UNMERGED)
    reference = TorchEngine(tiny_model, max_running=4, lora=SPEC)
    path = "model.layers.0.self_attn.k_proj"  # a middle block of the fused q/k/v projection
    weight = engine.model.get_submodule(path).weight
    base = torch.randn_like(weight)
    a, b = torch.randn(4, base.shape[1]), torch.randn(base.shape[0], 4)
    for eng in (engine, reference):
        update(eng, [(f"{path}.weight", base), (f"{path}.lora_A", a), (f"{path}.lora_B", b)], 1)
    assert torch.equal(engine.model.get_submodule(path).weight, base)
    slot = engine.adapters.slots[path]
    assert torch.equal(slot.lora_A, a) and torch.equal(slot.lora_B, b)
    low = engine.model.model.layers[0].self_attn.qkv_lora
    assert low.b.count_nonzero() == b.count_nonzero()  # the q and v blocks and the off-diagonal stay zero
    for x, y in zip(scores(engine), scores(reference), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=2e-5)


def test_a_push_cast_to_the_engines_dtype_is_kept_bit_for_bit_as_the_fp32_push(tiny_model):
    """learner.service.push_dtype: an unmerged engine gets its adapters (and the trained norms) in its own dtype,
    half the bytes of fp32; it keeps exactly what it kept from the fp32 push and scores the same, bit for bit.
    A merging engine still gets fp32 (its merge must equal the learner's), full pushes the compute dtype."""
    trainer = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="float32")
    trainer.train_step(make_batch(seed=1, step=1))
    pushed = list(lora.adapter_push(trainer.masters))
    assert {t.dtype for _, t in pushed} == {torch.float32}
    dtype = push_dtype("adapter", "unmerged", torch.bfloat16)
    assert dtype == torch.bfloat16
    cast = [(name, t.to(dtype)) for name, t in pushed]
    engines = [TorchEngine(tiny_model, max_running=4, dtype="bfloat16", lora=UNMERGED, deterministic=True)
               for _ in range(2)]
    for engine, push in zip(engines, (pushed, cast), strict=True):
        update(engine, push, 1)
    got, want = params(engines[1]), params(engines[0])
    assert got.keys() == want.keys() and all(same_bits(got[k], want[k]) for k in want)
    for path, slot in engines[0].adapters.slots.items():
        other = engines[1].adapters.slots[path]
        assert same_bits(other.lora_A, slot.lora_A) and same_bits(other.lora_B, slot.lora_B)
    for x, y in zip(scores(engines[1]), scores(engines[0]), strict=True):
        assert np.array_equal(x, y)
    assert push_dtype("adapter", "merge", torch.bfloat16) is None
    assert push_dtype("full", "merge", torch.bfloat16) == push_dtype("merged", "merge", torch.bfloat16) == torch.bfloat16


def test_bad_unmerged_pushes_are_one_line_errors(tiny_model):
    engine = TorchEngine(tiny_model, max_running=4, lora=UNMERGED)
    path = "model.layers.1.mlp.up_proj"
    out, cols = engine.model.get_submodule(path).weight.shape
    engine.begin_weight_update()
    with pytest.raises(ValueError, match=rf"{path}.lora_A: rank 8, but this engine keeps its adapters unmerged at "
                                         r"rank 4 \(learner.lora_rank"):
        engine.load_weights([(f"{path}.lora_A", torch.zeros(8, cols))])
    with pytest.raises(ValueError, match=rf"{path}.lora_B: got .* want a float \[{out}, r\]"):
        engine.load_weights([(f"{path}.lora_B", torch.zeros(out + 1, 4))])
    with pytest.raises(ValueError, match="no LoRA target of this engine"):
        engine.load_weights([("lm_head.lora_A", torch.zeros(4, 64))])
    engine.load_weights([(f"{path}.lora_B", torch.zeros(out, 4))])
    with pytest.raises(ValueError, match=rf"{path}: lora_A and lora_B must arrive together \(got only lora_B\)"):
        engine.end_weight_update(1)
    with pytest.raises(ValueError, match=r"\"unmerged\" needs the rank"):
        LoraSpec(DEFAULT_LORA_TARGETS, 2.0, 0, "unmerged")
    with pytest.raises(ValueError, match=r"LoRA targets \['qkv_proj'\] name no linear layer"):
        TorchEngine(tiny_model, max_running=4, lora=LoraSpec(("q_proj", "qkv_proj"), 2.0, 4, "unmerged"))
    with pytest.raises(ValueError, match="generator.lora_apply=\"unmerged\" with generator.weights_dtype='fp8'"):
        TorchEngine(tiny_model, max_running=4, lora=UNMERGED, weights_dtype="fp8")


def test_only_some_targets_leave_the_others_blocks_zero(tiny_model):
    """q_proj and v_proj alone (k_proj not targeted): the fused q/k/v projection gets k's rows of zeros."""
    engine = TorchEngine(tiny_model, max_running=4, lora=LoraSpec(("q_proj", "v_proj"), 2.0, 4, "unmerged"))
    attn = engine.model.model.layers[0].self_attn
    assert sorted(p.rsplit(".", 1)[-1] for p in engine.adapters.slots) == ["q_proj"] * 2 + ["v_proj"] * 2
    assert attn.qkv_lora.a.shape == (8, attn.qkv[0].shape[1]) and attn.o_lora is None
    assert engine.model.model.layers[0].mlp.gate_up_lora is None


@pytest.mark.parametrize(("gen", "learner", "words"), [
    ({"engine": "sglang"}, {"lora_rank": 8}, "the setting is the torch engine's"),
    ({"weights_dtype": "fp8"}, {"lora_rank": 8}, "the fp8 projections take quantized inputs"),
    ({"deterministic": True}, {"lora_rank": 8, "off_policy": "decoupled"}, "the learner re-scores with merged"),
    ({}, {"lora_rank": 8, "lora_push": "merged"}, "merged pushes carry no adapters"),
])
def test_settings_the_unmerged_engine_cannot_serve_are_refused(gen, learner, words):
    with pytest.raises(ValueError, match=rf"generator.lora_apply=\"unmerged\" with (generator|learner)\.\w+.*{words}"):
        RunConfig(generator=GeneratorConfig(lora_apply="unmerged", **gen), learner=LearnerConfig(**learner))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_graph_replay_reads_each_pushed_version(tiny_model):
    """bf16, CUDA graphs captured before any push: the replayed decode steps see every version's adapters (the
    buffers are copied into, never replaced) and score as the eager engine does."""
    trainer = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="float32")
    graphs = TorchEngine(tiny_model, device="cuda", dtype="bfloat16", max_running=4, lora=UNMERGED)
    eager = TorchEngine(tiny_model, device="cuda", dtype="bfloat16", max_running=4, lora=UNMERGED, cuda_graphs=False)
    assert graphs.runner.graphs is not None
    before = scores(graphs)
    for version in (1, 2):
        trainer.train_step(make_batch(seed=version, step=version))
        adapters = list(lora.adapter_push(trainer.masters))
        for eng in (graphs, eager):
            update(eng, adapters, version)
        for x, y in zip(scores(graphs), scores(eager), strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-2)
    assert any(not np.allclose(x, y) for x, y in zip(before, scores(graphs), strict=True))
