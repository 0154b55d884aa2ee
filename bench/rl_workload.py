"""The RL-shaped generation workload: groups of samples sharing a prompt, finishing at random lengths.

What a GRPO step asks of a generator (issue 12): `groups` prompts of `prompt_len` tokens, `n` samples
each (the group shares its prompt: a prefix cache can reuse it), responses of at most `max_new` tokens
of which most end early. A random-initialised model never says EOS on cue, so each sample's length is
drawn here and enforced with `ignore_eos` + `max_new_tokens`: a quarter run to `max_new` (truncated, as
long reasoning traces are), the rest end uniformly in [max_new / 8, max_new). Seeded, so the engine and the
baseline see the same work.

The engine gets each sample as a request of its own (a request's samples share one max_new_tokens), so it
prefills a group's prompt n times where the generator, whose samples end at EOS, sends one request of n
samples: the engine's figure is, if anything, low.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RLWorkload:
    prompts: list[list[int]]  # one per sample: each group's prompt repeated n times, group by group
    lengths: list[int]  # response tokens of each sample
    groups: int
    n: int
    max_new: int

    @property
    def useful_tokens(self) -> int:
        """Response tokens the samples need: what both the engine and the baseline are credited with."""
        return sum(self.lengths)

    def summary(self) -> dict[str, float | int]:
        a = np.asarray(self.lengths)
        return {"groups": self.groups, "samples_per_prompt": self.n, "prompt_len": len(self.prompts[0]),
                "max_new_tokens": self.max_new, "mean_len": round(float(a.mean()), 1),
                "truncated_frac": round(float((a == self.max_new).mean()), 3), "useful_tokens": int(a.sum())}


def rl_workload(groups: int, n: int, prompt_len: int, max_new: int, vocab: int, seed: int = 0) -> RLWorkload:
    if min(groups, n, prompt_len, max_new) < 1:
        raise ValueError(f"groups={groups}, n={n}, prompt_len={prompt_len}, max_new={max_new}: all must be >= 1")
    rng = np.random.default_rng(seed)
    base = rng.integers(0, vocab, size=(groups, prompt_len)).tolist()
    total = groups * n
    lengths = rng.integers(max(1, max_new // 8), max_new, size=total, endpoint=False)
    truncated = rng.random(total) < 0.25
    lengths = np.where(truncated, max_new, np.maximum(lengths, 1))
    prompts = [list(base[g]) for g in range(groups) for _ in range(n)]
    return RLWorkload(prompts=prompts, lengths=[int(x) for x in lengths], groups=groups, n=n, max_new=max_new)
