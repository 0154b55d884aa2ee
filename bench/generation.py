"""Generation throughput: the built-in torch engine against plain Hugging Face `generate`.

Both run the same random-initialised model (the engine shares the HF model's tensors) on the same
random prompts, in one process, seeded and warmed up. One JSON line per (shape, batch):

    python -m bench.generation                                  # all shapes, batch 64 and 256
    python -m bench.generation --shapes 0.5b --batches 256      # the headline case only
    python -m bench.generation --skip-hf                        # engine only (no ratio)
    python -m bench.generation --weights-dtypes model,fp8       # bf16 and FP8 rollouts in one run
    python -m bench.generation --rl --shapes 0.5b               # the RL-shaped case (bench/rl_workload.py)
    python -m bench.generation --rl --shapes tiny --rl-groups 2 --rl-n 4 --prompt-len 32 --rl-max-new 48   # CPU

The RL-shaped case: 32 prompts x 8 samples of 512-token prompts (shared within a group) and responses of
at most 1,024 tokens ending at random lengths. Both sides are credited with the same useful tokens (the
samples' lengths); HF `generate` runs its batch until the longest sample ends, as it does with EOS.
It runs on CPU too (the tiny shape, fp32), which is how CI keeps it alive.

tokens/s counts output tokens over the whole run (prefill included) for both. `roofline_frac` is,
over the engine's decode-only steps, (weight bytes + KV bytes read per step) / copy bandwidth
measured in the same run, divided by the measured step time.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time

import numpy as np
import torch

from bench import provenance
from bench.decode_step import copy_bandwidth, graph_times, profile_parts, refresh_ms, weight_bytes

SHAPES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128},
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864},
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960},
}
VOCAB = 151936


def build_hf(shape: str, max_len: int, seed: int = 0, init_std: float = 0.02, dtype: torch.dtype = torch.bfloat16,
             device: str = "cuda"):
    import transformers

    config = transformers.Qwen2Config(
        **SHAPES[shape], vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=max(max_len, 1024),
        initializer_range=init_std, eos_token_id=151643, bos_token_id=151643, pad_token_id=151643,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config)
    # Parameters in `dtype`, buffers (the rotary's inv_freq) kept fp32, as `from_pretrained(dtype=...)` leaves
    # them: `.to(dtype)` would round the rotary frequencies, and the learner, which loads a saved folder with
    # from_pretrained, would then run another position encoding than the engine built from this model.
    for param in model.parameters():
        param.data = param.data.to(dtype)
    return model.eval()


def make_engine(hf, batch: int, max_len: int, kv_sequences: int = 0, **options):
    """`kv_sequences`: KV room for that many sequences of `max_len` (0: `batch`)."""
    from asyncrl.engine.torch.block_manager import blocks_for
    from asyncrl.engine.torch.model import build_from_hf
    from asyncrl.engine.torch.engine import TorchEngine

    options = {"max_prefill_tokens": 16384, "kv_block_size": 16, **options}
    blocks = (kv_sequences or batch) * blocks_for(max_len, options["kv_block_size"]) + 64
    return TorchEngine.from_model(
        build_from_hf(hf), max_running=batch, num_kv_blocks=blocks, max_model_len=max_len, **options,
    )


def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g).tolist()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def add_prompts(eng, batch_prompts, output_len: int | list[int], tag: str = "r", temperature: float = 1.0) -> None:
    """One request per prompt (ids `{tag}{i}`, EOS ignored). `output_len`: for every prompt, or one per prompt."""
    from asyncrl.engine.protocol import GenerationRequest
    from asyncrl.records import SamplingParams

    lengths = output_len if isinstance(output_len, list) else [output_len] * len(batch_prompts)
    for i, (p, length) in enumerate(zip(batch_prompts, lengths, strict=True)):
        params = SamplingParams(max_new_tokens=length, temperature=temperature, ignore_eos=True, seed=None)
        eng.add(GenerationRequest(request_id=f"{tag}{i}", prompt_token_ids=np.asarray(p, np.int32), sampling=params))


def run_engine(eng, batch_prompts, output_len: int | list[int], temperature: float = 1.0):
    """-> (wall seconds, outputs, decode-only step stats). `output_len`: for every prompt, or one per prompt."""
    sync(eng.device)
    start = time.perf_counter()
    add_prompts(eng, batch_prompts, output_len, temperature=temperature)
    outs, decode_s, decode_ctx, decode_steps = [], 0.0, [], 0
    while eng.has_work():
        prefills = eng.counters["prefills"]
        ctx = sum(s.num_tokens for s in eng.scheduler.running)
        t0 = time.perf_counter()
        outs += eng.step()
        dt = time.perf_counter() - t0
        if eng.counters["prefills"] == prefills:  # decode-only step
            decode_s += dt
            decode_steps += 1
            decode_ctx.append(ctx)
    wall = time.perf_counter() - start
    return wall, outs, {"decode_s": decode_s, "decode_steps": decode_steps, "ctx_tokens": decode_ctx}


def run_hf(hf, batch_prompts, output_len: int) -> float:
    """Seconds for HF `generate` to sample exactly `output_len` tokens per row (a random model's EOS would end
    rows early)."""
    ids = torch.tensor(batch_prompts, device=hf.device)
    sync(ids.device)
    start = time.perf_counter()
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                      max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0)
    sync(ids.device)
    assert out.shape[1] == ids.shape[1] + output_len
    return time.perf_counter() - start


def bench_case(
    shape: str, batch: int, prompt_len: int, output_len: int, bw: float, skip_hf: bool, profile: bool = False,
    deterministic: bool = False, overlap: bool | None = None, trace: str = "", max_prefill_tokens: int = 16384,
    kv_block_size: int = 16, dtype: str = "bfloat16", residual_fp32: bool = False, logits_fp32: bool = False,
    weights_dtype: str = "model",
) -> dict:
    max_len = prompt_len + output_len + 16
    hf = build_hf(shape, max_len, dtype=getattr(torch, dtype))
    eng = make_engine(hf, batch, max_len, deterministic=deterministic, overlap=overlap,
                      max_prefill_tokens=max_prefill_tokens, kv_block_size=kv_block_size, residual_fp32=residual_fp32,
                      logits_fp32=logits_fp32, weights_dtype=weights_dtype)
    kv_per_token = 2 * eng.arch.num_layers * eng.arch.num_kv_heads * eng.arch.head_dim * 2
    run_engine(eng, prompts(batch, prompt_len, seed=1), 8)  # warm-up: prefill shapes, graphs, kernels
    wall, outs, dec = run_engine(eng, prompts(batch, prompt_len, seed=2), output_len)
    assert len(outs) == batch and all(len(o.token_ids) == output_len for o in outs)
    wbytes = weight_bytes(eng.model, eng.fp8)
    ideal = sum(wbytes + ctx * kv_per_token for ctx in dec["ctx_tokens"]) / bw
    row = {
        "bench": "generation", "shape": shape, "batch": batch, "prompt_len": prompt_len, "output_len": output_len,
        "dtype": dtype, "weights_dtype": weights_dtype, "residual_fp32": residual_fp32,
        "logits_fp32": logits_fp32, "engine_tok_s": round(batch * output_len / wall, 1), "engine_wall_s": round(wall, 3),
        "decode_step_ms": round(1e3 * dec["decode_s"] / max(dec["decode_steps"], 1), 3),
        "other_steps_s": round(wall - dec["decode_s"], 3),  # the steps with a prefill, and the last read-back
        "roofline_frac": round(ideal / dec["decode_s"], 3) if dec["decode_s"] else None,
        "weight_bytes": wbytes, "copy_bw_GBs": round(bw / 1e9, 1), "deterministic": deterministic,
        "overlap": eng.overlap, "max_prefill_tokens": max_prefill_tokens, "kv_block_size": kv_block_size,
    }
    replay_run = functools.partial(run_engine, eng, prompts(batch, prompt_len, seed=5), output_len)
    row.update(graph_times(eng, replay_run, batch))
    if eng.fp8 is not None:
        row["fp8_refresh_ms"] = refresh_ms(eng)
    if profile:
        row.update(profile_parts(eng, batch, prompt_len + output_len // 2))
    if trace:
        trace_run(eng, prompts(batch, prompt_len, seed=4), output_len, trace)
    eng.close()
    del eng
    if not skip_hf:
        run_hf(hf, prompts(batch, 16, seed=3), 4)  # warm-up
        hf_wall = run_hf(hf, prompts(batch, prompt_len, seed=2), output_len)
        row["hf_tok_s"] = round(batch * output_len / hf_wall, 1)
        row["speedup"] = round(row["engine_tok_s"] / row["hf_tok_s"], 2)
    row.update(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=provenance.commit())
    del hf
    torch.cuda.empty_cache()
    return row


def trace_run(eng, batch_prompts, output_len: int, path: str) -> None:
    """One more run under torch.profiler (host ops and device kernels) -> a Chrome trace at `path`
    (read it with bench.trace_gaps, or chrome://tracing). Not timed: the profiler slows the host."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_engine(eng, batch_prompts, output_len)
    prof.export_chrome_trace(path)


def rl_case(shape: str, groups: int, n: int, prompt_len: int, max_new: int, skip_hf: bool,
            weights_dtype: str = "model") -> dict:
    """The RL-shaped case: engine and HF `generate` on the same RLWorkload, credited with its useful tokens."""
    from bench.rl_workload import rl_workload

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    work = rl_workload(groups, n, prompt_len, max_new, VOCAB, seed=2)
    hf = build_hf(shape, prompt_len + max_new + 16, dtype=dtype, device=device)
    eng = make_engine(hf, groups * n, prompt_len + max_new + 16, weights_dtype=weights_dtype)
    warm = rl_workload(groups, n, prompt_len, min(max_new, 8), VOCAB, seed=1)
    run_engine(eng, warm.prompts, warm.lengths)
    wall, outs, _ = run_engine(eng, work.prompts, work.lengths)
    assert sorted(len(o.token_ids) for o in outs) == sorted(work.lengths)
    eng.close()
    row = {"bench": "generation", "case": "rl", "shape": shape, **work.summary(), "dtype": str(dtype).split(".")[1],
           "weights_dtype": weights_dtype, "engine_tok_s": round(work.useful_tokens / wall, 1), "engine_wall_s": round(wall, 3)}
    if not skip_hf:
        run_hf(hf, [p[:16] for p in work.prompts], 4)  # warm-up
        hf_wall = run_hf(hf, work.prompts, max(work.lengths))  # the batch runs until its longest row ends
        row.update(hf_tok_s=round(work.useful_tokens / hf_wall, 1), hf_wall_s=round(hf_wall, 3),
                   speedup=round(hf_wall / wall, 2))
    row.update(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
               commit=provenance.commit())
    return row


def require_cuda(bench: str) -> None:
    """GPU-only benches: one line and exit 2 on a host without CUDA (not an assertion deep inside)."""
    if not torch.cuda.is_available():
        print(f"{bench} measures the CUDA engine and needs a GPU; this host has none (run it on a GPU host)",
              file=sys.stderr)
        raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="0.5b,1.5b", help="comma list of " + ",".join(SHAPES))
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--skip-hf", action="store_true", help="engine only")
    parser.add_argument("--profile", action="store_true", help="also time the decode step's parts")
    parser.add_argument("--deterministic", action="store_true",
                        help="the engine's deterministic mode (each group prefills alone, fixed decode batch)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="synchronous decode (the engine's overlapped decode is on by default on GPU)")
    parser.add_argument("--max-prefill-tokens", type=int, default=16384, help="the engine's prefill chunk")
    parser.add_argument("--kv-block-size", type=int, default=16, help="the engine's KV page (tokens)")
    parser.add_argument("--trace", default="", help="also write a torch.profiler Chrome trace of one more run here")
    parser.add_argument("--rl", action="store_true", help="the RL-shaped case instead (prompt-len default 512)")
    parser.add_argument("--rl-groups", type=int, default=32)
    parser.add_argument("--rl-n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--rl-max-new", type=int, default=1024)
    parser.add_argument("--pdl", default="", help="comma list of programmatic dependent launch settings to run in "
                        "turn (kernels.ops.PDL: 0 off, 1 on); default: the engine's")
    parser.add_argument("--dtypes", default="bfloat16", help="comma list of model dtypes to run in turn "
                        "(bfloat16, float16)")
    parser.add_argument("--weights-dtypes", default="model", help="comma list of generator.weights_dtype settings "
                        "to run in turn (model, fp8); Hugging Face runs once, beside the first")
    parser.add_argument("--fp8-fused", default="1", help="comma list of 0/1: fp8 inputs quantized inside the norm "
                        "and SiLU kernels (model/fp8.py FUSE_INPUTS), for the fp8 runs, in turn")
    parser.add_argument("--residual-fp32", default="0", help="comma list of 0/1: model.residual_fp32 settings "
                        "to run in turn")
    parser.add_argument("--logits-fp32", default="0", help="comma list of 0/1: model.logits_fp32 settings "
                        "to run in turn")
    parser.add_argument("--repeats", type=int, default=1, help="run each case this many times (modes alternating)")
    args = parser.parse_args()
    if args.rl:
        if args.shapes != "tiny":
            require_cuda("bench.generation --rl (shapes other than tiny)")
        prompt_len = args.prompt_len if args.prompt_len != 256 else 512
        weights = args.weights_dtypes.split(",")
        for shape, wd in itertools.product(args.shapes.split(","), weights):
            row = rl_case(shape, args.rl_groups, args.rl_n, prompt_len, args.rl_max_new, args.skip_hf or wd != weights[0],
                          wd)
            print(json.dumps(row), flush=True)
        return
    require_cuda("bench.generation")
    from asyncrl.engine.torch import kernels
    from asyncrl.engine.torch.model import fp8

    bw = copy_bandwidth()
    modes = [bool(int(m)) for m in args.pdl.split(",")] if args.pdl else [kernels.ops.PDL]
    residual = [bool(int(r)) for r in args.residual_fp32.split(",")]
    logits32 = [bool(int(r)) for r in args.logits_fp32.split(",")]
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for _ in range(args.repeats):
                weights = [(wd, fused) for wd in args.weights_dtypes.split(",")
                           for fused in ([bool(int(f)) for f in args.fp8_fused.split(",")] if wd == "fp8" else [True])]
                for mode, dtype, r32, l32, (wd, fused) in itertools.product(modes, args.dtypes.split(","), residual,
                                                                            logits32, weights):
                    kernels.ops.PDL = mode
                    fp8.FUSE_INPUTS = fused
                    row = bench_case(shape, batch, args.prompt_len, args.output_len, bw,
                                     args.skip_hf or (wd, fused) != weights[0], args.profile,
                                     args.deterministic, False if args.no_overlap else None, args.trace,
                                     args.max_prefill_tokens, args.kv_block_size, dtype, r32, l32, wd)
                    print(json.dumps({**row, "pdl": mode, **({"fp8_fused": fused} if wd == "fp8" else {})}), flush=True)


if __name__ == "__main__":
    main()
