"""bench.fp8_scales: its per-channel product is the engine's CPU fp8 matmul, and block scales confine an outlier."""

import torch

from asyncrl.engine.torch.model.fp8 import Fp8Linear
from bench.fp8_scales import fp8_product, quantize


def test_per_channel_product_is_the_engines_fp8_matmul():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 64, generator=g).bfloat16(), torch.randn(32, 64, generator=g).bfloat16()
    engine = Fp8Linear(w, None)(x)  # [7, 32] bf16: the same products, rounded to the model dtype
    assert torch.equal(fp8_product(x, w, 0).bfloat16(), engine)


def test_blocks_confine_an_outlier_to_its_own_block():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 256, generator=g), torch.randn(48, 256, generator=g)
    x[:, 3] *= 1e6  # one outlier column, which w does not read: with one scale per row the others fall below e4m3's
    w[:, 3] = 0  # smallest value (2^-9 of the scale) and most round to 0; a block of 32 or 128 loses only its own
    exact = x @ w.T
    rel = {b: ((fp8_product(x, w, b) - exact).norm() / exact.norm()).item() for b in (0, 128, 32)}
    assert rel[32] < 0.6 * rel[128] and rel[128] < 0.8 * rel[0] and rel[0] > 0.5, rel  # 0.28, 0.51, 0.73


def test_a_last_block_narrower_than_the_rest_is_quantized_too():
    y = torch.randn(16, 256, generator=torch.Generator().manual_seed(2))
    y8, scale = quantize(y, 100)  # blocks of 100, 100 and 56 columns
    assert y8.shape == scale.shape == y.shape and len(scale[0].unique()) == 3
    # e4m3 rounds to 3 mantissa bits (half a step: 2^-4 relative), and below 2^-6 in steps of 2^-9 (of the scale)
    assert ((y8 * scale - y).abs() <= y.abs() * 2**-4 + scale * 2**-10).all()
