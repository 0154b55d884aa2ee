"""FP8 rollouts on CUDA: the Triton row quantizer against its torch form, the fp8 matmul against bf16 at the
0.5B shape's projection sizes, and the engine under CUDA-graph replay: the same tokens as without graphs, and a
weight update reaches the captured graphs (they read the re-quantized images in place)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import drain, engine, request

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.kernels import fp8 as fp8_kernels
from asyncrl.engine.torch.model import fp8
from asyncrl.engine.torch.model.fp8 import Fp8Linear, check_supported, quantize_rows_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="fp8 matmuls need compute capability 8.9"),
]
PROMPT = [5, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("rows,cols", [(1, 896), (256, 896), (37, 4864), (256, 8960)])
def test_triton_quantizer_matches_its_torch_form(rows, cols):
    torch.manual_seed(0)
    x = (torch.randn(rows, cols, device="cuda") * torch.logspace(-2, 2, rows, device="cuda")[:, None]).bfloat16()
    _agrees(fp8_kernels.quantize_rows_fp8(x), quantize_rows_reference(x))


def _agrees(got, ref) -> None:
    (x8, scale), (ref8, ref_scale) = got, ref
    assert torch.allclose(scale, ref_scale, rtol=1e-6)
    step = 2.0 ** -3 * ref8.float().abs().clamp(min=2.0**-6)  # one e4m3 step at each value
    assert ((x8.float() - ref8.float()).abs() <= step).all()  # Triton's division may round the other way
    assert (x8.float() == ref8.float()).float().mean().item() > 0.999


@pytest.mark.parametrize("residual", [False, True])
def test_fused_norm_and_silu_quantizers_match_the_unfused_kernels(residual):
    torch.manual_seed(0)
    x = torch.randn(64, 896, device="cuda").bfloat16()
    res = torch.randn(64, 896, device="cuda").bfloat16() if residual else None
    w = (1 + 0.1 * torch.randn(896, device="cuda")).bfloat16()
    normed, stream = kernels.ops.add_rmsnorm(x, res, w, 1e-6)
    got, fused_stream = fp8_kernels.add_rmsnorm_fp8(x, res, w, 1e-6)
    assert torch.equal(stream, fused_stream)
    _agrees(got, quantize_rows_reference(normed))
    gate_up = torch.randn(64, 2 * 4864, device="cuda").bfloat16()
    _agrees(fp8_kernels.silu_mul_fp8(gate_up), quantize_rows_reference(kernels.ops.silu_mul(gate_up)))


@pytest.mark.parametrize("out_f,in_f", [(1152, 896), (896, 896), (9728, 896), (896, 4864)])
def test_fp8_matmul_against_bf16_at_the_05b_projection_sizes(out_f, in_f):
    torch.manual_seed(0)
    w = (torch.randn(out_f, in_f, device="cuda") * 0.02).bfloat16()
    x = torch.randn(256, in_f, device="cuda").bfloat16()
    ref = F.linear(x.float(), w.float())
    got = Fp8Linear(w, None)(x)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - ref).norm() / ref.norm()).item() < 0.05


def test_h200_class_devices_pass_the_support_check():
    check_supported(torch.device("cuda"), torch.bfloat16)
    with pytest.raises(ValueError, match="model.dtype"):
        check_supported(torch.device("cuda"), torch.float16)


def _greedy(eng):
    reqs = [request("a", PROMPT, max_new_tokens=24, temperature=0.0, ignore_eos=True),
            request("b", PROMPT[:4], n=3, max_new_tokens=24, temperature=1.0, seed=3, ignore_eos=True)]
    return {k: (v.token_ids.tolist(), torch.from_numpy(v.logprobs)) for k, v in drain(eng, {0: reqs}).items()}


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(a[k][0] == b[k][0] and torch.allclose(a[k][1], b[k][1], atol=1e-5)
                                        for k in a)


def test_fused_input_quantization_generates_what_the_separate_kernel_does(tiny_models, monkeypatch):
    path = tiny_models["qwen2"]
    fused = _greedy(engine(path, device="cuda", dtype="bfloat16", weights_dtype="fp8"))
    monkeypatch.setattr(fp8, "FUSE_INPUTS", False)
    assert _same(fused, _greedy(engine(path, device="cuda", dtype="bfloat16", weights_dtype="fp8")))


def test_fp8_engine_under_graph_replay_and_after_an_update(tiny_models, tiny_factory, tmp_path):
    path = tiny_models["qwen2"]
    graphs = engine(path, device="cuda", dtype="bfloat16", weights_dtype="fp8")
    assert graphs.runner.graphs is not None
    eager = engine(path, device="cuda", dtype="bfloat16", weights_dtype="fp8", cuda_graphs=False)
    first = _greedy(graphs)
    assert _same(first, _greedy(eager))  # the captured graphs compute what the eager steps do
    assert not _same(first, _greedy(engine(path, device="cuda", dtype="bfloat16")))  # and it is not the bf16 path

    other = tiny_factory(tmp_path / "other", "qwen2", seed=7)
    from transformers import AutoModelForCausalLM

    graphs.begin_weight_update()
    graphs.load_weights(AutoModelForCausalLM.from_pretrained(other).state_dict().items())
    graphs.end_weight_update(1)
    assert _same(_greedy(graphs), _greedy(engine(other, device="cuda", dtype="bfloat16", weights_dtype="fp8",
                                                 cuda_graphs=False)))
