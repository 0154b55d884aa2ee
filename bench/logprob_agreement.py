"""Logprob agreement: engine sampling logprobs against a learner-style forward pass.

The engine (bf16, CUDA graphs, fused kernels) generates >= 100k tokens from a random-initialised
Qwen2-0.5B-shape model; the same Hugging Face model then scores prompt + response in one forward
(bf16), log_softmax(logits.float() / T) in fp32, as the learner does. Prints one JSON line with the
mean, p99 and max |delta logp| over all generated tokens.

    python -m bench.logprob_agreement [--prompts 256 --output-len 400 --init-std 0.02]

With --lora-rank R (> 0) the learner side is that model with LoRA as the learner builds it (every projection
targeted, `learner.lora_trainable`'s default norms trained, adapters and norms drawn non-zero:
bench/lora_pushes.py) and scores with its LoraLinear layers unmerged. Two engines start from the base weights;
one gets the adapter push (A, B and the norms, merged by its AdapterMerge), the other the merged push (the
learner's `merged_tensors`); a third gets the adapter push and keeps it unmerged in its matmuls
(`generator.lora_apply = "unmerged"`, adapter_slots.py); each generates from the same prompts with the same seeds.
The JSON line has the agreement of each ("adapter_push", "full_push", "unmerged_push"), the ratios adapter / full
and unmerged / full, whether the first two engines' weights
are equal bit for bit (which parameters differ, if any), and how far the adapters moved the logprobs from the
base model's ("lora_shift_mean_abs"). The tiny shape runs on CPU:

    python -m bench.logprob_agreement --shape tiny --prompts 8 --prompt-len 16 --output-len 48 --lora-rank 8

With --weights-dtype fp8 the model-dtype engine runs first, then FP8 rollouts (generator.weights_dtype, model/fp8.py)
once per --fp8-keep entry, each keeping that set of projections in the model dtype (to see which ones the FP8
mismatch comes from). --cpu runs a --model on the CPU (slow; a 135 M model is fine), where the fp8 products are
computed exactly and summed in fp32:

    python -m bench.logprob_agreement --cpu --model models/SmolLM2-135M-Instruct.Q4_1.gguf --prompts 32 \
        --output-len 48 --weights-dtype fp8 --fp8-keep none,qkv,o_proj,gate_up,down_proj

Results: docs/engine-perf.md (without LoRA, GPU); docs/lora.md (with LoRA: CPU so far, 2026-12-05).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from bench.generation import SHAPES, build_hf, make_engine, prompts, require_cuda, run_engine
from bench.provenance import commit


def learner_logprobs(hf, prompt: list[list[int]], outs, temperature: float, chunk: int,
                     logits_fp32: bool = False) -> torch.Tensor:
    """-> [num_seqs, output_len] fp32 logprobs of the engine's tokens under one HF forward per chunk
    (logits_fp32: the lm_head's fp32 output, as the learner computes it with model.logits_fp32)."""
    from asyncrl.precision.fp32_logits import fp32_logits

    rows = []
    plen = len(prompt[0])
    device = hf.lm_head.weight.device
    for start in range(0, len(outs), chunk):
        part = outs[start : start + chunk]
        resp = torch.tensor([o.token_ids.tolist() for o in part], device=device)
        ids = torch.cat([torch.tensor(prompt[start : start + chunk], device=device), resp], dim=1)
        with torch.no_grad():
            if logits_fp32:
                hidden = hf.model(ids).last_hidden_state[:, plen - 1 : -1]  # [chunk, out_len, H]
                logits = fp32_logits(hidden.flatten(0, 1), hf.lm_head.weight).view(*hidden.shape[:2], -1)
            else:
                logits = hf(ids).logits[:, plen - 1 : -1]  # [chunk, out_len, vocab] bf16
            lp = torch.log_softmax(logits.float() / temperature, dim=-1)
            rows.append(lp.gather(-1, resp[..., None])[..., 0])
    return torch.cat(rows)


def answer_mask(outs, eos, device: torch.device) -> torch.Tensor:
    """[num_seqs, output_len] bool: each response's tokens up to and including its first EOS, the part a run
    without ignore_eos samples (what follows is off the trained model's distribution)."""
    stops = set(eos if isinstance(eos, list) else [eos])
    rows = []
    for o in outs:
        ids = o.token_ids.tolist()
        end = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
        rows.append([i < end for i in range(len(ids))])
    return torch.tensor(rows, device=device)


def trained_case(args: argparse.Namespace, device: str) -> tuple[torch.nn.Module, list[list[int]], int]:
    """(HF model on `device` in --dtype, its task's prompts as token ids, max length) for --model."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.models.config import ModelConfig, resolve_model_path
    from asyncrl.task.arithmetic import make_problem

    path = resolve_model_path(ModelConfig(path=args.model))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(5)
    batch = [tok(make_problem(rng, 2, "+-").text)["input_ids"] for _ in range(args.prompts)]
    width = max(len(p) for p in batch)  # left-pad with the first token so every prompt has one length
    batch = [[p[0]] * (width - len(p)) + p for p in batch]
    positions = hf.config.max_position_embeddings
    return hf, batch, min(width + args.output_len + 16, positions)


def random_case(args: argparse.Namespace, device: str) -> tuple[torch.nn.Module, list[list[int]], int]:
    """(random --shape model on `device` in --dtype, its final norm scaled by --logit-scale, random prompts,
    max length)."""
    max_len = args.prompt_len + args.output_len + 16
    hf = build_hf(args.shape, max_len, init_std=args.init_std, dtype=getattr(torch, args.dtype), device=device)
    with torch.no_grad():
        hf.model.norm.weight.mul_(args.logit_scale)
    return hf, prompts(args.prompts, args.prompt_len, seed=5), max_len


def generate(eng, batch_prompts, args: argparse.Namespace) -> tuple[list, torch.Tensor]:
    """(the engine's outputs in prompt order, their sampling logprobs [num_seqs, output_len]); closes it."""
    _, outs, _ = run_engine(eng, batch_prompts, args.output_len, temperature=args.temperature)
    outs.sort(key=lambda o: int(o.request_id[1:]))
    eng.close()
    return outs, torch.tensor([o.logprobs.tolist() for o in outs])


def agreement(ours: torch.Tensor, ref: torch.Tensor, answered: torch.Tensor | None) -> dict:
    """|delta logp| of the engine's logprobs against the learner's: mean, max, p99 (all tokens; and the answers'
    tokens alone when `answered`), with the learner's mean logprob."""
    delta = (ours.to(ref.device) - ref).abs()
    row = {"mean_abs_delta": delta.mean().item(), "max_abs_delta": delta.max().item(),
           "p99_abs_delta": delta.flatten().float().quantile(0.99).item() if delta.numel() < 2**24 else None,
           "mean_logprob": ref.mean().item()}
    if answered is not None:
        row.update(answer_tokens=int(answered.sum()), answer_mean_abs_delta=delta[answered].mean().item(),
                   answer_p99_abs_delta=delta[answered].float().quantile(0.99).item(),
                   answer_mean_logprob=ref[answered].mean().item())
    return row


def score(hf, batch_prompts, outs, ours, args: argparse.Namespace) -> tuple[dict, torch.Tensor]:
    """(agreement of one engine run against `hf`'s forward, the learner's logprobs)."""
    ref = learner_logprobs(hf, batch_prompts, outs, args.temperature, chunk=16, logits_fp32=args.logits_fp32)
    answered = answer_mask(outs, hf.config.eos_token_id, ref.device) if args.model else None
    return agreement(ours, ref, answered), ref


FP8_PROJECTIONS = {"qkv": ("self_attn", "qkv_fp8"), "o_proj": ("self_attn", "o_fp8"),
                   "gate_up": ("mlp", "gate_up_fp8"), "down_proj": ("mlp", "down_fp8")}


def keep_model_dtype(eng, names: list[str]):
    """The fp8 engine `eng` with the projections `names` (FP8_PROJECTIONS' keys) back in the model dtype in every
    layer (their forwards read the model's own weight when the fp8 image is None)."""
    for layer in eng.model.model.layers:
        for name in names:
            module, attr = FP8_PROJECTIONS[name]
            owner = getattr(layer, module)
            if not hasattr(owner, attr):  # renamed in model/fp8.py: fail here, not keep nothing silently
                raise AttributeError(f"{module}.{attr}: the engine's layers have no such fp8 image")
            setattr(owner, attr, None)
    return eng


def plain_case(hf, batch_prompts, engine, args: argparse.Namespace) -> dict:
    """The engine around `hf`'s own weights against `hf` (with fp8 weights: once per --fp8-keep entry)."""
    if args.weights_dtype == "fp8":
        return fp8_case(hf, batch_prompts, engine, args)
    outs, ours = generate(engine(hf), batch_prompts, args)
    if args.residual_fp32:
        from asyncrl.learner import residual_stream

        residual_stream.install(hf)  # after the engine copied the weights: the scorer's stream is fp32 too
    return score(hf, batch_prompts, outs, ours, args)[0]


def fp8_case(hf, batch_prompts, engine, args: argparse.Namespace) -> dict:
    """The model-dtype engine, then the fp8 engine keeping each --fp8-keep set in the model dtype, from the same
    prompts and seeds, each against `hf`."""
    outs, ours = generate(engine(hf), batch_prompts, args)
    rows = {"model_dtype": score(hf, batch_prompts, outs, ours, args)[0]}
    for keep in args.fp8_keep:
        outs, ours = generate(keep_model_dtype(engine(hf, weights_dtype="fp8"), keep), batch_prompts, args)
        rows["fp8" + "".join(f"-keep-{k}" for k in keep)] = score(hf, batch_prompts, outs, ours, args)[0]
    return {"weights_dtype": "fp8", "runs": rows}


def lora_case(hf, batch_prompts, engine, args: argparse.Namespace) -> dict:
    """The adapter push against the merged push, both against `hf` with LoRA (module docstring)."""
    from asyncrl.learner.config import LearnerConfig
    from bench import lora_pushes

    cfg = LearnerConfig(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha)
    dtype = getattr(torch, args.dtype)
    base = copy.deepcopy(hf)  # the engines' starting weights; hf becomes the learner's LoRA model
    modules = lora_pushes.learner_lora(hf, cfg, dtype, seed=7)
    engines = lora_pushes.pushed_engines(base, hf, modules, cfg, dtype, engine)
    differing = lora_pushes.bitwise_differences(engines["adapter"][0].model, engines["full"][0].model)
    lora_pushes.to_compute_dtype(hf, dtype)
    if args.residual_fp32:
        from asyncrl.learner import residual_stream

        residual_stream.install(hf)
        residual_stream.install(base)
    runs, tokens = {}, {}
    for kind, (eng, nbytes) in engines.items():
        outs, ours = generate(eng, batch_prompts, args)
        runs[kind], ref = score(hf, batch_prompts, outs, ours, args)
        runs[kind]["push_bytes"] = nbytes
        tokens[kind] = torch.stack([torch.as_tensor(o.token_ids) for o in outs])
        if kind == "adapter":  # the same tokens under the base model: how far the adapters moved the logprobs
            shift = (learner_logprobs(base, batch_prompts, outs, args.temperature, chunk=16,
                                      logits_fp32=args.logits_fp32) - ref).abs().mean().item()
    ratio, unmerged_ratio = ({k: runs[kind][f"{k}_abs_delta"] / runs["full"][f"{k}_abs_delta"]
                              if runs["full"][f"{k}_abs_delta"] else None for k in ("mean", "p99", "max")}
                             for kind in ("adapter", "unmerged"))
    return {"lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha, "lora_targets": cfg.lora_targets,
            "lora_trainable": cfg.lora_trainable, "lora_delta": lora_pushes.LORA_DELTA,
            "norm_jitter": lora_pushes.NORM_JITTER, "adapter_push": runs["adapter"], "full_push": runs["full"],
            "unmerged_push": runs["unmerged"], "adapter_over_full": ratio, "unmerged_over_full": unmerged_ratio,
            "weights_bitwise_equal": not differing,
            "weights_differing": dict(list(differing.items())[:10]), "weights_differing_count": len(differing),
            "same_tokens": torch.equal(tokens["adapter"], tokens["full"]), "lora_shift_mean_abs": shift}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="tiny also runs on CPU")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=400)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--init-std", type=float, default=0.02, help="initializer_range of the random model")
    parser.add_argument("--deterministic", action="store_true", help="engine in deterministic mode")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--model", default="",
                        help='a trained model instead of a random one ("embedded": the embedded arithmetic model, '
                             "prompted with its task's problems; responses run to --output-len or EOS)")
    parser.add_argument("--logits-fp32", action="store_true",
                        help="model.logits_fp32 on both sides: the lm_head's output kept in fp32")
    parser.add_argument("--logit-scale", type=float, default=1.0,
                        help="random models: multiply the final norm's weight by this, so the logits have a trained "
                             "model's size (random init gives logits of ~1; a trained model's reach 20-40)")
    parser.add_argument("--residual-fp32", action="store_true",
                        help="model.residual_fp32 on both sides: the engine and the Hugging Face scorer")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="> 0: LoRA's adapter push against its merged push (module docstring); 0: no LoRA")
    parser.add_argument("--lora-alpha", type=float, default=16.0, help="with --lora-rank: scale = alpha / rank")
    parser.add_argument("--weights-dtype", default="model", choices=["model", "fp8"],
                        help="fp8: the model-dtype engine, then FP8 rollouts (one run per --fp8-keep entry)")
    parser.add_argument("--fp8-keep", default="none",
                        help="comma list of runs, each a '+'-joined set of projections kept in the model dtype "
                             f"({', '.join(FP8_PROJECTIONS)}) or 'none'; e.g. none,down_proj,o_proj+down_proj")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even for --model (slow)")
    args = parser.parse_args()
    args.fp8_keep = [[] if run == "none" else run.split("+") for run in args.fp8_keep.split(",")]
    unknown = sorted({k for run in args.fp8_keep for k in run} - set(FP8_PROJECTIONS))
    if unknown:
        parser.error(f"--fp8-keep {','.join(unknown)}: allowed: {', '.join(FP8_PROJECTIONS)} or none")
    if args.weights_dtype == "fp8" and args.lora_rank:
        parser.error("--weights-dtype fp8 with --lora-rank: not compared by this bench (the engine refuses both)")
    if args.lora_rank < 0 or args.lora_alpha <= 0:
        parser.error(f"--lora-rank {args.lora_rank} --lora-alpha {args.lora_alpha}: give a rank >= 0 and alpha > 0")
    return args


def main() -> None:
    args = parse_args()
    if (args.model or args.shape != "tiny") and not args.cpu:
        require_cuda("bench.logprob_agreement (shapes other than tiny; --cpu runs a --model on the CPU)")
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    hf, batch_prompts, max_len = trained_case(args, device) if args.model else random_case(args, device)

    def engine(model, **options):
        return make_engine(model, args.prompts, max_len, deterministic=args.deterministic,
                           residual_fp32=args.residual_fp32, logits_fp32=args.logits_fp32, **options)

    row = lora_case(hf, batch_prompts, engine, args) if args.lora_rank else plain_case(hf, batch_prompts, engine, args)
    print(json.dumps({
        "bench": "logprob_agreement", "model": args.model or f"random {args.shape}",
        "tokens": args.prompts * args.output_len, "prompts": args.prompts, "prompt_len": len(batch_prompts[0]),
        "output_len": args.output_len, "temperature": args.temperature,
        "init_std": None if args.model else args.init_std, "deterministic": args.deterministic, "dtype": args.dtype,
        "residual_fp32": args.residual_fp32, "logits_fp32": args.logits_fp32,
        "logit_scale": None if args.model else args.logit_scale, **row,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "commit": commit(),
    }), flush=True)


if __name__ == "__main__":
    main()
