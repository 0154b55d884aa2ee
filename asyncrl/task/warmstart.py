"""Supervised warm start of the embedded model, and its accuracy measurement.

Teacher forcing on correct answers: the loss covers only the answer tokens and EOS, so the model learns
to answer the prompt, not to write prompts. Label smoothing keeps the answer
distribution wide, so the model knows many answers (greedy decoding finds them) but samples them only
sometimes at temperature 1: RL gets both signal and room, and sharpening alone raises reward quickly.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asyncrl.task.arithmetic import Problem, extract_answer, make_problem
from asyncrl.task.tokenizer import EOS, PAD, VOCAB, token_id

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class WarmStartConfig:
    steps: int = 800
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 50
    label_smoothing: float = 0.3  # keeps the policy's entropy high: greedy is often right, T = 1 less so
    seed: int = 0
    digits: int = 2
    ops: str = "+-"


def encode(text: str) -> list[int]:
    return [token_id(c) for c in text]


def _batch(problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
    """-> input ids [B, T] (right-padded) and loss mask [B, T-1] over the predicted answer tokens."""
    rows, masks = [], []
    for p in problems:
        prompt, answer = [VOCAB["<bos>"]] + encode(p.text), encode(p.answer) + [VOCAB[EOS]]
        rows.append(prompt + answer)
        masks.append([0] * (len(prompt) - 1) + [1] * len(answer))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), VOCAB[PAD], dtype=torch.long)
    mask = torch.zeros((len(rows), width - 1))
    for i, (row, m) in enumerate(zip(rows, masks)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, mask


def train(model: torch.nn.Module, cfg: WarmStartConfig) -> float:
    """Train in place; return the final loss (mean over the last 20 steps)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * (1 - s / cfg.steps))
    model.train()
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(cfg.steps):
        ids, mask = _batch([make_problem(rng, cfg.digits, cfg.ops) for _ in range(cfg.batch_size)])
        logits = model(input_ids=ids).logits[:, :-1]  # [B, T-1, V]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none", label_smoothing=cfg.label_smoothing)
        loss = (nll * mask.reshape(-1)).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % max(1, cfg.steps // 5) == 0:
            log.info("warm start step %d/%d loss %.3f (%.1f s)", step + 1, cfg.steps, loss.item(), time.monotonic() - t0)
    model.eval()
    return sum(losses[-20:]) / len(losses[-20:])


@torch.no_grad()
def accuracy(model: torch.nn.Module, problems: list[Problem], temperature: float, max_new_tokens: int = 8, seed: int = 0) -> float:
    """Fraction of problems answered right, sampling at `temperature` (0 = greedy). Full recompute per token."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [[VOCAB["<bos>"]] + encode(p.text) for p in problems]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), VOCAB[PAD], dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, row in enumerate(prompts):  # left padding keeps the last column the next position
        ids[i, width - len(row) :] = torch.tensor(row)
        attn[i, width - len(row) :] = 1
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1].float()  # [B, V]
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen).squeeze(-1)
        for i, t in enumerate(nxt.tolist()):
            out[i].append(t)
        ids = torch.cat([ids, nxt[:, None]], 1)
        attn = torch.cat([attn, torch.ones_like(nxt)[:, None]], 1)
    inv = {i: " " if t == "\u0120" else t for t, i in VOCAB.items()}
    right = sum(extract_answer("".join(inv[t] for t in row)) == p.answer for row, p in zip(out, problems))
    return right / len(problems)
