"""Where a prefill step's GPU time goes: one chunk of `--batch` prompts x `--prompt-len` tokens (one
engine step, each prompt sampling one token) run `--repeats` times under torch.profiler, kernels grouped
by family as in `bench.decode_kernels`, microseconds per prefill step (one JSON line).

Also reports the step's wall time unprofiled (median of `--repeats`) and the TFLOP/s that the matmuls of
the step need at that time (2 x non-embedding params x tokens; attention's own FLOPs are left out, so the
figure is a floor).

    python -m bench.prefill_kernels [--shape 0.5b --batch 64 --prompt-len 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.decode_kernels import kernel_table, summary
from bench.generation import add_prompts, build_hf, make_engine, prompts, require_cuda
from bench.provenance import commit


def prefill_once(eng, batch_prompts: list[list[int]], tag: str) -> float:
    """Add the prompts (one new token each) and step until done -> wall seconds (synchronised)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    add_prompts(eng, batch_prompts, 1, tag=f"{tag}-")
    while eng.has_work():
        eng.step()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace", default="", help="also keep the profiled run's Chrome trace (host ops included) here, "
                        "for bench.trace_gaps")
    args = parser.parse_args()
    require_cuda("bench.prefill_kernels")
    from torch.profiler import ProfilerActivity, profile

    tokens = args.batch * args.prompt_len
    hf = build_hf(args.shape, args.prompt_len + 64)
    params = sum(p.numel() for n, p in hf.named_parameters() if "embed_tokens" not in n)
    eng = make_engine(hf, args.batch, args.prompt_len + 64, max_prefill_tokens=tokens)
    batch_prompts = prompts(args.batch, args.prompt_len, seed=1)
    for i in range(3):
        prefill_once(eng, batch_prompts, f"warm{i}")
    walls = [prefill_once(eng, batch_prompts, f"timed{i}") for i in range(args.repeats)]
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.trace else [])
    with profile(activities=activities) as prof:
        for i in range(args.repeats):
            prefill_once(eng, batch_prompts, f"prof{i}")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        rows, busy, span = kernel_table(path, args.repeats)
        if args.trace:
            path.replace(args.trace)
    eng.close()
    wall = statistics.median(walls)
    print(json.dumps({
        "bench": "prefill_kernels", "shape": args.shape, "batch": args.batch, "prompt_len": args.prompt_len,
        "tokens": tokens, "wall_ms": round(1e3 * wall, 2), "prefill_tok_s": round(tokens / wall),
        "matmul_tflops": round(2 * params * tokens / wall / 1e12, 1), "kernels": summary(rows, busy, span, args.top),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit(),
    }), flush=True)


if __name__ == "__main__":
    main()
