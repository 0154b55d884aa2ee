"""Checkpoint stall: how long a background checkpoint holds the learner, phase by phase, and how long the
write behind it takes. One JSON line:

    python -m bench.checkpoint                  # GPU: the 0.5B shape; CPU: the tiny model
    python -m bench.checkpoint --shape 1.5b --saves 3

A Trainer takes one step (so the optimizer has state), reserves its staging buffers as the learner service
does after its first step, then --saves times: train a step, `save_checkpoint(background=True)` (the
stall: what the learner's "checkpoint" timeline span measures), wait for the writer (the write). Phases of
the stall: gathering the state dict, staging it into host memory, the rest (rng file, barriers).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.learner import commit, make_batch, model_path


def timed(phases: dict[str, list[float]], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name].append(time.perf_counter() - t0)
    return wrapper


def run(shape: str, saves: int, work: Path) -> dict:
    from transformers import AutoConfig

    from asyncrl.learner import checkpoint as ckpt
    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.trainer import Trainer

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    path = model_path(shape, work)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    batch = make_batch(64 if shape == "tiny" else 256, 8, 63 if shape == "tiny" else 256, vocab)
    trainer = Trainer(LearnerConfig(lr=1e-6, micro_batch_tokens=32768), path, device=device, seed=0)
    phases: dict[str, list[float]] = defaultdict(list)
    ckpt.get_state_dict = timed(phases, "gather_s", ckpt.get_state_dict)
    writer = trainer.checkpoints
    writer._stage = timed(phases, "stage_s", writer._stage)
    batch.step = 1
    trainer.train_step(batch)
    t0 = time.perf_counter()
    trainer.reserve_checkpoint_buffers()
    reserve_s = time.perf_counter() - t0
    phases.clear()
    stalls, writes = [], []
    for i in range(saves):
        batch.step = i + 2
        trainer.train_step(batch)
        t0 = time.perf_counter()
        trainer.save_checkpoint(work / "run", background=True)
        stalls.append(time.perf_counter() - t0)
        writer.wait()
        writes.append(time.perf_counter() - t0 - stalls[-1])
    state_bytes = sum(b.numel() * b.element_size() for b in writer._pinned.values())
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "reserve_s": round(reserve_s, 3), "stall_s": [round(s, 3) for s in stalls],
            "stall_median_s": round(float(np.median(stalls)), 3),
            "phases_median_s": {k: round(float(np.median(v)), 3) for k, v in phases.items()},
            "write_s": [round(w, 3) for w in writes], "pinned_gib": round(state_bytes / 2**30, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("tiny", "0.5b", "1.5b"), default=None, help="default: 0.5b on GPU, tiny on CPU")
    p.add_argument("--saves", type=int, default=3)
    args = p.parse_args()
    shape = args.shape or ("0.5b" if torch.cuda.is_available() else "tiny")
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as work:
        result = run(shape, args.saves, Path(work))
    print(json.dumps({"bench": "checkpoint", "shape": shape, "saves": args.saves, **result,
                      "torch": torch.__version__, "commit": commit(), "date": time.strftime("%Y-%m-%d")}))


if __name__ == "__main__":
    main()
