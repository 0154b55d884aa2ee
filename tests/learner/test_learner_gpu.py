"""GPU: FSDP2 over NCCL with bf16 compute, and the single-process autocast path (skipped without CUDA)."""

import math

import pytest
import torch
import torch.multiprocessing as mp
from learner_helpers import free_port, gpu_worker, make_batch

from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.timeout(300)
def test_fsdp_nccl_bf16(tiny_model, tmp_path):
    world = min(torch.cuda.device_count(), 2)
    mp.spawn(gpu_worker, args=(world, free_port(), str(tiny_model), str(tmp_path)), nprocs=world, join=True)
    got = torch.load(tmp_path / "gpu.pt", weights_only=False)
    for m in got["ms"] + [got["m3"], got["m3b"]]:
        assert all(math.isfinite(v) for v in m.values()), m
    assert set(got["dtypes"].values()) == {"torch.float32"}  # fp32 master weights for the push
    for k in ("loss", "grad_norm", "entropy", "kl"):
        assert got["m3b"][k] == pytest.approx(got["m3"][k], rel=1e-3, abs=1e-5), k


def test_unsharded_bf16_logprobs_close_to_fp32(tiny_model):
    t16 = Trainer(LearnerConfig(), str(tiny_model), device="cuda:0", dtype="bfloat16")
    t32 = Trainer(LearnerConfig(), str(tiny_model), device="cuda:0", dtype="float32")
    seqs, _ = flatten_batch(make_batch(seed=3, temperature=0.8))
    mb = build_micro_batch(seqs).to(torch.device("cuda:0"))
    with torch.no_grad():
        lp16 = t16._forward(t16.policy, mb)[0]
        lp32 = t32._forward(t32.policy, mb)[0]
    assert (lp16 - lp32).abs().max() < 0.05
    m = t16.train_step(make_batch(seed=3))
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
