"""LoRA in the learner: config and target errors, a frozen base (bit for bit), an optimizer and checkpoints of
the adapters and the trained norms (learner.lora_trainable) only, merged weights under the Hugging Face names,
resume, export (merged folder + PEFT adapter with modules_to_save)."""

import json

import pytest
import torch
from learner_helpers import make_batch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from asyncrl.learner import fsdp, lora
from asyncrl.learner.checkpoint import latest_checkpoint
from asyncrl.learner.config import DEFAULT_LORA_TARGETS, LearnerConfig
from asyncrl.learner.trainer import Trainer

LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_lr": 1e-2, "micro_batch_tokens": 32}
IDS = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])


def lora_trainer(model_path, **overrides) -> Trainer:
    return Trainer(LearnerConfig(**{**LORA, **overrides}), str(model_path), device="cpu")


def is_trained(name: str) -> bool:
    """An adapter, or a norm's gain (learner.lora_trainable's default, ["norm"])."""
    return lora.is_adapter(name) or name.rsplit(".", 2)[-2].endswith("norm")


def base_snapshot(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in t.policy.hf.named_parameters() if not is_trained(k)}


def adapter_snapshot(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in t.policy.hf.named_parameters() if is_trained(k)}


def train(t: Trainer, steps: range) -> list[dict[str, float]]:
    return [t.train_step(make_batch(seed=s, step=s)) for s in steps]


@pytest.mark.parametrize(("field", "value"), [
    ("lora_rank", -1), ("lora_alpha", 0.0), ("lora_dropout", 1.0), ("lora_targets", []),
    ("lora_targets", ["q_proj", "q_proj"]), ("lora_targets", ["model.q_proj"]), ("lora_lr", -1.0),
    ("lora_trainable", ["model.norm"]), ("lora_trainable", ["norm", "norm"]), ("lora_trainable", [""])])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"learner.{field}"):
        LearnerConfig(**{field: value})


def test_lora_learning_rate_defaults_to_ten_times_lr():
    assert LearnerConfig(lr=2e-4).resolved_lr == 2e-4
    assert LearnerConfig(lr=2e-4, lora_rank=8).resolved_lr == pytest.approx(2e-3)
    assert LearnerConfig(lr=2e-4, lora_rank=8, lora_lr=5e-4).resolved_lr == 5e-4


def test_a_target_the_model_lacks_is_one_line_naming_it(tiny_model):
    with pytest.raises(ValueError, match="'qkv_proj' names no linear layer of Qwen2ForCausalLM") as e:
        lora_trainer(tiny_model, lora_targets=["q_proj", "qkv_proj"])
    assert "\n" not in str(e.value) and "q_proj" in str(e.value)  # lists the model's linear layers
    with pytest.raises(ValueError, match="'lm_head' is the output head"):
        lora.check_targets(tiny_model, ["lm_head"])
    with pytest.raises(ValueError, match="'c_attn'"):
        lora.check_targets(tiny_model, ["c_attn"])  # preflight's check: config.json only
    lora.check_targets(tiny_model, DEFAULT_LORA_TARGETS)


def test_a_trainable_name_the_model_lacks_is_one_line_naming_it(tiny_model):
    with pytest.raises(ValueError, match="learner.lora_trainable: 'layernorm_x' ends no module name") as e:
        lora_trainer(tiny_model, lora_trainable=["norm", "layernorm_x"])
    assert "\n" not in str(e.value) and "input_layernorm" in str(e.value)
    with pytest.raises(ValueError, match="learner.lora_trainable: 'ln' ends no module name"):
        lora.check_targets(tiny_model, DEFAULT_LORA_TARGETS, ["ln"])  # preflight's check: config.json only
    with pytest.raises(ValueError, match="learner.lora_trainable: 'q_proj' matches .*a LoRA target"):
        lora.check_targets(tiny_model, DEFAULT_LORA_TARGETS, ["q_proj"])
    lora.check_targets(tiny_model, DEFAULT_LORA_TARGETS, ["norm", "embed_tokens"])


def test_training_moves_only_the_adapters_and_the_norms(tiny_model):
    t = lora_trainer(tiny_model)
    assert len(t.lora) == 2 * len(DEFAULT_LORA_TARGETS)  # 2 layers x 7 projections
    assert t.lora_trainable == ["model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                                "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                                "model.norm.weight"]
    base, adapters = base_snapshot(t), adapter_snapshot(t)
    assert all(not torch.any(v) for k, v in adapters.items() if k.endswith("lora_B"))  # starts as the base
    assert [g["lr"] for g in t.optimizer.param_groups] == [1e-2]
    in_optimizer = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for k, p in t.policy.hf.named_parameters() if is_trained(k)}
    train(t, range(1, 3))
    for k, p in t.policy.hf.named_parameters():
        if not is_trained(k):
            assert not p.requires_grad and p.grad is None, k
            assert torch.equal(p.detach(), base[k]), f"base parameter {k} changed"
            assert p not in t.optimizer.state, k
        else:
            assert p.dtype == torch.float32 and not torch.equal(p.detach(), adapters[k]), f"adapter {k} did not move"


def test_an_empty_lora_trainable_trains_the_adapters_alone(tiny_model):
    t = lora_trainer(tiny_model, lora_trainable=[])
    assert t.lora_trainable == []
    in_optimizer = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for k, p in t.policy.hf.named_parameters() if lora.is_adapter(k)}
    assert set(t.adapter_tensors()) == {k for k, _ in t.masters if lora.is_adapter(k)}


def test_merged_weights_are_w_plus_scaled_ba_under_the_hf_names(tiny_model):
    t = lora_trainer(tiny_model)
    train(t, range(1, 3))
    merged = dict(t.named_full_tensors())
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert set(merged) == set(dict(plain.named_parameters()))
    scale = 8.0 / 4
    for path, module in t.lora.items():
        want = module.weight.detach() + scale * module.lora_B.detach() @ module.lora_A.detach()
        torch.testing.assert_close(merged[f"{path}.weight"], want, atol=0, rtol=0)
        assert not torch.equal(merged[f"{path}.weight"], module.weight), path
    trained = dict(t.policy.hf.named_parameters())
    for k, p in plain.named_parameters():
        if k in t.lora_trainable:  # a trained norm: the learner's own tensor, moved off the base
            assert torch.equal(merged[k], trained[k].detach()) and not torch.equal(merged[k], p.detach()), k
        elif k.rsplit(".", 1)[0] not in t.lora or k.endswith("bias"):
            assert torch.equal(merged[k], p.detach()), k
    # pushed twice: the same numbers (computed from the pristine base, never merged in place)
    assert all(torch.equal(v, merged[k]) for k, v in t.named_full_tensors())


def test_merged_model_computes_what_the_lora_model_computes(tiny_model):
    t = lora_trainer(tiny_model)
    train(t, range(1, 3))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    plain.load_state_dict(dict(t.named_full_tensors()), strict=False)
    t.policy.eval()
    with torch.no_grad():
        want = t.policy.hf(input_ids=IDS).logits
        torch.testing.assert_close(plain(input_ids=IDS).logits, want, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(AutoModelForCausalLM.from_pretrained(tiny_model)(input_ids=IDS).logits, want)


def test_bf16_under_fsdp_holds_the_base_in_bf16_and_keeps_it(tiny_model):
    """One-rank FSDP2 (gloo on CPU) with bf16 compute: the frozen base is held in bf16 (no fp32 master), the
    adapters are fp32 masters, the lean varlen attention runs through the wrapped projections."""
    t = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="bfloat16")
    held = {k: fsdp.local_tensor(p.detach()) for k, p in t.masters}  # what FSDP2 keeps (one rank: whole tensors)
    base = {k: v.clone() for k, v in held.items() if not is_trained(k)}
    adapters = {k: v.clone() for k, v in held.items() if is_trained(k)}  # and the norms' gains
    assert {v.dtype for v in base.values()} == {torch.bfloat16}
    assert {v.dtype for v in adapters.values()} == {torch.float32}
    m = train(t, range(1, 3))
    assert all(v == v for v in m[-1].values())  # no NaN metric
    for k, v in held.items():
        assert torch.equal(v, base[k]) if k in base else not torch.equal(v, adapters[k]), k
    merged = dict(t.named_full_tensors())
    assert merged["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32


def test_one_rank_holds_the_frozen_base_once(tiny_model):
    """One FSDP2 rank keeps the unsharded compute copy of what it wraps beside the shard for the whole run
    (fsdp.ComputeCopy). The frozen base is left out of FSDP there, so after training steps (and a checkpoint's
    state-dict call) the tensor each module computes with is the one tensor held for it: no second copy."""
    t = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="bfloat16")
    held = {k: p for k, p in t.masters if not is_trained(k)}
    train(t, range(1, 3))
    t.policy.reshard()  # as a checkpoint leaves it; the next forward unsharded the trained ones again
    train(t, range(3, 4))
    live = dict(t.policy.hf.named_parameters())
    for k, p in held.items():
        assert not hasattr(p, "device_mesh") and p.dtype == torch.bfloat16, k
        assert live[k].untyped_storage().data_ptr() == p.untyped_storage().data_ptr(), k
    assert all(hasattr(p, "device_mesh") for k, p in t.masters if is_trained(k))  # the trained ones: FSDP's


def test_checkpoint_holds_adapters_only_and_resumes_exactly(tiny_model, tmp_path):
    cfg = {"algorithm": "dapo", "warmup_steps": 1, "lr_schedule": "cosine", "steps": 6, "clip_eps_high": 0.28}
    straight = lora_trainer(tiny_model, **cfg)
    train(straight, range(1, 3))
    path = straight.save_checkpoint(tmp_path, extra={"k": 1})
    want = train(straight, range(3, 5))

    saved = torch.load(path / "model.pt", weights_only=True)
    assert saved and all(is_trained(k) for k in saved), sorted(saved)[:3]
    assert len(saved) == 2 * len(straight.lora) + 5  # + 2 layers x 2 norms + model.norm
    assert {f"hf.{k}" for k in straight.lora_trainable} <= set(saved)

    resumed = lora_trainer(tiny_model, **cfg)
    assert resumed.load_checkpoint(latest_checkpoint(tmp_path)) == {"k": 1} and resumed.step == 2
    got = train(resumed, range(3, 5))
    for a, b in zip(want, got):
        assert {k: v for k, v in a.items() if k != "step_time_s"} == {k: v for k, v in b.items() if k != "step_time_s"}
    theirs = dict(resumed.named_full_tensors())
    assert all(torch.equal(v, theirs[k]) for k, v in straight.named_full_tensors())

    full = Trainer(LearnerConfig(micro_batch_tokens=32), str(tiny_model), device="cpu")
    with pytest.raises(ValueError, match="model.pt does not match"):
        full.load_checkpoint(path)


def test_export_writes_the_merged_folder_and_a_peft_adapter(tiny_model, tmp_path):
    t = lora_trainer(tiny_model, lora_targets=["q_proj", "v_proj", "down_proj"])
    train(t, range(1, 3))
    out = t.export(tmp_path / "export")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    tensors = load_file(out / "adapter" / "adapter_model.safetensors")
    assert len(tensors) == 2 * 2 * 3 + 5  # + the trained norms, as PEFT saves a modules_to_save module
    assert config["modules_to_save"] == ["input_layernorm", "norm", "post_attention_layernorm"]
    norm = tensors["base_model.model.model.norm.weight"]
    assert torch.equal(norm, dict(t.policy.hf.named_parameters())["model.norm.weight"].detach())
    assert not torch.all(norm == 1.0)  # trained
    a = tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"]
    torch.testing.assert_close(a, t.lora["model.layers.1.self_attn.q_proj"].lora_A.detach(), atol=0, rtol=0)
    assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"].shape == (64, 4)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    t.policy.eval()
    with torch.no_grad():
        want = t.policy.hf(input_ids=IDS).logits
        torch.testing.assert_close(merged(input_ids=IDS).logits, want, atol=1e-5, rtol=1e-5)


def test_peft_loads_the_exported_adapter(tiny_model, tmp_path):
    peft = pytest.importorskip("peft")
    t = lora_trainer(tiny_model)
    train(t, range(1, 3))
    out = t.export(tmp_path / "export")
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=IDS).logits, merged(input_ids=IDS).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(300)
def test_gpu_bf16_compiled_lora_keeps_the_base_and_resumes(tiny_model, tmp_path):
    """One GPU: FSDP2 bf16 with compiled layers and the fused lm_head logprob; the base stays bf16 and bit for bit,
    the merged weights reproduce the LoRA model, and the adapter checkpoint repeats the next step."""
    cfg = {**LORA, "compile": True, "activation_checkpointing": True}
    t = Trainer(LearnerConfig(**cfg), str(tiny_model), device="cuda:0", dtype="bfloat16")
    held = {k: fsdp.local_tensor(p.detach()) for k, p in t.masters}
    base = {k: v.clone() for k, v in held.items() if not is_trained(k)}
    assert {v.dtype for v in base.values()} == {torch.bfloat16}
    assert {v.dtype for k, v in held.items() if is_trained(k)} == {torch.float32}  # adapters and norms: fp32 masters
    train(t, range(1, 3))
    assert all(torch.equal(held[k], v) for k, v in base.items())
    path = t.save_checkpoint(tmp_path)
    want = t.train_step(make_batch(seed=3, step=3))
    other = Trainer(LearnerConfig(**cfg), str(tiny_model), device="cuda:0", dtype="bfloat16")
    other.load_checkpoint(path)
    got = other.train_step(make_batch(seed=3, step=3))
    for k in ("loss", "grad_norm", "entropy"):
        assert got[k] == pytest.approx(want[k], rel=1e-3, abs=1e-5), k
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).cuda()
    plain.load_state_dict(dict(t.named_full_tensors()), strict=False)
    learned = {k: fsdp.local_tensor(p.detach()).float().cpu() for k, p in t.masters}
    if torch.distributed.is_initialized():  # the bf16 trainers' one-rank group: the host trainer must not join it
        torch.distributed.destroy_process_group()
    with torch.no_grad():
        ids = IDS.cuda()
        lora_fp32 = lora_trainer(tiny_model)  # same merged tensors, evaluated unmerged in fp32 on the host
        lora_fp32.policy.hf.load_state_dict(learned, strict=False)
        torch.testing.assert_close(plain(input_ids=ids).logits.cpu(), lora_fp32.policy.eval().hf(input_ids=IDS).logits,
                                   atol=1e-4, rtol=1e-4)
