"""Host time of an unmerged engine's receiving side of one adapter push, with the 7B push's tensor count.

On a GPU the staged CUDA IPC push (generator.ipc_staging) waits for no decode step, so the generator's pause is the
host's work: for each bucket, `unflatten` (views of the flat buffer) and `engine.load_weights` (find each adapter's
slot, check it, group the copies), then `end_weight_update`. That work grows with the number of tensors, not their
bytes, so a narrow model with Qwen2.5-7B's 28 layers and seven targets a layer (392 adapters at r 64, 57 trained
norms, 449 tensors) shows it on a CPU (where the copies, 15 MB in fp32, are still a share of the figure). Pushes in
fp32 (as the learner held them) and in bf16 (what an unmerged engine gets since `learner.service.push_dtype`)
alternate, each loaded two ways: `named` (`load_weights` of `unflatten`'s views, the general path) and `bucket`
(`load_bucket`, what WeightReceiver calls on the torch engine: the layout's plan replayed, load_plan.py).

    python -m bench.adapter_push_host [--pushes 50] [--repeat 5] [--profile PATH]

One JSON line: ms a push for each dtype and path (`bf16_ms` is bf16 by the named path, `bf16_bucket_ms` by the
bucket path), the median and the lowest of `--repeat` rounds (each round the median of `--pushes`; on a shared VM
the lowest is the steadier figure), every round, the tensor count, the buckets and bytes, and `bucket_over_named`
(bf16, lowest against lowest). `--profile` writes cProfile stats of the bf16 pushes by the bucket path.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from asyncrl.engine.bucket_layout import unflatten
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.engine.torch.engine import TorchEngine
from asyncrl.learner.config import DEFAULT_LORA_TARGETS
from asyncrl.weights.bucket import iter_buckets
from bench.make_model import Shape, make_model
from bench.provenance import commit

LAYERS, RANK = 28, 64  # Qwen2.5-7B's layer count, issue 30's rank
NARROW = Shape(hidden=128, layers=LAYERS, heads=4, kv_heads=2, intermediate=256, vocab=1024)
BUCKET_BYTES = 5 << 20  # 3 buckets of the fp32 push (2 of bf16), as the 7B push makes 3 of 256 MB


def adapter_stream(engine: TorchEngine) -> list[tuple[str, torch.Tensor]]:
    """A and B of every target [r, in] / [out, r] and every layer's two norms plus the final one, fp32."""
    gen = torch.Generator().manual_seed(0)
    named = []
    for path, shape in engine.adapters.weight_shapes.items():
        out, cols = shape
        named.append((f"{path}.lora_A", torch.randn(RANK, cols, generator=gen)))
        named.append((f"{path}.lora_B", torch.randn(out, RANK, generator=gen) * 1e-3))
    for i in range(LAYERS):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            named.append((f"model.layers.{i}.{norm}.weight", 1 + 0.01 * torch.randn(NARROW.hidden, generator=gen)))
    named.append(("model.norm.weight", torch.ones(NARROW.hidden)))
    return named


def push(engine: TorchEngine, buckets: list, version: int, by_bucket: bool) -> float:
    """One update as WeightReceiver runs it, minus the transfer: -> host seconds."""
    t = time.perf_counter()
    engine.pause("continue")
    engine.begin_weight_update()
    for flat, layout in buckets:
        if by_bucket:
            engine.load_bucket(flat, layout)
        else:
            engine.load_weights(unflatten(flat, layout, validated=True))
    engine.end_weight_update(version)
    engine.resume()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pushes", type=int, default=50)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--profile", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(NARROW, Path(tmp) / "narrow", device="cpu")
        spec = LoraSpec(tuple(DEFAULT_LORA_TARGETS), 2.0, RANK, "unmerged")
        engine = TorchEngine(folder, dtype="bfloat16", max_running=4, lora=spec, cuda_graphs=False)
        named = adapter_stream(engine)
        pushes = {name: list(iter_buckets(named, BUCKET_BYTES, "cpu", dtype))
                  for name, dtype in (("fp32", None), ("bf16", torch.bfloat16))}
        ways = {"": False, "_bucket": True}  # the named path (the keys of earlier records), the bucket path
        rounds: dict[str, list[float]] = {name + way: [] for name in pushes for way in ways}
        version = 0
        for _ in range(args.repeat):
            for name, buckets in pushes.items():  # alternating, so drift hits all four
                for way, by_bucket in ways.items():
                    times = []
                    for _ in range(args.pushes):
                        version += 1
                        times.append(push(engine, buckets, version, by_bucket))
                    rounds[name + way].append(statistics.median(times))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.pushes):
                version += 1
                push(engine, pushes["bf16"], version, True)
            prof.disable()
            prof.dump_stats(args.profile)
    print(json.dumps({
        "bench": "adapter_push_host", "commit": commit(), "layers": LAYERS, "rank": RANK,
        "tensors": len(named),
        **{f"{name}_ms": round(1e3 * statistics.median(r), 3) for name, r in rounds.items()},
        **{f"{name}_min_ms": round(1e3 * min(r), 3) for name, r in rounds.items()},
        **{f"{name}_rounds_ms": [round(1e3 * x, 3) for x in r] for name, r in rounds.items()},
        **{f"{name}_buckets": len(b) for name, b in pushes.items()},
        **{f"{name}_bytes": sum(f.numel() for f, _ in b) for name, b in pushes.items()},
        "bucket_over_named": round(min(rounds["bf16_bucket"]) / min(rounds["bf16"]), 3),
        "plan_hits": engine.weights.plans.hits,
    }))


if __name__ == "__main__":
    main()
