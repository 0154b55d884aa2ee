"""Where engine and learner logprobs part ways in bf16: one generation, scored many ways.

The engine generates `--prompts` x `--output-len` tokens from a random-initialised model (bench.generation's
shapes). The same tokens are then scored by:

    engine      the engine's own sampling logprobs (decode steps, CUDA graphs, fused kernels)
    hf          Hugging Face forward in the model dtype, 16 sequences per call (bench.logprob_agreement's side)
    hf_c5       the same, 5 sequences per call: other GEMM shapes, same formulas
    hf_head32   hf's final hidden states through an lm_head with fp32 output (no bf16 rounding of the logits)
    hf_decode   Hugging Face one token at a time with a KV cache, all sequences per call (decode-shaped GEMMs
                and attention, Hugging Face's formulas)
    learner     the learner's forward (asyncrl.learner.trainer.Trainer, FSDP2, packed varlen attention), eager
    learner_c   the same with `compile = true` (Inductor fuses norms, rotary, SwiGLU)
    learner_ce  compiled with Inductor's `emulate_precision_casts` (eager's intermediate roundings)
    learner_sdpa  the learner eager with `attn_implementation = "sdpa"` (padded batches, torch's attention)
    fp32        Hugging Face in fp32 on the same (bf16-valued) weights: the exact function, for reference

and prints one JSON line: for each scorer its mean / p99 |delta logp| against the engine and against fp32, and
the per-layer relative difference of the residual stream (hf vs fp32, hf_decode vs hf), so a divergence can be
traced to where it starts.

    python -m bench.agreement_sources [--prompts 64 --output-len 256] [--skip learner_c,learner_ce]
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from bench.generation import build_hf, make_engine, prompts, run_engine
from bench.provenance import commit

DEV = "cuda"
SCORERS = ("hf", "hf_c5", "hf_head32", "hf_decode", "learner", "learner_c", "learner_ce", "learner_sdpa")


def _stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    d = (a.float() - b.float()).abs().flatten()
    return {"mean": d.mean().item(), "p99": d.quantile(0.99).item(), "max": d.max().item()}


def _gather(logp_all: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
    return logp_all.gather(-1, resp[..., None])[..., 0]


def _mm_fp32_out(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """h [n, H] @ weight [V, H]^T with fp32 output (bf16 inputs, fp32 accumulation, no output rounding)."""
    try:
        return torch.mm(h, weight.t(), out_dtype=torch.float32)
    except (TypeError, RuntimeError):  # a torch without mm's out_dtype (or a CPU kernel without it)
        return h.float() @ weight.float().t()


def hf_full(hf, ids: torch.Tensor, plen: int, chunk: int, head32: bool = False,
            layers: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """ids [N, P + L] -> (logp [N, L] fp32, per-layer residual streams at the predicting positions or None)."""
    rows, per_layer = [], []
    weight = hf.get_output_embeddings().weight  # [V, H]
    for s in range(0, ids.shape[0], chunk):
        part = ids[s : s + chunk]
        with torch.no_grad():
            out = hf.model(part, use_cache=False, output_hidden_states=layers)
            h = out.last_hidden_state[:, plen - 1 : -1]  # [c, L, H]
            flat = h.reshape(-1, h.shape[-1])
            if head32:
                logits = _mm_fp32_out(flat, weight)
            else:
                logits = (flat @ weight.t()).float()
            lp = torch.log_softmax(logits, -1).view(*h.shape[:2], -1)
            rows.append(_gather(lp, part[:, plen:]))
            if layers:
                per_layer.append([x[:, plen - 1 : -1].float() for x in out.hidden_states])
    stacked = [torch.cat(z) for z in zip(*per_layer)] if layers else None
    return torch.cat(rows), stacked


def hf_decode(hf, ids: torch.Tensor, plen: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Teacher-forced decode with Hugging Face's KV cache: [N, L] logp and per-layer streams [N, L, H]."""
    weight = hf.get_output_embeddings().weight
    steps, layer_steps = [], []
    with torch.no_grad():
        out = hf.model(ids[:, :plen], use_cache=True, output_hidden_states=True)
        for t in range(plen, ids.shape[1]):
            last = [x[:, -1:].float() for x in out.hidden_states]
            layer_steps.append(last)
            logits = (out.last_hidden_state[:, -1] @ weight.t()).float()
            steps.append(_gather(torch.log_softmax(logits, -1), ids[:, t]))
            out = hf.model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True,
                           output_hidden_states=True)
    return torch.stack(steps, 1), [torch.cat(z, 1) for z in zip(*layer_steps)]


def learner_scores(path: str, ids: torch.Tensor, plen: int, compile_: bool, emulate: bool,
                   dtype: str = "bfloat16", attn: str = "auto", residual_fp32: bool = False) -> torch.Tensor:
    """The learner's forward (Trainer-built policy, eval mode, no grad) over packs of 16 sequences."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    from asyncrl.learner import attention
    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.fsdp import autocast
    from asyncrl.learner.trainer import Trainer

    torch._dynamo.reset()
    inductor_config.emulate_precision_casts = emulate
    trainer = Trainer(LearnerConfig(compile=compile_, attn_implementation=attn), path, dtype=dtype,
                      residual_fp32=residual_fp32,
                      device=torch.device(DEV, 0) if DEV == "cuda" else DEV)
    trainer.policy.eval()
    n, total = ids.shape
    rows = []
    for s in range(0, n, 16):
        part = ids[s : s + 16]
        c = part.shape[0]
        gather = torch.cat([torch.arange(plen - 1, total - 1, device=DEV) + i * total for i in range(c)])
        # the pack's boundaries go to the varlen kernel only, as in Trainer._forward (sdpa reads position_ids)
        varlen = (attention.cu_seqlens([total] * c).to(DEV), total) if trainer.attn == attention.NAME else (None, 0)
        with torch.no_grad(), autocast(trainer.dist, trainer.dtype):
            logp, _, _ = trainer.policy(
                part.reshape(1, -1), torch.arange(total, device=DEV).repeat(c)[None], gather,
                part[:, plen:].reshape(-1), torch.ones(gather.numel(), device=DEV), *varlen)
        rows.append(logp.view(c, -1))
    inductor_config.emulate_precision_casts = False
    del trainer
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return torch.cat(rows)


def layer_profile(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    """Mean over tokens of |a - b| / |b| of the residual stream, per layer output (0 = embeddings)."""
    return [round(((x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-30)).mean().item(), 7) for x, y in zip(a, b)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--skip", default="", help="comma-separated scorers to leave out")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                        help="the model's (and so the engine's and learner's) compute dtype")
    parser.add_argument("--residual-fp32", action="store_true",
                        help="model.residual_fp32 on every side: engine, Hugging Face scorers, learner")
    parser.add_argument("--cpu", action="store_true", help="allow CPU (checks the script; not a measurement)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    global DEV
    if not torch.cuda.is_available():
        if not args.cpu:
            raise SystemExit("bench.agreement_sources needs a CUDA GPU (the comparison is about bf16 kernels); "
                             "--cpu runs it on CPU to check the script")
        DEV = "cpu"
    max_len = args.prompt_len + args.output_len + 16
    hf = build_hf(args.shape, max_len, device=DEV, dtype=getattr(torch, args.dtype))
    batch = prompts(args.prompts, args.prompt_len, seed=5)
    eng = make_engine(hf, args.prompts, max_len, residual_fp32=args.residual_fp32)
    _, outs, _ = run_engine(eng, batch, args.output_len)
    eng.close()
    outs.sort(key=lambda o: int(o.request_id[1:]))
    plen = args.prompt_len
    resp = torch.tensor([o.token_ids.tolist() for o in outs], device=DEV)
    ids = torch.cat([torch.tensor(batch, device=DEV), resp], 1)  # [N, P + L]
    scores = {"engine": torch.tensor([o.logprobs.tolist() for o in outs], device=DEV)}
    if args.residual_fp32:
        from asyncrl.learner import residual_stream

        residual_stream.install(hf)  # the fp32 reference below is unchanged by it (its stream is fp32 anyway)
    scores["hf"], hf_layers = hf_full(hf, ids, plen, 16, layers=True)
    if "hf_c5" not in skip:
        scores["hf_c5"], _ = hf_full(hf, ids, plen, 5)
    if "hf_head32" not in skip:
        scores["hf_head32"], _ = hf_full(hf, ids, plen, 16, head32=True)
    profiles, errors = {}, {}
    if "hf_decode" not in skip:
        scores["hf_decode"], dec_layers = hf_decode(hf, ids, plen)
        profiles["hf_decode_vs_hf"] = layer_profile(dec_layers, hf_layers)
        del dec_layers
    with tempfile.TemporaryDirectory() as path:
        hf.save_pretrained(path)
        for name, comp, emul, attn in (("learner", False, False, "auto"), ("learner_c", True, False, "auto"),
                                       ("learner_ce", True, True, "auto"), ("learner_sdpa", False, False, "sdpa")):
            if name not in skip:
                try:
                    scores[name] = learner_scores(path, ids, plen, comp, emul, args.dtype, attn,
                                                  args.residual_fp32)
                except Exception as e:  # one scorer's failure still leaves the others' numbers
                    errors[name] = f"{type(e).__name__}: {e}"[:300]
    hf32 = hf.float()
    scores["fp32"], f32_layers = hf_full(hf32, ids, plen, 16, layers=True)
    profiles["hf_vs_fp32"] = layer_profile(hf_layers, f32_layers)
    row = {"bench": "agreement_sources", "shape": args.shape, "dtype": args.dtype, "residual_fp32": args.residual_fp32, "prompts": args.prompts, "prompt_len": plen,
           "output_len": args.output_len, "tokens": scores["engine"].numel(),
           "vs_engine": {k: _stats(v, scores["engine"]) for k, v in scores.items() if k != "engine"},
           "vs_fp32": {k: _stats(v, scores["fp32"]) for k, v in scores.items() if k != "fp32"},
           "pairs": {"learner_c_vs_learner": _stats(scores["learner_c"], scores["learner"])
                     if {"learner", "learner_c"} <= scores.keys() else None,
                     "hf_vs_learner": _stats(scores["hf"], scores["learner"]) if "learner" in scores else None},
           "layer_rel_diff": profiles, "errors": errors, "mean_logprob": scores["fp32"].mean().item(),
           "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__, "commit": commit()}
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
