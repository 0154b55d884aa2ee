"""LoRA with kl_coef > 0: the reference is the policy itself with its adapters off and the trained norms pristine
(asyncrl/learner/lora_reference.py), never a second model. Its logprobs are the plain model's after training has
moved the adapters and the norms; the training state comes back bit for bit (fp32 masters, one rank's bf16 compute
copy, kept or resharded); a run trains and resumes exactly."""

import math

import pytest
import torch
import torch.distributed as dist
from learner_helpers import make_batch
from torch import Tensor, nn

from asyncrl.learner import fsdp, lora
from asyncrl.learner.batch_tensors import MicroBatch, to_device
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.prepare import prepare_batch
from asyncrl.learner.trainer import Trainer

LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_lr": 1e-2, "micro_batch_tokens": 32}
KL = {**LORA, "kl_coef": 0.1}


def trainer(model_path, dtype: str = "float32", **cfg) -> Trainer:
    return Trainer(LearnerConfig(**cfg), str(model_path), device="cpu", dtype=dtype)


def train(t: Trainer, steps: range) -> list[dict[str, float]]:
    return [t.train_step(make_batch(seed=s, step=s)) for s in steps]


def micro_batches(t: Trainer, seed: int = 9) -> list[MicroBatch]:
    prep = prepare_batch(make_batch(seed=seed), t.cfg, 0, 1, t.version)
    to_device(prep.micro_batches(), t.dist.device)
    return prep.micro_batches()


@torch.no_grad()
def logprobs(t: Trainer, mb: MicroBatch) -> Tensor:
    """The trainer's policy logprobs [n] in eval mode (its mode is left as eval)."""
    t.policy.eval()
    return t._forward(t.policy, mb)[0]


def record_old_passes(monkeypatch) -> list[tuple[list[MicroBatch], list[Tensor], list[Tensor | None]]]:
    """Every old pass's (micro-batches, reference logprobs [n], proximal logprobs [n] or None per micro-batch)."""
    seen = []
    old_pass = Trainer._old_pass

    def spy(self, prep, batch, source):
        olds = old_pass(self, prep, batch, source)
        seen.append((prep.micro_batches(), [o.ref_logp for o in olds], [o.prox_logp for o in olds]))
        return olds

    monkeypatch.setattr(Trainer, "_old_pass", spy)
    return seen


def test_reference_logprobs_are_the_plain_models_after_training(tiny_model, monkeypatch):
    seen = record_old_passes(monkeypatch)
    t = trainer(tiny_model, **KL)
    train(t, range(1, 4))
    plain = trainer(tiny_model, micro_batch_tokens=32)  # the model path as it is, no LoRA: what the reference was
    fresh = trainer(tiny_model, **LORA)  # B = 0, norms from the model path: the plain model in the same kernels
    trained = dict(t.policy.hf.named_parameters())
    pristine = dict(plain.policy.hf.named_parameters())
    for name in t.lora_trainable:  # the old pass of step 3 ran on trained norms...
        assert not torch.equal(trained[name], pristine[name]), name
    assert all(torch.any(m.lora_B != 0) for m in t.lora.values())  # ...and trained adapters
    mbs, refs, _ = seen[-1]
    for mb, ref in zip(mbs, refs, strict=True):
        assert torch.equal(ref, logprobs(fresh, mb))
        torch.testing.assert_close(ref, logprobs(plain, mb), atol=1e-5, rtol=0)  # plain: one q/k/v GEMM
        assert (ref - logprobs(t, mb)).abs().max() > 1e-3  # the policy itself moved away
        with lora.adapters_off(t.lora.values()):  # adapters off alone is not the reference: the norms trained
            assert (ref - logprobs(t, mb)).abs().max() > 1e-4


def state(t: Trainer) -> dict[str, Tensor]:
    """Clones of every fp32 master (local shard) and of every tensor the module's forward reads now (one rank's
    compute copy, or the master itself)."""
    held = {f"master {k}": fsdp.local_tensor(p.detach()).clone() for k, p in t.masters}
    live = {f"live {k}": fsdp.local_tensor(p.detach()).clone() for k, p in t.policy.hf.named_parameters()}
    return {**held, **live}


def resharded(t: Trainer) -> bool:
    """FSDP2's sharded DTensors in the modules (one rank leaves the frozen base out of FSDP: plain tensors)."""
    return all(hasattr(p, "device_mesh") for p in t.policy.parameters() if p.requires_grad)


@pytest.mark.parametrize(("dtype", "reshard"), [("float32", False), ("bfloat16", False), ("bfloat16", True)],
                         ids=["fp32-masters", "bf16-kept-compute-copy", "bf16-resharded"])
def test_reference_mode_restores_the_training_state(tiny_model, dtype, reshard):
    """fp32: no process group, the parameters are the masters. bf16: one FSDP2 rank, forwards read the unsharded
    bf16 copy kept from the first forward on (fsdp.ComputeCopy); after a state-dict call it is freed (resharded)
    and the next forward makes it afresh from the masters."""
    t = trainer(tiny_model, dtype, **KL)
    fresh = trainer(tiny_model, dtype, **LORA)
    train(t, range(1, 3))
    mb = micro_batches(t)[0]
    before_logp = logprobs(t, mb)
    t.policy.train()
    if reshard:
        t.policy.reshard()
    assert resharded(t) == reshard
    before = state(t)

    with t.lora_ref.mode():
        assert not t.policy.training and not torch.is_grad_enabled()
        assert not any(m.adapter_on for m in t.lora.values())
        ref = t._forward(t.policy, mb)[0]
    assert torch.equal(ref, logprobs(fresh, mb))  # the pristine norms reached the forward, in the dtype it reads
    with pytest.raises(RuntimeError, match="inside"), t.lora_ref.mode():
        t._forward(t.policy, mb)
        raise RuntimeError("inside the reference pass")

    assert t.policy.training and all(m.adapter_on for m in t.lora.values())
    assert resharded(t) == reshard  # the state it was in
    after = state(t)
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert v.dtype == after[k].dtype and torch.equal(v, after[k]), k
    assert torch.equal(logprobs(t, mb), before_logp)
    if dist.is_initialized():
        dist.destroy_process_group()


def reachable_bytes(root: object) -> int:
    """Bytes of every tensor storage reachable from `root` through asyncrl objects, containers and modules."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, Tensor):
            s = fsdp.local_tensor(o).untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        elif isinstance(o, nn.Module):
            stack.extend([*o.parameters(), *o.buffers()])
        elif isinstance(o, dict):
            stack.extend([*o.keys(), *o.values()])
        elif isinstance(o, list | tuple | set):
            stack.extend(o)
        elif type(o).__module__.startswith("asyncrl") and hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
    return sum(storages.values())


def test_no_second_model_is_held(tiny_model):
    t = trainer(tiny_model, **KL)
    assert t.ref is None and [v for v in vars(t).values() if isinstance(v, nn.Module)] == [t.policy]
    norms = sum(p.numel() for k, p in t.masters if k in t.lora_trainable)
    assert t.lora_ref.pristine_bytes() == 4 * norms == 4 * 5 * 64  # fp32 copies of the 5 norms' gains, nothing else
    base = sum(p.numel() * p.element_size() for k, p in t.masters if not lora.is_adapter(k))
    without_kl = reachable_bytes(trainer(tiny_model, **LORA))
    assert reachable_bytes(t) - without_kl == t.lora_ref.pristine_bytes()
    full = {kl: reachable_bytes(trainer(tiny_model, micro_batch_tokens=32, kl_coef=kl)) for kl in (0.0, 0.1)}
    assert full[0.1] - full[0.0] >= base  # what it costs without LoRA: a second model


@pytest.mark.parametrize("kw", [{"algorithm": "grpo"}, {"algorithm": "reinforce_pp", "kl_in_reward": True}],
                         ids=["grpo-kl-loss", "reinforce_pp-kl-in-reward"])
def test_kl_with_lora_trains_and_resumes_exactly(tiny_model, tmp_path, kw):
    cfg = {**KL, **kw, "warmup_steps": 1, "lr_schedule": "cosine", "steps": 8}
    straight = trainer(tiny_model, **cfg)
    first = train(straight, range(1, 4))
    assert first[0]["kl"] == 0.0  # B = 0 and the norms from the model path: the policy is the reference
    assert all(m["kl"] > 0 for m in first[1:]) and all(math.isfinite(v) for m in first for v in m.values())
    path = straight.save_checkpoint(tmp_path)
    want = train(straight, range(4, 6))
    resumed = trainer(tiny_model, **cfg)
    resumed.load_checkpoint(path)  # the trained norms: the reference must keep the model path's
    got = train(resumed, range(4, 6))
    for a, b in zip(want, got, strict=True):
        assert {k: v for k, v in a.items() if k != "step_time_s"} == {k: v for k, v in b.items() if k != "step_time_s"}
    assert want[-1]["kl"] > 0


@pytest.mark.slow  # compiles on the CPU: ~15 s on 2 cores
def test_compiled_layers_keep_the_reference_and_the_policy_apart(tiny_model, monkeypatch):
    """learner.compile: the reference pass and the policy's own no-grad pass (two mini-batches: proximal logprobs
    from a pass) differ only in the adapters' flag, on which the compiled layers guard. Each matches the eager
    run's. (sdpa: the CPU compile of the varlen path fails in Inductor, with or without LoRA.)"""
    cfg = {**KL, "attn_implementation": "sdpa", "mini_batches": 2, "off_policy": "decoupled"}
    runs = {}
    for compiled in (False, True):
        runs[compiled] = record_old_passes(monkeypatch)
        train(trainer(tiny_model, **cfg, compile=compiled), range(1, 3))
        monkeypatch.undo()
    for (_, refs, proxes), (_, eager_refs, eager_proxes) in zip(runs[True], runs[False], strict=True):
        for ref, prox, eager_ref, eager_prox in zip(refs, proxes, eager_refs, eager_proxes, strict=True):
            torch.testing.assert_close(ref, eager_ref, atol=1e-5, rtol=0)
            torch.testing.assert_close(prox, eager_prox, atol=1e-5, rtol=0)
    _, refs, proxes = runs[True][-1]
    assert all((r - p).abs().max() > 1e-3 for r, p in zip(refs, proxes))  # step 2: the adapters have moved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(300)
def test_gpu_bf16_compiled_reference_is_the_fresh_base(tiny_model, monkeypatch):
    """One GPU: FSDP2 bf16, compiled layers, the default attention: after training has moved the adapters and the
    norms, the reference logprobs of the last step are a fresh LoRA trainer's (B = 0, the model path's norms) bit
    for bit, the policy's own logprobs come back unchanged after a reference pass, and kl > 0."""
    seen = record_old_passes(monkeypatch)
    cfg = {**KL, "compile": True}
    t = Trainer(LearnerConfig(**cfg), str(tiny_model), device="cuda:0", dtype="bfloat16")
    metrics = [t.train_step(make_batch(seed=s, step=s)) for s in range(1, 4)]
    kls = [m["kl"] for m in metrics]  # step 1: policy = reference up to the compiled graphs' rounding
    assert abs(kls[0]) < 1e-5 and kls[-1] > 1e-5, kls
    mbs, refs, _ = seen[-1]
    fresh = Trainer(LearnerConfig(**cfg), str(tiny_model), device="cuda:0", dtype="bfloat16")
    for mb, ref in zip(mbs, refs, strict=True):
        before = logprobs(t, mb)
        with t.lora_ref.mode():
            again = t._forward(t.policy, mb)[0]
        assert torch.equal(again, ref)
        assert torch.equal(logprobs(t, mb), before)
        assert (ref - before).float().abs().max() > 1e-3  # the policy moved away from its reference
        assert torch.equal(ref, logprobs(fresh, mb))
    if dist.is_initialized():
        dist.destroy_process_group()
