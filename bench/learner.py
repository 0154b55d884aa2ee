"""Learner throughput: `Trainer.train_step` on a pipeline-shaped batch against plain Hugging Face
forward + backward over the same tokens, in one process, seeded and warmed up. One JSON line:

    python -m bench.learner                          # CPU: the tiny shape, small batch
    python -m bench.learner --shape 0.5b             # GPU: 256 samples of 8 + 256 tokens (32 x 8 x 256)
    python -m bench.learner --shape 1.5b --samples 128
    python -m bench.learner --shape 1.5b --lora-rank 64 0 --skip-hf   # LoRA r64 against full fine-tuning
    python -m bench.learner --model DIR --shape 7b --lora-rank 64 --checkpointing --checkpoint --skip-hf

The batch is what the hub hands the learner for `--samples` samples in groups of 8: prompts of
`--prompt-len` tokens, responses of `--tokens` tokens, behaviour logprobs near the model's, mixed
rewards. The learner's step is the whole `train_step` (prepare, micro-batches, optimizer step; GRPO,
decoupled off-policy correction, `--micro-batch-tokens` per pack). The baseline is a plain HF model in
the same dtype with `sdpa`, the same sequences as [B, L] batches of about the same tokens per micro-batch,
forward with labels (HF's own loss) and backward, no optimizer step. FLOPs and MFU: bench/flops.py.

`--lora-rank R` trains LoRA adapters of rank R (`learner.lora_rank`; targets and `lora_trainable` at their
defaults) and reports the adapter push's bytes and the learner's side of it (`adapter_gather_ms`: the
trained tensors gathered into one flat device buffer, what a push's buckets are packed from). Several ranks
(`--lora-rank 64 0`: 0 is full fine-tuning) run one after the other, each in a process of its own on the
same model folder, so that each peak memory is its own; then one more line compares them. Memory:
`peak_mem_gib` is torch.cuda.max_memory_allocated over the whole process (loading included: the learner
loads fp32 and, with LoRA, casts the frozen base to bf16 after the move), `step_peak_mem_gib` over the
timed steps alone, `free_mem_gib` torch.cuda.mem_get_info's free after them (the caching allocator's
reserve counts as used). `--checkpoint` times one background checkpoint after the steps: the learner's
stall, the write, and the files' sizes (with LoRA, model.pt holds the adapters and norms only).
`--model DIR` uses a folder made by bench.make_model instead of making one in a temporary folder.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from asyncrl import records

from asyncrl.precision import dtypes
from bench import flops, provenance, trace_gaps

SHAPE_DEFAULTS = {"tiny": (64, 63), "0.5b": (256, 256), "1.5b": (256, 256), "7b": (256, 256)}  # samples, tokens


def model_path(shape: str, work: Path) -> str:
    from asyncrl.task.embedded import embedded_model_path

    if shape == "tiny":
        return str(embedded_model_path())
    from bench.make_model import make_model

    return str(make_model(shape, work / shape))


def make_batch(samples: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> records.Batch:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(max(samples // 8, 1)):
        prompt = records.Prompt(prompt_id=f"b{g}", n=8, token_ids=rng.integers(0, vocab, prompt_len).astype(np.int32),
                                sampling=records.SamplingParams(temperature=1.0, max_new_tokens=response_len))
        scored = []
        for i in range(8):
            sample = records.Sample(
                prompt_id=prompt.prompt_id, sample_index=i, prompt_token_ids=prompt.token_ids,
                response_token_ids=rng.integers(0, vocab, response_len).astype(np.int32),
                logprobs=(-np.log(vocab) + 0.05 * rng.standard_normal(response_len)).astype(np.float32),
                versions=np.zeros(response_len, np.int32), finish_reason=records.FinishReason.LENGTH)
            scored.append(records.ScoredSample(sample=sample, reward=float(i % 2)))
        groups.append(records.Group(prompt=prompt, samples=scored))
    return records.Batch(step=1, policy_version=0, groups=groups)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_learner(path: str, batch: records.Batch, device: torch.device, args: argparse.Namespace, work: Path) -> dict:
    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.trainer import Trainer

    cfg = LearnerConfig(lr=1e-6, micro_batch_tokens=args.micro_batch_tokens, compile=args.compile,
                        attn_implementation=args.attn, activation_checkpointing=args.checkpointing,
                        lora_rank=args.lora_rank[0], **({"lora_alpha": args.lora_alpha} if args.lora_alpha else {}))
    rescorer = None
    if args.deterministic:  # deterministic mode's proximal logprobs: the engine re-scores the batch
        from asyncrl.learner.rescorer import Rescorer

        longest = max(len(g.prompt.token_ids) + len(s.sample.response_token_ids) for g in batch.groups for s in g.samples)
        rescorer = Rescorer(path, device=device, dtype=args.dtype, max_running=args.max_running, max_tokens=longest,
                            residual_fp32=args.residual_fp32, logits_fp32=args.logits_fp32)
    t_load = time.perf_counter()
    trainer = Trainer(cfg, path, device=device, seed=0, rescorer=rescorer, dtype=args.dtype,
                      residual_fp32=args.residual_fp32, logits_fp32=args.logits_fp32)
    out: dict = {"load_s": time.perf_counter() - t_load, "attn": trainer.attn, **memory(device, "load_")}
    times = []
    for i in range(args.warmup + args.steps):
        batch.step = i + 1
        sync(device)
        t0 = time.perf_counter()
        trainer.train_step(batch)
        sync(device)
        times.append(time.perf_counter() - t0)
        print(f"bench.learner: step {i + 1}/{args.warmup + args.steps} {times[-1]:.2f} s", file=sys.stderr, flush=True)
        if i + 1 == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the timed steps' own peak
    out.update(step_s=float(np.median(times[args.warmup:])), **memory(device, "step_"))
    out["trained_params"] = sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad)
    if trainer.lora:
        out.update(adapter_push(trainer, device))
    if args.checkpoint:
        out.update(checkpoint(trainer, device, work))
    if args.profile:
        profile_step(trainer, batch, device, args.profile)
    del trainer
    return out


def memory(device: torch.device, prefix: str) -> dict:
    """GiB: the peak allocated since the last reset, and (after the steps) the device's free and total memory."""
    if device.type != "cuda":
        return {}
    out = {f"{prefix}peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    if prefix == "step_":
        free, total = torch.cuda.mem_get_info(device)
        out.update(free_mem_gib=free / 2**30, total_mem_gib=total / 2**30,
                   reserved_gib=torch.cuda.memory_reserved(device) / 2**30)
    return out


def adapter_push(trainer, device: torch.device, repeats: int = 5) -> dict:
    """The learner's side of an adapter-only push: every trained tensor (lora.adapter_push: adapters and the
    `lora_trainable` norms, fp32) gathered into one flat device buffer; median ms and its bytes."""
    from asyncrl.learner import lora

    times, nbytes = [], 0
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        flat = torch.cat([t.reshape(-1) for _, t in lora.adapter_push(trainer.masters)])  # [trained numel] fp32
        sync(device)
        times.append(time.perf_counter() - t0)
        nbytes = flat.numel() * flat.element_size()
        del flat
    return {"adapter_gather_ms": float(np.median(times)) * 1e3, "adapter_push_bytes": nbytes}


def checkpoint(trainer, device: torch.device, work: Path) -> dict:
    """Two background checkpoints (buffers reserved first, as the learner service does after step 1), each
    the learner's stall (snapshot to pinned host memory) and its write: one with the state dict gathered by
    `get_state_dict` (`checkpoint_stall_traced_s`, as every save did before the snapshot plan), then one read by
    the plan (`checkpoint_stall_s`, every later save of a run); the files' sizes."""
    trainer.reserve_checkpoint_buffers()
    out = {}
    for name, run in (("_traced", "run-traced"), ("", "run")):
        if name:
            trainer.checkpoints.forget_snapshot()
        sync(device)
        t0 = time.perf_counter()
        trainer.save_checkpoint(work / run, background=True)
        sync(device)
        out[f"checkpoint_stall{name}_s"] = time.perf_counter() - t0
        trainer.checkpoints.wait()
        out[f"checkpoint_write{name}_s"] = time.perf_counter() - t0
    (folder,) = (work / "run" / "checkpoints").glob("step-*")
    out["checkpoint_bytes"] = {f.name: f.stat().st_size for f in folder.iterdir() if f.is_file()}
    return out


def profile_step(trainer, batch: records.Batch, device: torch.device, out: str) -> None:
    """One more step under torch.profiler: where the GPU waited (bench/trace_gaps.py) and the top ops by device
    time (and host time) to `out`; the Chrome trace to `out`.trace.json.gz."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.train_step(batch)
        sync(device)
    events = prof.key_averages()
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    trace = out + ".trace.json"
    prof.export_chrome_trace(trace)
    gaps = trace_gaps.summarize(trace_gaps.load(trace)) if device.type == "cuda" else ""
    with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(trace)
    with open(out, "w") as f:
        f.write(gaps)
        f.write(events.table(sort_by=key, row_limit=40, max_name_column_width=60))
        f.write(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


def time_hf(path: str, batch: records.Batch, device: torch.device, dtype: torch.dtype, args: argparse.Namespace) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).train()
    seqs = [np.concatenate([g.prompt.token_ids, s.sample.response_token_ids[:-1]]) for g in batch.groups for s in g.samples]
    ids = torch.from_numpy(np.stack(seqs).astype(np.int64)).to(device)  # [S, L], equal lengths: no padding
    per_mb = max(args.micro_batch_tokens // ids.shape[1], 1)
    times = []
    for _ in range(args.warmup + args.steps):
        sync(device)
        t0 = time.perf_counter()
        for chunk in ids.split(per_mb):
            model(input_ids=chunk, labels=chunk, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    del model
    return float(np.median(times[args.warmup:]))




def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPE_DEFAULTS), default=None, help="default: 0.5b on GPU, tiny on CPU")
    p.add_argument("--model", metavar="DIR", help="a model folder to use (bench.make_model's); default: made for --shape")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--tokens", type=int, default=None, help="response tokens per sample")
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--attn", default="auto", help="learner.attn_implementation")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing in the learner")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--compile", action="store_true", help="learner.compile (torch.compile per decoder layer)")
    p.add_argument("--lora-rank", type=int, nargs="+", default=[0], metavar="R",
                   help="learner.lora_rank (0: full fine-tuning); several: one process each, then a comparison line")
    p.add_argument("--lora-alpha", type=float, default=None, help="learner.lora_alpha (default: the learner's)")
    p.add_argument("--checkpoint", action="store_true", help="time one background checkpoint after the steps")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic mode: the proximal logprobs re-scored by the torch engine (learner/rescorer.py)")
    p.add_argument("--max-running", type=int, default=256, help="the generators' max_running (--deterministic)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help='model.dtype (auto: bfloat16 on GPU, float32 on CPU); float16 adds dynamic loss scaling')
    p.add_argument("--residual-fp32", action="store_true", help="model.residual_fp32 (the fp32 residual stream)")
    p.add_argument("--logits-fp32", action="store_true", help="model.logits_fp32 (the lm_head's output in fp32)")
    p.add_argument("--profile", metavar="FILE", help="profile one extra step; write the op tables to FILE")
    args = p.parse_args(argv)
    if any(r < 0 for r in args.lora_rank):
        p.error(f"--lora-rank {args.lora_rank}: give ranks >= 0 (0: full fine-tuning)")
    return args


def child_argv(argv: list[str], rank: int, path: str, shape: str) -> list[str]:
    """This command's arguments for one rank on the folder `path`: --lora-rank / --model / --shape replaced."""
    dropped = ("--lora-rank", "--model", "--shape")
    out, dropping = [], False
    for a in argv:
        if a.startswith("-"):
            dropping = a in dropped
            if dropping or a.startswith(tuple(f"{d}=" for d in dropped)):
                continue
        elif dropping:  # a value of a dropped option
            continue
        out.append(a)
    return [*out, "--lora-rank", str(rank), "--model", path, "--shape", shape]


def compare(argv: list[str], args: argparse.Namespace, shape: str) -> None:
    """One process per rank on one model folder, their lines as they come, then a line comparing them."""
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as work:
        path = args.model or model_path(shape, Path(work))
        lines = []
        for rank in args.lora_rank:
            cmd = [sys.executable, "-m", "bench.learner", *child_argv(argv, rank, path, shape)]
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            if done.returncode != 0:
                raise SystemExit(f"bench.learner: --lora-rank {rank} failed (exit {done.returncode})")
            lines.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(lines[-1]), flush=True)
    keys = ("step_s", "peak_mem_gib", "step_peak_mem_gib", "free_mem_gib", "trained_params", "adapter_push_bytes")
    by_rank = {str(line["lora_rank"]): line for line in lines}
    out = {"bench": "learner_lora_compare", "shape": shape, "ranks": args.lora_rank,
           **{k: {r: line.get(k) for r, line in by_rank.items()} for k in keys}}
    if "0" in by_rank and len(by_rank) > 1:
        full = by_rank["0"]
        out["over_full"] = {r: {"step_s": ratio(line["step_s"], full["step_s"]),
                                "peak_mem": ratio(line.get("peak_mem_gib"), full.get("peak_mem_gib"))}
                            for r, line in by_rank.items() if r != "0"}
    print(json.dumps({**out, "commit": provenance.commit(), "date": time.strftime("%Y-%m-%d")}))


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def rounded(values: dict, digits: int = 4) -> dict:
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in values.items()}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    shape = args.shape or ("0.5b" if device.type == "cuda" else "tiny")
    if len(args.lora_rank) > 1:
        return compare(argv, args, shape)
    samples, tokens = SHAPE_DEFAULTS[shape]
    samples, tokens = args.samples or samples, args.tokens or tokens
    dtype = dtypes.torch_dtype(args.dtype, device)  # the learner's, and HF's in the same run
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as work:
        path = args.model or model_path(shape, Path(work))
        from transformers import AutoConfig, AutoModelForCausalLM

        vocab = AutoConfig.from_pretrained(path).vocab_size
        batch = make_batch(samples, args.prompt_len, tokens, vocab)
        seq_lens = [args.prompt_len + tokens - 1] * (len(batch.groups) * 8)
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        step_flops = flops.train_flops(meta, seq_lens)
        learner = time_learner(path, batch, device, args, Path(work))
        hf_s = None if args.skip_hf else time_hf(path, batch, device, dtype, args)
    peak = flops.peak_flops(device)
    n_tokens = sum(seq_lens)
    step_s = learner.pop("step_s")
    print(json.dumps({
        "bench": "learner", "shape": shape, "samples": len(seq_lens), "prompt_len": args.prompt_len,
        "response_len": tokens, "tokens_per_step": n_tokens, "micro_batch_tokens": args.micro_batch_tokens,
        "attn": learner.pop("attn"), "activation_checkpointing": args.checkpointing, "compile": args.compile,
        "deterministic": args.deterministic, "dtype": str(dtype).removeprefix("torch."),
        "residual_fp32": args.residual_fp32, "logits_fp32": args.logits_fp32, "lora_rank": args.lora_rank[0],
        "step_s": round(step_s, 4), "tokens_per_s": round(n_tokens / step_s, 1),
        "tflops_per_s": round(step_flops / step_s / 1e12, 2),  # full fine-tuning's FLOPs, with LoRA too
        "mfu": round(step_flops / step_s / peak, 4) if peak else None,
        "hf_fwd_bwd_s": round(hf_s, 4) if hf_s else None,
        "hf_tokens_per_s": round(n_tokens / hf_s, 1) if hf_s else None,
        "hf_mfu": round(step_flops / hf_s / peak, 4) if peak and hf_s else None,
        "learner_over_hf": round(hf_s / step_s, 3) if hf_s else None,
        "peak_mem_gib": round(max(learner.get("load_peak_mem_gib", 0), learner.get("step_peak_mem_gib", 0)), 2)
        if device.type == "cuda" else None,
        **rounded(learner), "model": path if args.model else None,
        "matmul_params": flops.matmul_params(meta), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "commit": provenance.commit(), "date": time.strftime("%Y-%m-%d"),
    }))


if __name__ == "__main__":
    main()
