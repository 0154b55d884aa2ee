"""Logprob agreement: engine sampling logprobs against a learner-style forward pass.

The engine (bf16, CUDA graphs, fused kernels) generates >= 100k tokens from a random-initialised
Qwen2-0.5B-shape model; the same Hugging Face model then scores prompt + response in one forward
(bf16), log_softmax(logits.float() / T) in fp32, as the learner does. Prints one JSON line with the
mean and max |delta logp| over all generated tokens.

    python -m bench.logprob_agreement [--prompts 256 --output-len 400 --init-std 0.02]
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.generation import build_hf, commit, make_engine, prompts, require_cuda, run_engine


def learner_logprobs(hf, prompt: list[list[int]], outs, temperature: float, chunk: int,
                     logits_fp32: bool = False) -> torch.Tensor:
    """-> [num_seqs, output_len] fp32 logprobs of the engine's tokens under one HF forward per chunk
    (logits_fp32: the lm_head's fp32 output, as the learner computes it with model.logits_fp32)."""
    from asyncrl.precision.fp32_logits import fp32_logits

    rows = []
    plen = len(prompt[0])
    for start in range(0, len(outs), chunk):
        part = outs[start : start + chunk]
        resp = torch.tensor([o.token_ids.tolist() for o in part], device="cuda")
        ids = torch.cat([torch.tensor(prompt[start : start + chunk], device="cuda"), resp], dim=1)
        with torch.no_grad():
            if logits_fp32:
                hidden = hf.model(ids).last_hidden_state[:, plen - 1 : -1]  # [chunk, out_len, H]
                logits = fp32_logits(hidden.flatten(0, 1), hf.lm_head.weight).view(*hidden.shape[:2], -1)
            else:
                logits = hf(ids).logits[:, plen - 1 : -1]  # [chunk, out_len, vocab] bf16
            lp = torch.log_softmax(logits.float() / temperature, dim=-1)
            rows.append(lp.gather(-1, resp[..., None])[..., 0])
    return torch.cat(rows)


def answer_mask(outs, eos) -> torch.Tensor:
    """[num_seqs, output_len] bool: each response's tokens up to and including its first EOS, the part a run
    without ignore_eos samples (what follows is off the trained model's distribution)."""
    stops = set(eos if isinstance(eos, list) else [eos])
    rows = []
    for o in outs:
        ids = o.token_ids.tolist()
        end = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
        rows.append([i < end for i in range(len(ids))])
    return torch.tensor(rows, device="cuda")


def trained_case(args: argparse.Namespace) -> tuple[torch.nn.Module, list[list[int]], int]:
    """(HF model on the GPU in --dtype, its task's prompts as token ids, max length) for --model."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.models.config import ModelConfig, resolve_model_path
    from asyncrl.task.arithmetic import make_problem

    path = resolve_model_path(ModelConfig(path=args.model))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).cuda().eval()
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(5)
    batch = [tok(make_problem(rng, 2, "+-").text)["input_ids"] for _ in range(args.prompts)]
    width = max(len(p) for p in batch)  # left-pad with the first token so every prompt has one length
    batch = [[p[0]] * (width - len(p)) + p for p in batch]
    positions = hf.config.max_position_embeddings
    return hf, batch, min(width + args.output_len + 16, positions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b")
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
    args = parser.parse_args()
    require_cuda("bench.logprob_agreement")
    if args.model:
        hf, batch_prompts, max_len = trained_case(args)
    else:
        max_len = args.prompt_len + args.output_len + 16
        hf = build_hf(args.shape, max_len, init_std=args.init_std, dtype=getattr(torch, args.dtype))
        with torch.no_grad():
            hf.model.norm.weight.mul_(args.logit_scale)
        batch_prompts = prompts(args.prompts, args.prompt_len, seed=5)
    eng = make_engine(hf, args.prompts, max_len, deterministic=args.deterministic, residual_fp32=args.residual_fp32,
                      logits_fp32=args.logits_fp32)
    _, outs, _ = run_engine(eng, batch_prompts, args.output_len, temperature=args.temperature)
    outs.sort(key=lambda o: int(o.request_id[1:]))
    eng.close()
    if args.residual_fp32:
        from asyncrl.learner import residual_stream

        residual_stream.install(hf)  # after the engine copied the weights: the scorer's stream is fp32 too
    ref = learner_logprobs(hf, batch_prompts, outs, args.temperature, chunk=16, logits_fp32=args.logits_fp32)
    ours = torch.tensor([o.logprobs.tolist() for o in outs], device="cuda")
    delta = (ours - ref).abs()
    answered = answer_mask(outs, hf.config.eos_token_id) if args.model else None
    print(json.dumps({
        "bench": "logprob_agreement", "model": args.model or f"random {args.shape}", "tokens": delta.numel(),
        "prompts": args.prompts, "prompt_len": len(batch_prompts[0]), "output_len": args.output_len,
        "temperature": args.temperature, "init_std": None if args.model else args.init_std, "deterministic": args.deterministic, "dtype": args.dtype,
        "residual_fp32": args.residual_fp32, "logits_fp32": args.logits_fp32,
        "logit_scale": None if args.model else args.logit_scale,
        "mean_abs_delta": delta.mean().item(), "max_abs_delta": delta.max().item(),
        "p99_abs_delta": delta.flatten().float().quantile(0.99).item() if delta.numel() < 2**24 else None,
        "mean_logprob": ref.mean().item(), **({} if answered is None else {
            "answer_tokens": int(answered.sum()), "answer_mean_abs_delta": delta[answered].mean().item(),
            "answer_p99_abs_delta": delta[answered].float().quantile(0.99).item(),
            "answer_mean_logprob": ref[answered].mean().item()}), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "commit": commit(),
    }), flush=True)


if __name__ == "__main__":
    main()
