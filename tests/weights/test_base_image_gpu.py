"""The base image over CUDA IPC (generator.share_base on a GPU): a holder process writes it, this process opens it
in place (its values, without computing them; a write here is seen there), an engine and a learner on it hold
none of its matrices (their CUDA allocations shrink by the image's bytes), and an engine on it scores as one with
its own copy."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.weights import base_image

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.timeout(300)]

HOLDER = textwrap.dedent("""
    import sys, time, pathlib, torch
    from asyncrl.engine.torch.model import load_hf_folder
    from asyncrl.weights import base_image
    run_dir, model, done = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    m = load_hf_folder(model, torch.bfloat16, torch.device("cpu"))
    flat = base_image.write(run_dir, base_image.matrices(m.named_parameters()), torch.device("cuda:0"))
    while not done.exists():
        time.sleep(0.05)
    torch.cuda.synchronize()
    print("canary", float(flat[:2].view(torch.bfloat16)[0]))
""")


@pytest.fixture
def holder(tiny_model_gpu, tmp_path):
    done = tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(tiny_model_gpu), str(done)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield tmp_path, done, proc
    done.touch()
    proc.wait(timeout=60)


@pytest.fixture
def tiny_model_gpu(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learner"))  # the learner tests' helpers
    from learner_helpers import make_tiny_model

    yield make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))
    import torch.distributed as dist

    if dist.is_initialized():  # the bf16 Trainer's one-rank group: later tests must not inherit it
        dist.destroy_process_group()


def test_the_image_opens_in_place_in_another_process(holder, tiny_model_gpu):
    from asyncrl.engine.torch.model import load_hf_folder

    run_dir, done, proc = holder
    image = base_image.open_image(run_dir, "cuda:0", timeout_s=120)
    disk = dict(load_hf_folder(tiny_model_gpu, torch.bfloat16, torch.device("cpu")).named_parameters())
    assert all(torch.equal(t.cpu(), disk[n]) for n, t in image.items())
    first = base_image.layout(base_image.matrices(disk.items()))[0][0].name
    image[first].view(-1)[0] = 3.0
    torch.cuda.synchronize()
    done.touch()
    out, _ = proc.communicate(timeout=60)
    assert "canary 3.0" in out, out


def test_an_engine_and_a_learner_on_the_image_hold_none_of_it(holder, tiny_model_gpu):
    from test_lora_push import LORA, SPEC, scores

    from asyncrl.engine.torch.adapter_merge import LoraSpec
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.trainer import Trainer

    run_dir, _, _ = holder
    image = base_image.open_image(run_dir, "cuda:0", timeout_s=120)
    nbytes = sum(t.numel() * t.element_size() for t in image.values())
    unmerged = LoraSpec(SPEC.targets, SPEC.scale, LORA["lora_rank"], "unmerged")
    grown = {}
    engines = {}
    for name, kw in (("own", {}), ("shared", {"base_image": image})):
        gc.collect()  # earlier tests' garbage, freed inside the window, made both growths negative (whole `-m gpu` run)
        gc.disable()
        try:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            engines[name] = TorchEngine(tiny_model_gpu, device="cuda:0", dtype="bfloat16", max_running=4,
                                        num_kv_blocks=64, lora=unmerged, cuda_graphs=False, **kw)
            grown[name] = torch.cuda.memory_allocated() - before
        finally:
            gc.enable()
    assert grown["own"] - grown["shared"] >= nbytes  # the image's matrices are not this process's allocations
    for x, y in zip(scores(engines["shared"]), scores(engines["own"]), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-2)  # bf16: the same weights, rounding aside
    trainer = Trainer(LearnerConfig(**LORA), str(tiny_model_gpu), device="cuda:0", dtype="bfloat16", base_image=image)
    params = dict(trainer.policy.hf.named_parameters())
    assert trainer.shared == set(image) and all(params[n].data_ptr() == image[n].data_ptr() for n in image)
