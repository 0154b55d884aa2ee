"""A bucket layout's copies worked out once and replayed (load_plan.py): a replayed bucket leaves the engine bit for
bit where the general path (load_weights of the unflattened views) leaves it, for adapters kept unmerged (their
strided B slots included), trained norms and whole-weight pushes; a layout that fails fails every time with the
general path's message and is never planned; a changed shape is not replayed; the end-of-update check still sees
which adapters a replayed bucket brought; a merging engine takes the general path."""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.learner.config import DEFAULT_LORA_TARGETS
from asyncrl.weights.bucket import iter_buckets
from bench.adapter_push_host import push  # one update as WeightReceiver runs it, by either path

RANK = 4
UNMERGED = LoraSpec(tuple(DEFAULT_LORA_TARGETS), 2.0, RANK, "unmerged")
MERGE = LoraSpec(tuple(DEFAULT_LORA_TARGETS), 2.0, RANK, "merge")


def adapter_push(engine: TorchEngine, seed: int, norms: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Every target's A [r, in] and B [out, r] (and every norm), random, fp32 as a learner holds them."""
    gen = torch.Generator().manual_seed(seed)
    named = []
    for path in sorted(engine.adapters.slots if hasattr(engine.adapters, "slots") else engine.adapters.targets):
        out, cols = engine.model.get_submodule(path).weight.shape
        named.append((f"{path}.lora_A", torch.randn(RANK, cols, generator=gen)))
        named.append((f"{path}.lora_B", torch.randn(out, RANK, generator=gen)))
    for name, p in engine.model.named_parameters():
        if norms and "norm" in name:
            named.append((name, torch.randn(p.shape, generator=gen)))
    return named


def whole_push(engine: TorchEngine, seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(name, torch.randn(p.shape, generator=gen) * 0.05) for name, p in engine.model.named_parameters()]


def state(engine: TorchEngine) -> dict[str, torch.Tensor]:
    """Every parameter and every adapter buffer, cloned."""
    out = {k: p.detach().clone() for k, p in engine.model.named_parameters()}
    if engine.adapters is not None and hasattr(engine.adapters, "slots"):
        for path, slot in engine.adapters.slots.items():
            out[f"{path}.A"], out[f"{path}.B"] = slot.lora_A.clone(), slot.lora_B.clone()
    return out


def assert_same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)), k


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                      reason="needs CUDA")])


@pytest.mark.parametrize("device", ["cpu", CUDA])  # on CUDA: the multi-tensor copy's fast path and strided kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bucket_bytes", [6_000, 1 << 20])  # a layer in several buckets; every layer in one
def test_replayed_adapter_buckets_land_as_the_general_path_lands_them(qwen2_path, dtype, bucket_bytes, device):
    planned, general = (TorchEngine(qwen2_path, device=device, max_running=4, lora=UNMERGED, dtype="bfloat16",
                                    cuda_graphs=False) for _ in range(2))
    for version in range(1, 4):
        named = adapter_push(planned, seed=version)
        buckets = list(iter_buckets(named, bucket_bytes, device, dtype))
        assert len(buckets) > 2 or bucket_bytes > 6_000
        push(planned, buckets, version, by_bucket=True)
        push(general, buckets, version, by_bucket=False)
        assert_same_bits(state(planned), state(general))
    # the first push planned every layout; the next two replayed every bucket
    assert planned.weights.plans.hits == 2 * len(buckets)
    runs = [r for p in planned.weights.plans.plans.values() for r in p.strided]
    assert runs  # the B slots of fused q/k/v and gate/up went the strided way, and landed (above)
    if len(buckets) == 1:  # both layers' q, k, v, gate and up B slots: one copy each for the two layers
        assert sorted(r.count for r in runs) == [2] * 5
    changed = state(planned)
    assert any(not torch.equal(changed[f"{p}.B"], torch.zeros_like(changed[f"{p}.B"])) for p in planned.adapters.slots)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_replayed_whole_weight_pushes_land_as_the_general_path_lands_them(qwen2_path, device):
    planned, general = (TorchEngine(qwen2_path, device=device, max_running=4, cuda_graphs=False) for _ in range(2))
    for version in range(1, 3):
        buckets = list(iter_buckets(whole_push(planned, seed=version), 20_000, device))
        push(planned, buckets, version, by_bucket=True)
        push(general, buckets, version, by_bucket=False)
        assert_same_bits(state(planned), state(general))
    assert planned.weights.plans.hits == len(buckets)


def test_a_failing_layout_fails_every_time_and_is_never_planned(qwen2_path):
    engine = TorchEngine(qwen2_path, max_running=4, lora=UNMERGED)
    bad = [("model.layers.0.self_attn.q_proj.lora_A", torch.randn(RANK, 64)), ("model.nope.weight", torch.randn(3))]
    (flat, layout), = iter_buckets(bad, 1 << 20, "cpu")
    for _ in range(2):
        engine.begin_weight_update()
        with pytest.raises(ValueError, match="unknown parameter names.*model.nope.weight"):
            engine.load_bucket(flat, layout)
    assert engine.weights.plans.plans == {} and engine.weights.plans.hits == 0


def test_a_changed_shape_is_not_replayed_but_refused_by_the_general_path(qwen2_path):
    engine = TorchEngine(qwen2_path, max_running=4, lora=UNMERGED)
    path = "model.layers.0.self_attn.o_proj"
    good = [(f"{path}.lora_A", torch.randn(RANK, 64)), (f"{path}.lora_B", torch.randn(64, RANK))]
    push(engine, list(iter_buckets(good, 1 << 20, "cpu")), 1, by_bucket=True)
    # the same names and bytes as the planned layout, another shape: A [8, 32] where [4, 64] was
    wrong = [(f"{path}.lora_A", torch.randn(2 * RANK, 32)), (f"{path}.lora_B", torch.randn(64, RANK))]
    buckets = list(iter_buckets(wrong, 1 << 20, "cpu"))
    engine.begin_weight_update()
    with pytest.raises(ValueError, match=r"lora_A: got torch.float32 \(8, 32\), want a float \[r, 64\]"):
        for flat, layout in buckets:
            engine.load_bucket(flat, layout)
    assert engine.weights.plans.hits == 0


def test_the_end_of_update_check_sees_what_a_replayed_bucket_brought(qwen2_path):
    engine = TorchEngine(qwen2_path, max_running=4, lora=UNMERGED)
    path = "model.layers.1.mlp.up_proj"
    only_a = [(f"{path}.lora_A", torch.randn(RANK, 64))]
    buckets = list(iter_buckets(only_a, 1 << 20, "cpu"))
    for _ in range(2):  # planned on the first, replayed on the second: both end with the same one-line error
        engine.begin_weight_update()
        for flat, layout in buckets:
            engine.load_bucket(flat, layout)
        with pytest.raises(ValueError, match=f"{path}: lora_A and lora_B must arrive together"):
            engine.end_weight_update(1)
    assert engine.weights.plans.hits == 1


def test_a_merging_engine_takes_the_general_path(qwen2_path):
    engine = TorchEngine(qwen2_path, max_running=4, lora=MERGE)
    general = TorchEngine(qwen2_path, max_running=4, lora=MERGE)
    assert engine.weights.plans is None
    for version in (1, 2):
        named = adapter_push(engine, seed=version, norms=False)
        buckets = list(iter_buckets(named, 6_000, "cpu"))
        push(engine, buckets, version, by_bucket=True)
        push(general, buckets, version, by_bucket=False)
    assert_same_bits(state(engine), state(general))
