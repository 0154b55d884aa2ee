"""GPU: FSDP2 over NCCL with bf16 compute, and the single-process autocast path (skipped without CUDA)."""

import math

import pytest
import torch
import torch.multiprocessing as mp
from learner_helpers import free_port, gpu_worker, make_batch

from asyncrl.learner.batch_tensors import MicroBatch, build_micro_batch, flatten_batch, to_device
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
    t32 = Trainer(LearnerConfig(host_threads=3), str(tiny_model), device="cuda:0", dtype="float32")
    assert torch.get_num_threads() == 3  # a GPU learner caps torch's host thread pool (LearnerConfig.host_threads)
    seqs, _ = flatten_batch(make_batch(seed=3, temperature=0.8))
    mb = build_micro_batch(seqs)
    to_device([mb], torch.device("cuda:0"))
    with torch.no_grad():
        lp16 = t16._forward(t16.policy, mb)[0]
        lp32 = t32._forward(t32.policy, mb)[0]
    assert (lp16 - lp32).abs().max() < 0.05
    m = t16.train_step(make_batch(seed=3))
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_to_device_moves_every_field_unchanged():
    seqs, _ = flatten_batch(make_batch(seed=4, groups=3, n=4))
    mbs = [build_micro_batch(seqs[:5]), build_micro_batch(seqs[5:])]
    host = [{k: getattr(mb, k).clone() for k in MicroBatch.__slots__ if isinstance(getattr(mb, k), torch.Tensor)}
            for mb in mbs]
    to_device(mbs, torch.device("cuda:0"))
    for mb, fields in zip(mbs, host):
        for k, v in fields.items():
            got = getattr(mb, k)
            assert got.is_cuda and got.dtype == v.dtype and got.shape == v.shape, k
            assert torch.equal(got.cpu(), v), k


def test_flash_varlen_matches_per_sequence_sdpa():
    """The flash varlen kernel (GQA, 14 query / 2 kv heads) equals causal SDPA run per sequence, in values
    and gradients."""
    from asyncrl.learner import attention

    torch.manual_seed(0)
    lengths = [5, 264, 100, 1, 37]
    t = sum(lengths)
    cu = attention.cu_seqlens(lengths).cuda()
    base = [torch.randn(t, h, 64, device="cuda", dtype=torch.bfloat16) for h in (14, 2, 2)]
    grad = torch.randn(t, 14, 64, device="cuda", dtype=torch.bfloat16)
    results = []
    for fn in (lambda q, k, v: attention.varlen_attention(q, k, v, cu, max(lengths), 0.125),
               lambda q, k, v: attention._per_sequence(q, k, v, cu, 0.125)):
        q, k, v = (x.clone().requires_grad_() for x in base)
        out = fn(q, k, v)
        out.backward(grad)
        results.append([out.float(), q.grad.float(), k.grad.float(), v.grad.float()])
    assert attention._gqa_native is not None  # the flash path ran
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)


def test_triton_logprob_kernels_match_torch():
    from asyncrl.learner import logprob_kernels as K

    torch.manual_seed(0)
    n, vocab = 300, 151936
    logits = (3 * torch.randn(n, vocab, device="cuda")).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (n,), device="cuda")
    inv_temp = 1.0 / torch.rand(n, device="cuda").add(0.5)
    grad = torch.randn(n, device="cuda")
    fused = K.forward(logits, targets, inv_temp, None)
    ref = K.torch_forward(logits, targets, inv_temp, None)
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4)
    d_fused = K.backward_(logits.clone(), targets, inv_temp, ref[2], grad, None).float()
    d_ref = K.torch_backward_(logits.clone(), targets, inv_temp, ref[2], grad, None).float()
    torch.testing.assert_close(d_fused, d_ref, atol=1e-3, rtol=1e-2)


def test_varlen_trainer_step_matches_sdpa(tiny_model):
    """One bf16 step with varlen attention and one with HF sdpa over the dense packed mask agree."""
    metrics = []
    for attn in ("varlen", "sdpa"):
        trainer = Trainer(LearnerConfig(attn_implementation=attn, lr=1e-4), str(tiny_model), device="cuda:0",
                          dtype="bfloat16")
        metrics.append(trainer.train_step(make_batch(seed=5)))
    for k in ("loss", "entropy", "grad_norm"):
        assert metrics[0][k] == pytest.approx(metrics[1][k], rel=0.05, abs=1e-3), k


def test_compiled_step_matches_eager_without_graph_breaks(tiny_model):
    """learner.compile: each decoder layer compiles to one graph (varlen attention is a traced custom op, no
    break around it) and a compiled bf16 step matches the eager one."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    metrics = []
    for compile_ in (False, True):
        trainer = Trainer(LearnerConfig(compile=compile_, lr=1e-4), str(tiny_model), device="cuda:0", dtype="bfloat16")
        metrics.append([trainer.train_step(make_batch(seed=s)) for s in (5, 6)])
    breaks = dict(counters["graph_break"])
    assert not breaks, breaks
    for eager, compiled in zip(*metrics):
        for k in ("loss", "entropy", "grad_norm"):
            assert compiled[k] == pytest.approx(eager[k], rel=0.05, abs=1e-3), k
