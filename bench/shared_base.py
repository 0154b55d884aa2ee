"""python -m bench.shared_base [CONFIG] [--set k=v ...] [--steps 6] [--rank 8]

What `generator.share_base` saves on the host (CPU runs): the same LoRA run launched twice, each process holding
its own base ("own") and all of them mapping the base holder's image ("shared"), one after the other. While each
runs, every 0.25 s, the proportional set size (PSS, /proc/PID/smaps_rollup: a page mapped by k processes counts 1/k
in each, so the image counts once in the sum) of the learner, the generators and the base holder is read; the
figures are the sum's median over the samples taken once the first step is logged ("training") and its peak
(which includes each process's start, when it still reads the model on the host before it maps the image). One
JSON line with both modes, the saving, the config and the commit. Linux only (smaps_rollup). On a GPU, where the
saving is device memory, bench.pipeline's memory probe is the measure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import provenance

ROOT = Path(__file__).resolve().parents[1]
WATCHED = ("learner", "generator", "base-holder")  # the processes that hold a base


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default=None, help="run config (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], help="config override, for both runs")
    p.add_argument("--steps", type=int, default=6, help="learner steps of each run")
    p.add_argument("--rank", type=int, default=8, help="learner.lora_rank")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds each run may take")
    args = p.parse_args(argv)
    modes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("own", "shared"):
            modes[mode] = run(args, Path(tmp) / mode, shared=mode == "shared")
    row = {"bench": "shared_base", "config": args.config or "embedded", "sets": args.set, "rank": args.rank,
           "steps": args.steps, "device": "cpu", "commit": provenance.commit(provenance.HERE),
           "date": time.strftime("%Y-%m-%d"), "modes": modes,
           "saved_mb": {k: round(modes["own"][k] - modes["shared"][k], 1) for k in ("training_mb", "peak_mb")}}
    print(json.dumps(row), flush=True)
    return row


def run(args: argparse.Namespace, run_dir: Path, shared: bool) -> dict:
    sets = [*args.set, f"learner.lora_rank={args.rank}", "generator.lora_apply=unmerged",
            f"generator.share_base={str(shared).lower()}", f"learner.steps={args.steps}", "launch.progress=false",
            "eval.every=0"]
    cmd = [sys.executable, "-m", "launch", *([args.config] if args.config else []), "--run-dir", str(run_dir),
           *[x for s in sets for x in ("--set", s)]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples: list[tuple[bool, dict[str, float]]] = []  # (training, {process: PSS MB})
    deadline = time.monotonic() + args.timeout
    while proc.poll() is None and time.monotonic() < deadline:
        pss = {name: mb for name, pid in _pids(run_dir).items() if (mb := _pss_mb(pid)) is not None}
        if pss:
            samples.append((_training(run_dir), pss))
        time.sleep(0.25)
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate()[0]
    if proc.returncode != 0:
        raise RuntimeError(f"the {'shared' if shared else 'own'} run failed (exit {proc.returncode}):\n{out[-3000:]}")
    return summarize(samples)


def summarize(samples: list[tuple[bool, dict[str, float]]]) -> dict:
    """The sum's median while training (and each process's median then) and the sum's peak, in MB."""
    training = [pss for busy, pss in samples if busy] or [pss for _, pss in samples]
    if not training:
        raise RuntimeError("no memory sample was taken: the run ended before its processes could be read")
    names = sorted({n for pss in training for n in pss})
    return {"training_mb": round(statistics.median(sum(p.values()) for p in training), 1),
            "peak_mb": round(max(sum(p.values()) for _, p in samples), 1),
            "per_process_mb": {n: round(statistics.median(p[n] for p in training if n in p), 1) for n in names},
            "samples": len(training)}


def _pids(run_dir: Path) -> dict[str, int]:
    try:
        pids = json.loads((run_dir / "run.json").read_text())["pids"]
    except (OSError, ValueError, KeyError):
        return {}
    return {n: int(pid) for n, pid in pids.items() if n.startswith(WATCHED)}


def _pss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None  # not started yet, or gone
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return None


def _training(run_dir: Path) -> bool:
    try:
        return (run_dir / "metrics.jsonl").stat().st_size > 0
    except OSError:
        return False


if __name__ == "__main__":
    main()
