"""python -m bench.weight_sync [--shape 0.5b] [--pushes 5] [--bucket-mb 256] [--window 2] [--lora-rank 16]

Pushes a random model's weights (bf16 on GPU, fp32 on CPU) from a learner-side WeightSender to one
generator process (a receiver whose engine copies every tensor into its own preallocated parameters),
and compares the achieved GB/s with a raw transfer of the same bytes on the same path in the same run:

* two GPUs: NCCL broadcast between them (reference: raw NCCL broadcasts);
* one GPU: CUDA IPC (reference: device-to-device copy bandwidth);
* CPU: gloo broadcast (reference: raw gloo broadcasts).

The raw references move the same bytes with no control messages: the push's bucket sizes posted back to
back, and all bytes as one broadcast; the faster one is `reference_gbps`.

Prints one JSON line: push_gbps (median over pushes after the first), reference_gbps, their ratio,
phase times of the median push, shape, bytes, path, device, commit.

With --lora-rank R it compares instead, in one run to one generator, LoRA's two pushes with every projection
targeted: "merged" (the whole model, W + scale * B @ A computed by the learner) and "adapter" (A and B only,
fp32; the generator merges them from its pristine base with the torch engine's own code, adapter_merge.py),
and the adapter push again with its buckets packed before the generator pauses ("adapter_gather_first", the
learner's way since 2026-12-04). One JSON line: bytes and the median push's phase times of each, and the
merged / adapter ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp
from torch import nn

from asyncrl.engine.torch.adapter_merge import AdapterMerge, LoraSpec, merge

from asyncrl.engine.protocol import EngineStats
from asyncrl.weights.bucket import iter_buckets
from asyncrl.weights.group import WeightGroup, connect_store, host_store
from asyncrl.weights.receiver import WeightReceiver
from asyncrl.weights.sender import WeightSender
from bench import provenance

SHAPES = {  # name -> (hidden, layers, intermediate, vocab)
    "tiny": (128, 2, 384, 1024),
    "0.5b": (896, 24, 4864, 151936),
    "1.5b": (1536, 28, 8960, 151936),
}


def named_shapes(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    h, layers, inter, vocab = SHAPES[shape]
    kv = h // 7 if shape != "tiny" else h // 2  # 2 KV heads of a 14/12-head model, roughly
    out = [("model.embed_tokens.weight", (vocab, h)), ("model.norm.weight", (h,))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h)),
                (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                (p + "mlp.down_proj.weight", (h, inter)), (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,))]
    return out


class SinkEngine:
    """The receiving side's model: preallocated parameters that each update copies into (bench.nccl_diag
    uses it too)."""

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        self.params = params
        self.weight_version = 0
        self.updates = 0

    def pause(self, mode: str) -> list:
        return []

    def resume(self) -> None: ...

    def begin_weight_update(self) -> None: ...

    def load_weights(self, named) -> None:
        items = list(named)  # as the torch engine loads: one multi-tensor copy
        torch._foreach_copy_([self.params[n] for n, _ in items], [t for _, t in items])

    def end_weight_update(self, version: int) -> None:
        self.weight_version = version
        self.updates += 1

    def receiving_ranks(self) -> int:
        return 1

    def stats(self) -> EngineStats:
        return EngineStats(running=0, waiting=0, tokens_generated=0, weight_version=self.weight_version)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SCALE = 2.0  # alpha = 2 r


def sink_model(shape: str, device: str, dtype: torch.dtype) -> nn.Module:
    """The shape's parameters under their HF names, the projections as nn.Linear (what AdapterMerge looks for)."""
    root = nn.Module()
    for name, size in named_shapes(shape):
        path, _, leaf = name.rpartition(".")
        owner = root
        for i, part in enumerate(parts := path.split(".")):
            if not hasattr(owner, part):
                last = i == len(parts) - 1 and part in LORA_TARGETS
                owner.add_module(part, nn.utils.skip_init(nn.Linear, size[1], size[0], bias=False, device=device,
                                                          dtype=dtype) if last else nn.Module())
            owner = getattr(owner, part)
        if not hasattr(owner, leaf):
            owner.register_parameter(leaf, nn.Parameter(torch.empty(size, device=device, dtype=dtype)))
    return root.requires_grad_(False)


class LoraSinkEngine(SinkEngine):
    """A SinkEngine whose updates from `adapters_from` on are adapter-only: merged from a pristine base by
    AdapterMerge, as the torch engine does."""

    def __init__(self, model: nn.Module, adapters_from: int) -> None:
        super().__init__(dict(model.named_parameters()))
        self.model, self.adapters_from = model, adapters_from
        self.merge = AdapterMerge(model, LoraSpec(LORA_TARGETS, LORA_SCALE))

    def load_weights(self, named) -> None:
        items = list(self.merge.take(named) if self.updates >= self.adapters_from else named)
        if items:  # an adapter bucket leaves nothing for the model itself
            super().load_weights(items)

    def end_weight_update(self, version: int) -> None:
        if self.updates >= self.adapters_from:
            self.merge.apply(self.model)
        super().end_weight_update(version)


def lora_receiver_main(endpoint: str, device: str, shape: str, dtype: str, pushes: int) -> None:
    engine = LoraSinkEngine(sink_model(shape, device, getattr(torch, dtype)), adapters_from=pushes)
    rx = WeightReceiver(endpoint, "bench-generator", device, engine)
    deadline = time.monotonic() + 600
    while engine.updates < 3 * pushes and time.monotonic() < deadline:
        rx.poll(0.05)
    rx.close()


def lora_adapters(weights: list[tuple[str, torch.Tensor]], rank: int) -> dict[str, torch.Tensor]:
    """fp32 A [r, in], B [out, r] beside every projection (the learner's masters)."""
    out = {}
    for name, w in weights:
        path = name.rpartition(".")[0]
        if path.rsplit(".", 1)[-1] in LORA_TARGETS:
            out[f"{path}.lora_A"] = torch.randn(rank, w.shape[1], device=w.device) / w.shape[1] ** 0.5
            out[f"{path}.lora_B"] = torch.randn(w.shape[0], rank, device=w.device) * 1e-3
    return out


def merged_stream(weights: list[tuple[str, torch.Tensor]], adapters: dict[str, torch.Tensor]):
    """The merged push's stream, as lora.merged_tensors makes it (cast here to the generators' dtype)."""
    for name, w in weights:
        path = name.rpartition(".")[0]
        if f"{path}.lora_A" in adapters:
            yield name, merge(w, adapters[f"{path}.lora_A"], adapters[f"{path}.lora_B"], LORA_SCALE).to(w.dtype)
        else:
            yield name, w


def lora_main(args, learner_dev: str, gen_dev: str, path: str, dtype: str, gpus: int) -> None:
    """Merged vs adapter-only LoRA pushes to one generator, in one run (module docstring)."""
    torch.manual_seed(0)
    weights = [(n, torch.randn(s, device=learner_dev, dtype=getattr(torch, dtype)) * 0.02)
               for n, s in named_shapes(args.shape)]
    adapters = lora_adapters(weights, args.lora_rank)
    sender = WeightSender("tcp://127.0.0.1:0", device=learner_dev, bucket_bytes=args.bucket_mb << 20, timeout_s=120,
                          window=args.window)  # dtype None: each stream is in the dtype it travels in
    pushes = args.pushes + 1  # the first of each kind is a warm-up
    proc = mp.get_context("spawn").Process(target=lora_receiver_main,
                                           args=(sender.endpoint, gen_dev, args.shape, dtype, pushes))
    proc.start()
    sender.wait_for_joins(1, 120)
    sender.serve_joins(lambda: iter(()), 0)
    merged = [sender.push(merged_stream(weights, adapters), v).as_dict() for v in range(1, pushes + 1)]
    adapter = [sender.push(iter(adapters.items()), v, admit=False).as_dict() for v in range(pushes + 1, 2 * pushes + 1)]
    first = [sender.push(iter(adapters.items()), v, admit=False, gather_first=True).as_dict()
             for v in range(2 * pushes + 1, 3 * pushes + 1)]  # packed before the generator pauses (the learner's way)
    sender.close()
    proc.join(120)

    def median(reports: list[dict]) -> dict:
        mid = sorted(reports[1:], key=lambda r: r["total_s"])[len(reports[1:]) // 2]
        assert mid["generators"] == ["bench-generator"], mid
        return {k: v for k, v in mid.items() if k == "bytes" or k.endswith("_s")}

    m, a, f = median(merged), median(adapter), median(first)
    params = sum(t.numel() for _, t in weights)
    commit = provenance.commit()
    print(json.dumps({
        "bench": "weight_sync_lora", "path": path, "shape": args.shape, "params": params, "dtype": dtype,
        "lora_rank": args.lora_rank, "targets": list(LORA_TARGETS), "bucket_mb": args.bucket_mb,
        "merged": m, "adapter": a, "adapter_gather_first": f, "bytes_ratio": round(m["bytes"] / a["bytes"], 1),
        "total_s_ratio": round(m["total_s"] / a["total_s"], 1),
        "paused_s_ratio": round(m["paused_s"] / a["paused_s"], 1),
        "pushes": args.pushes, "device": torch.cuda.get_device_name(0) if gpus else "cpu", "gpus": gpus,
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "commit": commit,
    }))


def receiver_main(endpoint: str, device: str, shape: str, dtype: str, pushes: int, ref: tuple[int, int, str]) -> None:
    engine = SinkEngine({n: torch.empty(s, device=device, dtype=getattr(torch, dtype)) for n, s in named_shapes(shape)})
    rx = WeightReceiver(endpoint, "bench-generator", device, engine)
    deadline = time.monotonic() + 600
    while engine.updates < pushes and time.monotonic() < deadline:
        rx.poll(0.05)
    rx.close()
    port, sizes, backend = ref
    if port:  # the raw reference transfers: the mirror of reference_broadcast
        group = WeightGroup(connect_store("127.0.0.1", port, 2, 60), group_name="ref", rank=1, world_size=2,
                            backend=backend, timeout_s=60)
        for layout in (sizes, [sum(sizes)]):
            bufs = [torch.empty(n, dtype=torch.uint8, device=device) for n in layout]
            for _ in range(6):
                for work in [group.broadcast(b) for b in bufs]:
                    group.wait(work, 60)
        group.close()


def reference_broadcast(store, sizes: list[int], device: str, backend: str) -> dict[str, float]:
    """Raw broadcasts of the push's bytes with no control messages, in GB/s: the push's bucket sizes posted
    back to back ("buckets"), and all bytes as one broadcast ("one")."""
    group = WeightGroup(store, group_name="ref", rank=0, world_size=2, backend=backend, timeout_s=60)
    out = {}
    for name, layout in (("buckets", sizes), ("one", [sum(sizes)])):
        bufs = [torch.empty(n, dtype=torch.uint8, device=device) for n in layout]
        times = []
        for rep in range(6):  # the first is a warm-up
            t0 = time.perf_counter()
            for work in [group.broadcast(b) for b in bufs]:
                group.wait(work, 60)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out[name] = sum(layout) / statistics.median(times[1:]) / 1e9
    group.close()
    return out


def bucket_sizes(weights: list[tuple[str, torch.Tensor]], bucket: int, dtype: torch.dtype) -> list[int]:
    """The byte size of each bucket the push sends (the same bucketing)."""
    return [layout.nbytes for _, layout in iter_buckets(weights, bucket, dtype=dtype)]


def copy_bandwidth(nbytes: int, device: str) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * nbytes * 10 / (time.perf_counter() - t0) / 1e9  # read + write, like the rest of this repo


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.weight_sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b" if torch.cuda.is_available() else "tiny")
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--window", type=int, default=3, help="buckets in flight per push (WeightSender.window)")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: LoRA's merged vs adapter-only pushes (docstring)")
    args = p.parse_args(argv)
    gpus = torch.cuda.device_count()
    learner_dev, gen_dev = ("cuda:0", "cuda:1") if gpus >= 2 else ("cuda:0", "cuda:0") if gpus == 1 else ("cpu", "cpu")
    path = "nccl" if gpus >= 2 else "cuda_ipc" if gpus == 1 else "gloo"
    dtype = "bfloat16" if gpus else "float32"
    bucket = args.bucket_mb << 20
    ref_backend = {"nccl": "nccl", "gloo": "gloo"}.get(path)
    if args.lora_rank > 0:
        return lora_main(args, learner_dev, gen_dev, path, dtype, gpus)
    torch.manual_seed(0)
    weights = [(n, torch.randn(s, device=learner_dev, dtype=getattr(torch, dtype)) * 0.02) for n, s in named_shapes(args.shape)]
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    ref_sizes = bucket_sizes(weights, bucket, getattr(torch, dtype))
    ref_store = host_store("127.0.0.1", 2, 60) if ref_backend else None
    sender = WeightSender("tcp://127.0.0.1:0", device=learner_dev, bucket_bytes=bucket, timeout_s=120,
                          window=args.window)
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=receiver_main, args=(sender.endpoint, gen_dev, args.shape, dtype, args.pushes + 1,
                                                   (ref_store.port if ref_store else 0, ref_sizes, ref_backend or "")))
    proc.start()
    sender.wait_for_joins(1, 120)
    reports = [sender.push(iter(weights), v).as_dict() for v in range(1, args.pushes + 2)]
    sender.close()
    refs = (reference_broadcast(ref_store, ref_sizes, learner_dev, ref_backend) if ref_store
            else {"one": copy_bandwidth(nbytes, learner_dev)})
    ref = max(refs.values())  # the stricter reference
    proc.join(120)
    timed = sorted(reports[1:], key=lambda r: r["total_s"])
    mid = timed[len(timed) // 2]
    gbps = nbytes / mid["total_s"] / 1e9
    commit = provenance.commit()
    print(json.dumps({
        "bench": "weight_sync", "path": path, "shape": args.shape, "dtype": dtype, "bytes": nbytes,
        "bucket_mb": args.bucket_mb, "push_gbps": round(gbps, 3), "reference_gbps": round(ref, 3),
        "fraction_of_reference": round(gbps / ref, 3),
        "references_gbps": {k: round(v, 3) for k, v in refs.items()}, "window": args.window, "median_push": {k: v for k, v in mid.items() if k.endswith("_s")},
        "pushes": args.pushes, "device": torch.cuda.get_device_name(0) if gpus else "cpu", "gpus": gpus,
        "torch": torch.__version__, "commit": commit,
    }))


if __name__ == "__main__":
    sys.exit(main())
