"""Adapter-only pushes (learner.lora_push = "adapter"): a trained learner's A/B applied by the torch engine from
its pristine base give, bit for bit, a fresh merge W0 + scale * B @ A and the weights (and logprobs) of a merged
full push, at every version (no drift); a joiner's full push (base + adapters) gives the same state. The
transport half (gloo, bytes on the wire, a generator rejoining mid-run) is tests/weights/test_adapter_push.py."""

import numpy as np
import pytest
import torch
from learner_helpers import VOCAB, make_batch
from safetensors.torch import load_file

from asyncrl.config.run import RunConfig
from asyncrl.engine.torch.adapter_merge import LoraSpec, merge
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.engine.torch.forced_group import ForcedGroup
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.generator.config import GeneratorConfig
from asyncrl.learner import lora
from asyncrl.learner.config import DEFAULT_LORA_TARGETS, LearnerConfig
from asyncrl.learner.trainer import Trainer
from asyncrl.records import SamplingParams

LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_lr": 1e-2, "micro_batch_tokens": 32}
SPEC = LoraSpec(DEFAULT_LORA_TARGETS, LORA["lora_alpha"] / LORA["lora_rank"])


def update(engine: TorchEngine, named, version: int) -> None:
    """One weight update as the receiver runs it (pause -> begin -> load -> end -> resume)."""
    engine.pause("continue")
    engine.begin_weight_update()
    engine.load_weights(list(named))
    engine.end_weight_update(version)
    engine.resume()


def params(engine: TorchEngine) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in engine.model.named_parameters()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def scores(engine: TorchEngine) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    groups = [ForcedGroup(prompt_token_ids=rng.integers(0, VOCAB, 6), sampling=SamplingParams(temperature=1.0),
                          response_token_ids=[rng.integers(0, VOCAB, 9) for _ in range(2)]) for _ in range(3)]
    return [lp for group in engine.score(groups) for lp in group]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adapter_pushes_equal_a_fresh_merge_and_the_merged_push_at_every_version(tiny_model, dtype):
    trainer = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype=dtype)
    adapter_engine = TorchEngine(tiny_model, dtype=dtype, max_running=4, lora=SPEC, deterministic=True)
    merged_engine = TorchEngine(tiny_model, dtype=dtype, max_running=4, deterministic=True)
    torch_dtype = getattr(torch, dtype)
    w0 = {k: t.to(torch_dtype) for k, t in load_file(tiny_model / "model.safetensors").items()}  # the disk base
    targets = sorted(adapter_engine.adapters.targets)
    assert len(targets) == 2 * 7  # 2 layers x q/k/v/o/gate/up/down
    for version in range(1, 6):
        trainer.train_step(make_batch(seed=version, step=version))
        adapters = dict(lora.adapter_push(trainer.masters))
        assert sorted(adapters) == sorted([f"{p}.{leaf}" for p in targets for leaf in ("lora_A", "lora_B")]
                                          + trainer.lora_trainable)  # + the trained norms (lora_trainable)
        assert "model.norm.weight" in adapters and not torch.all(adapters["model.norm.weight"] == 1.0)
        assert all(t.dtype == torch.float32 for t in adapters.values())
        update(adapter_engine, adapters.items(), version)
        update(merged_engine, trainer.named_full_tensors(), version)

        got, merged = params(adapter_engine), params(merged_engine)
        for path in targets:  # a fresh merge from the disk's base, computed here: no drift over the versions
            a, b = adapters[f"{path}.lora_A"], adapters[f"{path}.lora_B"]
            assert b.abs().sum() > 0  # trained: the test is not a no-op
            want = merge(w0[f"{path}.weight"], a, b, SPEC.scale).to(torch_dtype)
            assert same_bits(got[f"{path}.weight"], want), (version, path)
        for name in trainer.lora_trainable:  # a trained norm replaces the base tensor as it is: no merge, no drift
            assert same_bits(got[name], adapters[name].to(torch_dtype)), (version, name)
        assert got.keys() == merged.keys()
        assert all(same_bits(got[k], merged[k]) for k in got), [k for k in got if not same_bits(got[k], merged[k])]
        for x, y in zip(scores(adapter_engine), scores(merged_engine), strict=True):
            assert np.array_equal(x.view(np.uint32), y.view(np.uint32))  # logprobs bitwise too

    # A joiner: the full push (base + adapters) into a fresh engine, or the disk's base + the adapters only.
    for named in (lora.base_push(trainer.masters), lora.adapter_push(trainer.masters)):
        fresh = TorchEngine(tiny_model, dtype=dtype, max_running=4, lora=SPEC, deterministic=True)
        update(fresh, named, 5)
        assert all(same_bits(p, got[k]) for k, p in params(fresh).items())


def test_the_pristine_base_is_what_a_full_push_sends(tiny_model):
    """A base that differs from the disk's (e.g. another checkpoint) replaces W0; later adapter pushes merge onto it."""
    engine = TorchEngine(tiny_model, max_running=4, lora=SPEC)
    path = "model.layers.0.self_attn.q_proj"
    base = torch.randn_like(engine.adapters.targets[path].pristine)
    a, b = torch.randn(4, base.shape[1]), torch.randn(base.shape[0], 4)
    update(engine, [(f"{path}.weight", base)], 1)
    assert torch.equal(engine.model.get_submodule(path).weight, base)  # no adapters yet: W = W0
    update(engine, [(f"{path}.lora_A", a), (f"{path}.lora_B", b)], 2)
    assert torch.equal(engine.model.get_submodule(path).weight, merge(base, a, b, SPEC.scale))
    update(engine, [(f"{path}.lora_A", a), (f"{path}.lora_B", 2 * b)], 3)  # from W0 again, not from v2's W
    assert torch.equal(engine.model.get_submodule(path).weight, merge(base, a, 2 * b, SPEC.scale))
    assert engine.adapters.pristine_bytes == sum(
        m.weight.numel() * m.weight.element_size() for p, m in engine.model.named_modules()
        if p.rsplit(".", 1)[-1] in DEFAULT_LORA_TARGETS)


def test_bad_adapters_are_errors_naming_the_tensor(tiny_model):
    engine = TorchEngine(tiny_model, max_running=4, lora=SPEC)
    path = "model.layers.0.mlp.down_proj"
    out, cols = engine.model.get_submodule(path).weight.shape
    engine.begin_weight_update()
    with pytest.raises(ValueError, match=rf"{path}.lora_A: got .* want a float \[r, {cols}\]"):
        engine.load_weights([(f"{path}.lora_A", torch.zeros(4, cols + 1))])
    with pytest.raises(ValueError, match="no LoRA target of this engine"):
        engine.load_weights([("lm_head.lora_A", torch.zeros(4, 64))])
    with pytest.raises(ValueError, match=r"unknown parameter names \['model.final_norm.weight'\]"):
        engine.load_weights([("model.final_norm.weight", torch.ones(64))])  # a trained tensor the engine lacks
    engine.load_weights([(f"{path}.lora_A", torch.zeros(4, cols))])
    with pytest.raises(ValueError, match="lora_A and lora_B must arrive together"):
        engine.end_weight_update(1)
    # Held from an earlier version, a B does not make a later update's A alone whole: each update brings both.
    fresh = TorchEngine(tiny_model, max_running=4, lora=SPEC)
    update(fresh, [(f"{path}.lora_A", torch.zeros(4, cols)), (f"{path}.lora_B", torch.zeros(out, 4))], 1)
    fresh.begin_weight_update()
    fresh.load_weights([(f"{path}.lora_A", torch.ones(4, cols))])
    with pytest.raises(ValueError, match=rf"{path}: lora_A and lora_B must arrive together \(got only lora_A\)"):
        fresh.end_weight_update(2)
    with pytest.raises(ValueError, match=r"LoRA targets \['qkv_proj'\] name no linear layer"):
        TorchEngine(tiny_model, max_running=4, lora=LoraSpec(("q_proj", "qkv_proj"), 2.0))


def test_lora_push_resolves_from_the_engine():
    """The torch engine applies adapters itself; SGLang's answer depends on its server (tests/engine/test_sglang_lora.py:
    "adapter" with --enable-lora, "merged" without); with no server to ask, "auto" pushes merged weights and an
    explicit "adapter" is left for the engine to check when it starts."""
    lora_on = LearnerConfig(lora_rank=8)
    assert RunConfig().resolved_lora_push == "full"
    assert RunConfig(learner=lora_on).resolved_lora_push == "adapter"
    nowhere = GeneratorConfig(engine="sglang", sglang=SGLangConfig(base_url="http://127.0.0.1:9"))
    assert RunConfig(learner=lora_on, generator=nowhere).resolved_lora_push == "merged"
    assert RunConfig(learner=LearnerConfig(lora_rank=8, lora_push="merged")).resolved_lora_push == "merged"
    adapter = LearnerConfig(lora_rank=8, lora_push="adapter", lora_trainable=[])
    assert RunConfig(learner=adapter, generator=nowhere).resolved_lora_push == "adapter"
    # Trained norms (lora_trainable, ["norm"] by default): SGLang's LoRA serving cannot take them.
    with pytest.raises(ValueError, match=r"learner.lora_push='adapter' with SGLang needs learner.lora_trainable=\[\]"):
        RunConfig(learner=LearnerConfig(lora_rank=8, lora_push="adapter"), generator=nowhere).resolved_lora_push
    with pytest.raises(ValueError, match="learner.lora_push"):
        LearnerConfig(lora_push="delta")
