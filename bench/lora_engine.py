"""The torch engine's two ways to apply LoRA pushes, side by side in one process (`generator.lora_apply`): what a
push stops the engine for, and what a decode step costs, merge against unmerged, with no LoRA as the baseline.

    python -m bench.lora_engine --shape 0.5b --rank 64                 # a GPU: bf16, CUDA graphs
    python -m bench.lora_engine --model DIR --rank 64 --batch 128      # a folder, e.g. bench.make_model --shape 7b
    python -m bench.lora_engine --shape tiny --batch 4 --prompt-len 8 --output-len 8 --pushes 2   # CPU (CI)

Three engines load one model folder (`--shape` draws one with bench.make_model): no LoRA, "merge" (W = W0 + scale
* B @ A into the weights at each push, from a kept W0) and "unmerged" (the adapters beside each projection). The
two LoRA engines get the same random adapters for every projection (fp32, as the learner sends them), packed into
buckets once beforehand, so a timed push is the receiving side's part only: begin_weight_update, load_weights of
each bucket's views, end_weight_update and a device synchronize (what the push queued, the merges included): what
the generator is paused for, less the transfer. Decode: each engine generates `--batch` x `--output-len` tokens
(EOS ignored) from the same prompts, the three interleaved, `--repeats` times: tokens/s over a run, and the median
decode-only step. One JSON line; the ratios to quote are `unmerged_over_merge` (push time, decode step) and
`unmerged_over_none` (decode step: what keeping the adapters apart costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench import provenance
from bench.generation import prompts, run_engine, sync
from bench.make_model import SHAPES, Shape, make_model

MODES = ("none", "merge", "unmerged")
TINY = Shape(64, 2, 4, 2, 128, max_positions=1024)  # CPU: keeps the bench alive in CI


def build(model: str, mode: str, rank: int, alpha: float, batch: int, max_len: int, device: str, dtype: str):
    from asyncrl.engine.torch.adapter_merge import LoraSpec
    from asyncrl.engine.torch.block_manager import blocks_for
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.learner.config import DEFAULT_LORA_TARGETS

    lora = None if mode == "none" else LoraSpec(DEFAULT_LORA_TARGETS, alpha / rank, rank, mode)
    blocks = batch * blocks_for(max_len, 16) + 64
    return TorchEngine(model, device=device, dtype=dtype, max_running=batch, num_kv_blocks=blocks,
                       kv_block_size=16, max_model_len=max_len, max_prefill_tokens=16384, lora=lora)


def adapter_buckets(engine, rank: int, seed: int = 0) -> list[tuple[torch.Tensor, list]]:
    """Random fp32 adapters for every target of `engine` (a merging one), packed as WeightSender packs a push."""
    from asyncrl.weights.bucket import DEFAULT_BUCKET_BYTES, iter_buckets

    g = torch.Generator(device=engine.device).manual_seed(seed)
    named = []
    for path in sorted(engine.adapters.targets):
        out, cols = engine.model.get_submodule(path).weight.shape
        named.append((f"{path}.lora_A", torch.randn(rank, cols, device=engine.device, generator=g) / cols ** 0.5))
        named.append((f"{path}.lora_B", torch.randn(out, rank, device=engine.device, generator=g) * 0.01))
    return [(flat.clone(), layout) for flat, layout in iter_buckets(named, DEFAULT_BUCKET_BYTES, engine.device, None)]


def timed_push(engine, buckets, version: int) -> float:
    """Milliseconds of the receiving side of one push (module docstring)."""
    from asyncrl.engine.bucket_layout import unflatten

    engine.pause("continue")
    sync(engine.device)
    t0 = time.perf_counter()
    engine.begin_weight_update()
    for flat, layout in buckets:
        engine.load_weights(unflatten(flat, layout))
    engine.end_weight_update(version)
    sync(engine.device)
    ms = (time.perf_counter() - t0) * 1e3
    engine.resume()
    return ms


def decode(engine, batch_prompts, output_len: int) -> dict:
    wall, outs, steps = run_engine(engine, batch_prompts, output_len)
    assert sum(len(o.token_ids) for o in outs) == len(batch_prompts) * output_len
    return {"tok_s": len(batch_prompts) * output_len / wall, "step_ms": 1e3 * steps["decode_s"] / steps["decode_steps"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder (default: draw --shape with bench.make_model)")
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES) + ["tiny"])
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    if args.rank < 1 or min(args.batch, args.prompt_len, args.output_len, args.pushes, args.repeats) < 1:
        p.error("--rank, --batch, --prompt-len, --output-len, --pushes and --repeats must be >= 1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(make_model(TINY if args.shape == "tiny" else args.shape, Path(tmp) / "model"))
        result = run(args, model, device, dtype)
    print(json.dumps(result), flush=True)
    return result


def run(args: argparse.Namespace, model: str, device: str, dtype: str) -> dict:
    max_len = args.prompt_len + args.output_len
    engines = {m: build(model, m, args.rank, args.alpha, args.batch, max_len, device, dtype) for m in MODES}
    buckets = adapter_buckets(engines["merge"], args.rank)
    push_ms: dict[str, list[float]] = {"merge": [], "unmerged": []}
    for version in range(args.pushes + 1):  # the first push of each warms it up and is not counted
        for mode in push_ms:
            ms = timed_push(engines[mode], buckets, version + 1)
            if version:
                push_ms[mode].append(ms)
    batch_prompts = prompts(args.batch, args.prompt_len, seed=1)
    for eng in engines.values():  # warm-up: graphs, kernels, allocator
        decode(eng, batch_prompts[: max(1, args.batch // 4)], min(args.output_len, 16))
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.repeats):
        for mode, eng in engines.items():
            runs[mode].append(decode(eng, batch_prompts, args.output_len))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("tok_s", "step_ms")} for m, rs in runs.items()}
    push = {m: statistics.median(v) for m, v in push_ms.items()}
    return {
        "bench": "lora_engine", "model": args.model or args.shape, "rank": args.rank, "batch": args.batch,
        "prompt_len": args.prompt_len, "output_len": args.output_len, "device": _device_name(device),
        "dtype": dtype, "torch": torch.__version__, "commit": provenance.commit(provenance.HERE),
        "date": time.strftime("%Y-%m-%d"),
        "push_ms": {m: round(v, 3) for m, v in push.items()},
        "push_runs_ms": {m: [round(x, 3) for x in v] for m, v in push_ms.items()},
        "pristine_bytes": {m: engines[m].adapters.pristine_bytes for m in push_ms},
        "decode": {m: {k: round(v, 3) for k, v in d.items()} for m, d in med.items()},
        "decode_runs_tok_s": {m: [round(r["tok_s"], 1) for r in rs] for m, rs in runs.items()},
        "unmerged_over_merge": {"push": _ratio(push["unmerged"], push["merge"]),
                                "step": _ratio(med["unmerged"]["step_ms"], med["merge"]["step_ms"])},
        "unmerged_over_none": {"step": _ratio(med["unmerged"]["step_ms"], med["none"]["step_ms"])},
    }


def _ratio(num: float, den: float) -> float:
    """num / den to three significant figures: an unmerged push can be 100x faster than a merge, and three decimals
    would keep one digit of that ratio."""
    return float(f"{num / den:.3g}")


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


if __name__ == "__main__":
    main()
