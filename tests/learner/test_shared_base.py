"""generator.share_base on the CPU: a torch engine and a learner computing with one base image (base_image.py) give
the numbers of their own copies, hold none of the image's matrices themselves, never write it, and refuse what
would write it; the settings it cannot serve are refused before anything starts."""

import numpy as np
import pytest
import torch
from learner_helpers import make_batch
from test_lora_push import LORA, SPEC, scores, update

from asyncrl.config.loader import from_dict
from asyncrl.config.run import RunConfig
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.engine.torch.model import load_hf_folder
from asyncrl.learner import lora
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer
from asyncrl.weights import base_image
from launch.placement import run_placement

UNMERGED = LoraSpec(SPEC.targets, SPEC.scale, LORA["lora_rank"], "unmerged")


def holder(model_path, run_dir, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """What the base holder does, in this process: the image written, then opened as a consumer opens it."""
    model = load_hf_folder(model_path, dtype, torch.device("cpu"))
    base_image.write(run_dir, base_image.matrices(model.named_parameters()), torch.device("cpu"))
    return base_image.open_image(run_dir, "cpu", timeout_s=1)


def in_image(t: torch.Tensor, image: dict[str, torch.Tensor]) -> bool:
    return t.untyped_storage().data_ptr() == next(iter(image.values())).untyped_storage().data_ptr()


def test_an_engine_on_the_image_scores_as_its_own_copy_and_holds_no_matrix(tiny_model, tmp_path):
    image = holder(tiny_model, tmp_path)
    shared = TorchEngine(tiny_model, max_running=4, lora=UNMERGED, deterministic=True, base_image=image)
    own = TorchEngine(tiny_model, max_running=4, lora=UNMERGED, deterministic=True)
    matrices = [(n, p) for n, p in shared.model.named_parameters() if p.dim() == 2]
    assert matrices and all(in_image(p, image) for _, p in matrices)
    attn = shared.model.model.layers[0].self_attn
    assert attn.qkv[0].data_ptr() == image["model.layers.0.self_attn.q_proj.weight"].data_ptr()  # fused: a view
    for x, y in zip(scores(shared), scores(own), strict=True):
        assert np.array_equal(x, y)
    trainer = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="float32")
    before = {n: t.clone() for n, t in image.items()}
    for version in (1, 2):
        trainer.train_step(make_batch(seed=version, step=version))
        for engine in (shared, own):
            update(engine, lora.adapter_push(trainer.masters), version)
        for x, y in zip(scores(shared), scores(own), strict=True):
            # within 2.4e-7 measured, not bit for bit: an engine given private clones of the image's tensors the same
            # way differs from the disk-loaded one alike, and equals this one bit for bit (the mapping is not why)
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    assert all(torch.equal(image[n], t) for n, t in before.items())  # adapters and norms only: the image is as made


def test_a_push_that_writes_the_image_is_refused_and_changes_nothing(tiny_model, tmp_path):
    image = holder(tiny_model, tmp_path)
    engine = TorchEngine(tiny_model, max_running=4, lora=UNMERGED, base_image=image)
    name = "model.layers.1.mlp.down_proj.weight"
    before = image[name].clone()
    engine.begin_weight_update()
    with pytest.raises(ValueError, match=f"generator.share_base: a push writes {name}, a tensor of the shared base"):
        engine.load_weights([(name, torch.zeros_like(before))])
    assert torch.equal(image[name], before)
    with pytest.raises(ValueError, match="needs LoRA adapters kept unmerged"):
        TorchEngine(tiny_model, max_running=4, lora=SPEC, base_image=image)


def test_a_bf16_fsdp_learner_on_the_image_trains_as_its_own_copy_and_never_writes_it(tiny_model, tmp_path):
    image = holder(tiny_model, tmp_path, torch.bfloat16)
    before = {n: t.clone() for n, t in image.items()}
    shared = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="bfloat16", base_image=image)
    own = Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="bfloat16")
    assert shared.dist.sharded and shared.shared == set(image)
    params = dict(shared.policy.hf.named_parameters())
    for name in image:
        assert in_image(params[name], image) and not hasattr(params[name], "device_mesh")  # not FSDP's: a plain view
    for step in (1, 2):
        a = shared.train_step(make_batch(seed=step, step=step))
        b = own.train_step(make_batch(seed=step, step=step))
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-5)
    mine, theirs = dict(lora.adapter_push(shared.masters)), dict(lora.adapter_push(own.masters))
    assert mine.keys() == theirs.keys() and all(torch.allclose(mine[k], theirs[k], atol=1e-4) for k in mine)
    assert any(mine[k].abs().sum() > 0 for k in mine if k.endswith("lora_B"))  # it did train
    assert all(torch.equal(image[n], t) for n, t in before.items())
    joiner = dict(lora.base_push(shared.masters, shared.shared))
    assert not set(joiner) & set(image) and set(mine) <= set(joiner)  # a joiner maps the matrices; it gets the rest


def test_the_learner_refuses_an_image_it_would_write_or_read_wrongly(tiny_model, tmp_path):
    image = holder(tiny_model, tmp_path)
    with pytest.raises(ValueError, match="learner.lora_trainable trains model.embed_tokens.weight, a matrix of the"):
        Trainer(LearnerConfig(**LORA, lora_trainable=["embed_tokens"]), str(tiny_model), device="cpu",
                dtype="float32", base_image=image)
    with pytest.raises(ValueError, match="the base image is torch.float32 on cpu, the learner computes in "
                                         "torch.bfloat16"):
        Trainer(LearnerConfig(**LORA), str(tiny_model), device="cpu", dtype="bfloat16", base_image=image)
    with pytest.raises(ValueError, match="needs LoRA"):
        Trainer(LearnerConfig(), str(tiny_model), device="cpu", dtype="float32", base_image=image)


@pytest.mark.parametrize("sets, words", [
    ({"generator": {"share_base": True}}, "learner.lora_rank = 0"),
    ({"generator": {"share_base": True}, "learner": {"lora_rank": 4}}, "generator.lora_apply = 'merge'"),
    ({"generator": {"share_base": True, "lora_apply": "unmerged"}, "learner": {"lora_rank": 4, "ranks": 2}},
     "learner.ranks = 2"),
])
def test_settings_it_cannot_serve_are_refused(sets, words):
    with pytest.raises(ValueError, match=words):
        from_dict(RunConfig, sets)


def test_a_generator_off_the_learners_device_is_refused():
    cfg = from_dict(RunConfig, {"generator": {"share_base": True, "lora_apply": "unmerged", "devices": ["cuda:1"]},
                               "learner": {"lora_rank": 4, "devices": ["cuda:0"]}})
    with pytest.raises(ValueError, match=r"every generator must be on the learner's device .* generator.devices = "
                                         r"\['cuda:0'\]"):
        run_placement(cfg, gpus=2)


def test_an_engine_on_the_image_never_reads_its_matrices_from_disk(tiny_model, tmp_path, monkeypatch):
    import safetensors

    image = holder(tiny_model, tmp_path)
    read: list[str] = []
    real = safetensors.safe_open

    class Recording:
        def __init__(self, *a, **kw):
            self.f = real(*a, **kw)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    TorchEngine(tiny_model, max_running=4, lora=UNMERGED, base_image=image)
    assert read and not set(read) & set(image)  # the norms and biases only
