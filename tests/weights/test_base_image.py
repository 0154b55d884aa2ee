"""The base image (generator.share_base) on the CPU: its layout keeps the engine's fused groups back to back, every
consumer's tensors are views of one mapping (a write in one process is seen by another), and the ways it can be
wrong are each one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from asyncrl.weights import base_image


def named_model() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = [("model.embed_tokens.weight", torch.randn(11, 8, generator=g))]
    for i in range(2):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", torch.ones(8)),
                (f"{p}.self_attn.q_proj.weight", torch.randn(8, 8, generator=g)),
                (f"{p}.self_attn.k_proj.weight", torch.randn(4, 8, generator=g)),
                (f"{p}.self_attn.q_proj.bias", torch.randn(8, generator=g)),
                (f"{p}.self_attn.v_proj.weight", torch.randn(4, 8, generator=g)),
                (f"{p}.self_attn.o_proj.weight", torch.randn(8, 8, generator=g)),
                (f"{p}.mlp.up_proj.weight", torch.randn(6, 8, generator=g)),  # up before gate: the image reorders
                (f"{p}.mlp.gate_proj.weight", torch.randn(6, 8, generator=g)),
                (f"{p}.mlp.down_proj.weight", torch.randn(8, 6, generator=g))]
    return out


def test_matrices_leave_out_vectors_and_tied_aliases():
    named = named_model()
    named.append(("lm_head.weight", named[0][1]))  # tied to the embedding
    names = [n for n, _ in base_image.matrices(named)]
    assert "lm_head.weight" not in names and not any("norm" in n or n.endswith("bias") for n in names)
    assert len(names) == 1 + 2 * 7


def test_fused_groups_lie_back_to_back_and_groups_are_aligned():
    entries, nbytes = base_image.layout(base_image.matrices(named_model()))
    order = [e.name.split(".")[-2] for e in entries if ".layers.0." in e.name]
    assert order == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    by = {e.name: e for e in entries}
    q, k, v = (by[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    assert k.offset == q.offset + q.nbytes and v.offset == k.offset + k.nbytes  # no gap inside a group
    assert all(e.offset % base_image.ALIGN == 0 for e in entries if e.name.endswith(("q_proj.weight", "o_proj.weight",
                                                                                     "gate_proj.weight")))
    assert nbytes == max(e.offset + e.nbytes for e in entries)


def test_an_image_opens_as_views_with_each_fused_group_back_to_back(tmp_path):
    named = base_image.matrices(named_model())
    flat = base_image.write(tmp_path, named, torch.device("cpu"))
    opened = base_image.open_image(tmp_path, "cpu", timeout_s=1)
    assert set(opened) == {n for n, _ in named}
    assert all(torch.equal(opened[n], t) for n, t in named)
    q, k, v = (opened[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv")
    assert k.data_ptr() == q.data_ptr() + q.nbytes and v.data_ptr() == k.data_ptr() + k.nbytes  # one [q+k+v] view
    flat[:4] = 7  # the holder's bytes and a consumer's views are one mapping of the same file
    assert opened["model.embed_tokens.weight"].view(torch.uint8).flatten()[:4].tolist() == [7] * 4


def test_another_process_reads_and_writes_the_same_bytes(tmp_path):
    named = base_image.matrices(named_model())
    base_image.write(tmp_path, named, torch.device("cpu"))
    mine = base_image.open_image(tmp_path, "cpu", timeout_s=1)
    code = textwrap.dedent(f"""
        from asyncrl.weights import base_image
        t = base_image.open_image({str(tmp_path)!r}, "cpu", timeout_s=5)
        print(float(t["model.layers.0.mlp.down_proj.weight"][0, 0]))
        t["model.layers.0.mlp.down_proj.weight"][0, 0] = 123.5   # a consumer never writes; this test does, to see it
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(out.stdout.split()[-1]) == float(dict(named)["model.layers.0.mlp.down_proj.weight"][0, 0])
    assert float(mine["model.layers.0.mlp.down_proj.weight"][0, 0]) == 123.5


def test_no_image_is_a_timeout_naming_the_holder(tmp_path):
    with pytest.raises(TimeoutError, match="no base image .* the base holder writes it"):
        base_image.open_image(tmp_path, "cpu", timeout_s=0.3)


def test_a_cleared_image_is_never_opened(tmp_path):
    base_image.write(tmp_path, base_image.matrices(named_model()), torch.device("cpu"))
    base_image.clear(tmp_path)
    with pytest.raises(TimeoutError):
        base_image.open_image(tmp_path, "cpu", timeout_s=0.2)


def test_a_consumer_on_another_device_or_a_short_file_is_refused(tmp_path):
    base_image.write(tmp_path, base_image.matrices(named_model()), torch.device("cpu"))
    manifest = tmp_path / base_image.FOLDER / base_image.MANIFEST
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "device": "cuda"}))
    with pytest.raises(ValueError, match="the base image is on cuda, this process computes on cpu"):
        base_image.open_image(tmp_path, "cpu", timeout_s=1)
    manifest.write_text(json.dumps({**m, "nbytes": m["nbytes"] + 1}))
    with pytest.raises(ValueError, match="its manifest says"):
        base_image.open_image(tmp_path, "cpu", timeout_s=1)
