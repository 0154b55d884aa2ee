"""One evaluation round's prompts, and its result from the completions that came back.

A round asks for each held-out prompt once greedily (pass@1) and, with `eval.k`, k times at the training
temperature: mean@k (the mean score of those samples) and pass@k (the share of prompts that at least one of its k
samples solves, score 1: what sampling can find, which training can make greedy). Every response is scored by
`asyncrl.reward.strict.strict_score` on the prompt's own reward spec (the task's scorer on the extracted final
answer), never by the run's training reward alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from asyncrl.evaluation.config import EvalConfig
from asyncrl.records import Prompt, RewardSpec, Sample, SamplingParams


@dataclasses.dataclass(slots=True)
class Response:
    """One evaluation sample as it came back: which prompt, greedy or not, its text, tokens and versions."""

    prompt_id: str
    greedy: bool
    text: str
    tokens: int
    versions: tuple[int, int] | None  # (oldest, newest) policy version of its tokens; None: no tokens


def round_prompts(heldout: list[Prompt], cfg: EvalConfig, sampling: SamplingParams, tag: str) -> list[Prompt]:
    """Greedy copies ("<tag>-<i>-g", n=1) and, with cfg.k, sampled copies ("<tag>-<i>-s", n=k) of `heldout`."""
    cap = cfg.max_new_tokens or sampling.max_new_tokens
    greedy = dataclasses.replace(sampling, temperature=0.0, max_new_tokens=cap, seed=None)
    sampled = dataclasses.replace(sampling, max_new_tokens=cap)
    out = []
    for i, p in enumerate(heldout):
        meta = {**p.metadata, "eval": True}
        out.append(dataclasses.replace(p, prompt_id=f"{tag}-{i}-g", n=1, sampling=greedy, metadata=meta))
        if cfg.k:
            out.append(dataclasses.replace(p, prompt_id=f"{tag}-{i}-s", n=cfg.k, sampling=sampled, metadata=meta))
    return out


def summarize(step: int, prompts: list[Prompt], responses: Iterable[Response], cfg: EvalConfig,
              score: Callable[[str, RewardSpec], float] | None = None,
              greedy_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The round's record (eval.jsonl, metrics.jsonl "eval"): pass@1, mean@k, pass@k, lengths, versions, missing.
    `score` (response text, reward spec) -> 0..1 defaults to the strict check. `greedy_rows`, when given,
    gets one dict per greedy response (question, target, response, score: eval_responses.jsonl)."""
    if score is None:
        from asyncrl.reward.strict import strict_score as score
    strict_score = score
    by_id = {p.prompt_id: p for p in prompts}
    greedy: list[float] = []
    sampled: list[float] = []
    solved: set[str] = set()  # sampled prompts with a sample of score 1
    lengths: list[int] = []
    versions: list[tuple[int, int]] = []
    for r in responses:
        score = strict_score(r.text, by_id[r.prompt_id].reward)
        (greedy if r.greedy else sampled).append(score)
        if not r.greedy and score >= 1.0:
            solved.add(r.prompt_id)
        if r.greedy:
            lengths.append(r.tokens)
            if greedy_rows is not None:
                p = by_id[r.prompt_id]
                greedy_rows.append({"step": step, "prompt_id": r.prompt_id, "question": p.metadata.get("question"),
                                    "target": p.reward.target, "response": r.text, "score": score})
        if r.versions is not None:
            versions.append(r.versions)
    n_greedy = sum(1 for p in prompts if p.n == 1 and p.prompt_id.endswith("-g"))
    n_sampled = sum(p.n for p in prompts if p.prompt_id.endswith("-s"))
    missing = (n_greedy - len(greedy)) + (n_sampled - len(sampled))
    out: dict[str, Any] = {
        "step": step, "prompts": n_greedy, "pass@1": sum(greedy) / max(n_greedy, 1),
        "response_tokens": float(np.mean(lengths)) if lengths else 0.0, "missing": missing,
        "versions": [min(v[0] for v in versions), max(v[1] for v in versions)] if versions else None,
        "check": "strict",
    }
    if cfg.k:
        asked = sum(1 for p in prompts if p.prompt_id.endswith("-s"))
        out["mean@k"], out["k"] = sum(sampled) / max(n_sampled, 1), cfg.k
        out["pass@k"] = len(solved) / max(asked, 1)
    return out


def episode_figures(samples: list[Sample]) -> dict[str, float]:
    """turns_mean and tool_calls_mean per episode: of the greedy episodes, and (suffix @k) of the sampled ones;
    episodes_failed: episodes whose environment raised, hung or refused (all of them)."""
    out = {"episodes_failed": float(sum(s.rollout.get("failed", 0.0) for s in samples))}
    for suffix, kind in (("", "-g"), ("@k", "-s")):
        stats = [s.rollout for s in samples if s.prompt_id.endswith(kind)]
        if stats:
            out[f"turns_mean{suffix}"] = sum(r.get("turns", 0.0) for r in stats) / len(stats)
            out[f"tool_calls_mean{suffix}"] = sum(r.get("tool_calls", 0.0) for r in stats) / len(stats)
    return out
