"""Checkpoint stall: how long a background checkpoint holds the learner, phase by phase, and how long the
write behind it takes. One JSON line:

    python -m bench.checkpoint                  # GPU: the 0.5B shape; CPU: the tiny model
    python -m bench.checkpoint --shape 1.5b --saves 3

A Trainer takes one step (so the optimizer has state), reserves its staging buffers as the learner service
does after its first step, then --saves times: train a step, `save_checkpoint(background=True)` (the
stall: what the learner's "checkpoint" timeline span measures), wait for the writer (the write). Phases of
the stall: gathering the state dict, staging it into host memory, the rest (rng file, barriers).

--final measures the end of a run instead: the final checkpoint and the export, as the learner service of the
tree under test runs them (with `CheckpointWriter.announce_next`: the checkpoint written in the background while
the export runs; without, the trees before: a foreground save, then the export). --before DIR measures DIR's
tree (an older checkout: its asyncrl, this bench) and then this one, in subprocesses, on one model folder:

    python -m bench.checkpoint --final --shape 0.5b --before .before     # GPU
    python -m bench.checkpoint --final --shape small --before /tmp/base  # CPU: ~0.34 GB of state
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.learner import make_batch, model_path
from bench.provenance import commit


def timed(phases: dict[str, list[float]], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name].append(time.perf_counter() - t0)
    return wrapper


SMALL = dict(hidden=512, layers=4, heads=8, kv_heads=2, intermediate=1408, vocab=32000)  # CPU: 28 M params


def trained(path: str, shape: str) -> Any:
    """A Trainer one step in (the optimizer has state), its staging buffers reserved as the service does."""
    from transformers import AutoConfig

    from asyncrl.learner.config import LearnerConfig
    from asyncrl.learner.trainer import Trainer

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    vocab = AutoConfig.from_pretrained(path).vocab_size
    trainer = Trainer(LearnerConfig(lr=1e-6, micro_batch_tokens=32768), path, device=device, seed=0)
    batch = make_batch(16 if shape in ("tiny", "small") else 64, 8, 63, vocab)
    batch.step = 1
    trainer.train_step(batch)
    trainer.reserve_checkpoint_buffers()
    return trainer


def run_final(path: str, shape: str, work: Path) -> dict:
    """The end of a run as this tree's learner service runs it: final checkpoint, export (one of each)."""
    import asyncrl
    from asyncrl.learner import checkpoint as ckpt

    trainer = trained(path, shape)
    writer, lines = trainer.checkpoints, []
    overlapped = hasattr(writer, "announce_next")
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # the writer's own "GB written in" line
    logging.getLogger(ckpt.__name__).addHandler(handler)
    logging.getLogger(ckpt.__name__).setLevel(logging.INFO)
    t0 = time.perf_counter()
    if overlapped:
        writer.announce_next("final checkpoint")
        trainer.save_checkpoint(work / "run", background=True)
        stall = time.perf_counter() - t0
        trainer.export(work / "export")
        export_s = time.perf_counter() - t0 - stall
        writer.wait()
        save_s = time.perf_counter() - t0
    else:
        trainer.save_checkpoint(work / "run")
        save_s = stall = time.perf_counter() - t0
        trainer.export(work / "export")
        export_s = time.perf_counter() - t0 - save_s
    end_s = time.perf_counter() - t0
    files = list((work / "run" / "checkpoints").glob("step-*/*.pt"))
    return {"mode": "overlapped" if overlapped else "sequential", "end_s": round(end_s, 2),
            "final_checkpoint_s": round(save_s, 2), "snapshot_s": round(stall, 2), "export_s": round(export_s, 2),
            "checkpoint_gb": round(sum(f.stat().st_size for f in files) / 1e9, 2), "files": len(files),
            "writer_log": [m for m in lines if "written in" in m], "asyncrl": os.path.dirname(asyncrl.__file__)}


def compare(path: str, shape: str, before: str) -> dict:
    """run_final in a subprocess with `before`'s asyncrl, then one with this tree's."""
    here = str(Path(__file__).resolve().parents[1])
    out = {}
    for name, tree in (("before", str(Path(before).resolve())), ("after", here)):
        code = (f"import sys, runpy; sys.argv = ['checkpoint', '--final', '--shape', {shape!r}, '--model', {path!r}]; "
                f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')")
        # the tree's asyncrl first; this checkout's bench (a --before tree may hold asyncrl alone) and the
        # caller's path after it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tree, here, os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name} ({tree}) failed:\n{proc.stderr[-3000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])["final"]
    return out


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


def shape_path(shape: str, work: Path) -> str:
    if shape != "small":
        return model_path(shape, work)
    from bench.make_model import Shape, make_model

    return str(make_model(Shape(**SMALL), work / shape))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("tiny", "small", "0.5b", "1.5b"), default=None,
                   help="default: 0.5b on GPU, tiny on CPU; small: a 28 M-parameter Qwen2 (CPU)")
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--final", action="store_true", help="the end of a run: final checkpoint and export")
    p.add_argument("--before", default=None, help="with --final: an older tree to measure first (its asyncrl)")
    p.add_argument("--model", default=None, help="this model folder instead of building the shape's")
    args = p.parse_args()
    shape = args.shape or ("0.5b" if torch.cuda.is_available() else "tiny")
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as work:
        path = args.model or shape_path(shape, Path(work))
        if args.final and args.before:
            result = compare(path, shape, args.before)
        elif args.final:
            result = {"final": run_final(path, shape, Path(work))}
        else:
            result = run(shape, args.saves, Path(work))
    print(json.dumps({"bench": "checkpoint", "shape": shape, "saves": args.saves, **result,
                      "torch": torch.__version__, "commit": commit(), "date": time.strftime("%Y-%m-%d")}))


if __name__ == "__main__":
    main()
