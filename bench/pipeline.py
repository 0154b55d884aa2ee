"""python -m bench.pipeline [CONFIG] [--set k=v ...] [--repeats 2] [--keep DIR] [--plot FILE.png] [--timeline FILE.json]

Runs the same config in two modes, interleaved (async, sync, async, sync: --repeats of each, so that
drift in machine load hits both alike) — asynchronous (hub.max_staleness as configured, >= 1)
and the synchronous baseline (max_staleness = 0: the hub admits no prompt for step k+1 until the
learner has pushed version k, so generation and training alternate) — and prints one JSON line:
steps/s of each, async_over_sync, overlap_fraction (share of learner busy time during which
generation also ran), generator and learner idle fractions, the staleness histogram and weight-push
time by phase, with model shape, batch, lengths, device and commit. Each number is computed per run,
then the median over the repeats is reported. The run directories are removed at the end unless --keep;
--timeline keeps the first run of each mode's spans (every generate / train / push / checkpoint, a few kB)
in one file, for reading a run step by step without its directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from asyncrl.config.run import load_run_config
from asyncrl.observe.timeline import read_timelines
from bench.intervals import clip, intersect, total, union
from launch.__main__ import EMBEDDED
from launch.__main__ import main as launch_main


def commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_mode(config: str | None, overrides: list[str], run_dir: Path) -> None:
    code = launch_main([*([config] if config else []), *sum((["--set", o] for o in overrides), []),
                        "--set", "launch.progress=false", "--run-dir", str(run_dir)])
    if code != 0:
        raise SystemExit(f"bench.pipeline: the run in {run_dir} failed (exit {code}); see its logs/")


def analyse(run_dir: Path) -> dict:
    spans = read_timelines(run_dir)
    learn = [(s["start"], s["end"]) for s in spans if s["name"].startswith("learner-0") and s["kind"] in ("train", "push")]
    gen = [(s["start"], s["end"]) for s in spans if s["name"].startswith("generator") and s["kind"] == "generate"]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    t0 = min(a for a, _ in gen + learn)
    t1 = max(b for _, b in learn)
    wall = t1 - t0
    gen_c, learn_c = clip(gen, t0, t1), clip(learn, t0, t1)
    hist: Counter[int] = Counter()
    push: dict[str, float] = Counter()
    for m in metrics:
        hist.update({int(k): v for k, v in m.get("staleness_hist", {}).items()})
        push.update({k: v for k, v in m.get("push", {}).items() if isinstance(v, (int, float)) and k.endswith("_s")})
    steps = len(metrics)
    return {
        "steps": steps, "wall_s": round(wall, 3), "steps_per_s": steps / wall,
        "steady_step_s": steady_step(spans), "span_s": span_medians(spans),
        "overlap_fraction": total(intersect(learn_c, gen_c)) / max(total(learn_c), 1e-9),
        "generator_idle_fraction": 1 - total(union(gen_c)) / wall,
        "learner_idle_fraction": 1 - total(learn_c) / wall,
        "staleness_hist": dict(sorted(hist.items())),
        "push_s_per_step": {k: v / max(steps, 1) for k, v in push.items()},
        "reward_first": metrics[0].get("reward_mean") if metrics else None,
        "reward_last": metrics[-1].get("reward_mean") if metrics else None,
        "_spans": {"learner": learn_c, "generator": union(gen_c), "t0": t0},
        "_timeline": relative_spans(spans, t0),
    }


def relative_spans(spans: list[dict], t0: float) -> list[list]:
    """Every timeline span as [process, kind, start, end] in seconds from the run's first span, in time
    order: the per-step record (generate / train / push / checkpoint) behind the medians."""
    rows = [[s["name"], s["kind"], round(s["start"] - t0, 4), round(s["end"] - t0, 4)] for s in spans]
    return sorted(rows, key=lambda r: (r[2], r[0]))


def steady_step(spans: list[dict]) -> float | None:
    """Median time between consecutive learner-0 train starts over the second half of the run (after
    compilation and warm-up), i.e. the pipeline's step time once the learner is at speed."""
    starts = sorted(s["start"] for s in spans if s["name"].startswith("learner-0") and s["kind"] == "train")
    gaps = [b - a for a, b in zip(starts, starts[1:])][len(starts) // 2:]
    return round(statistics.median(gaps), 4) if gaps else None


def span_medians(spans: list[dict]) -> dict[str, dict[str, float]]:
    """Per kind of timeline span (generate, train, push; checkpoint = a background save's stall,
    checkpoint_final = the run's last, foreground save): median and max seconds over the second half of the
    run (over all of them for checkpoints: there are few), and how many there were."""
    out = {}
    for kind in ("generate", "train", "push", "checkpoint", "checkpoint_final"):
        d = sorted((s["start"], s["end"] - s["start"]) for s in spans if s["kind"] == kind
                   and (s["name"].startswith("learner-0") or kind == "generate"))
        late = [x for _, x in (d if kind.startswith("checkpoint") else d[len(d) // 2:])] or [x for _, x in d]
        if late:
            out[kind] = {"median": round(statistics.median(late), 4), "max": round(max(x for _, x in d), 4), "count": len(d)}
    return out


def plot(results: dict[str, dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[plot]'") from None
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 2.2 * len(results)), sharex=True)
    for ax, (mode, res) in zip(axes, results.items()):
        sp = res["_spans"]
        for row, key, color in ((1, "generator", "tab:blue"), (0, "learner", "tab:orange")):
            ax.broken_barh([(a - sp["t0"], b - a) for a, b in sp[key]], (row - 0.4, 0.8), color=color)
        ax.set_yticks([0, 1], ["learner", "generator"])
        ax.set_title(f"{mode}: {res['steps_per_s']:.3f} steps/s, overlap {res['overlap_fraction']:.2f}")
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


MODES = ("async", "sync")


def schedule(repeats: int) -> list[tuple[str, int]]:
    """Interleaved (async, sync, async, sync, ...) so that drift in machine load hits both modes alike."""
    return [(mode, r) for r in range(repeats) for mode in MODES]


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def median_of(runs: list[dict]) -> dict:
    """One mode's result: each number the median over its repeats (each computed per run first); the
    staleness histogram summed; `_spans` of the first run (for --plot)."""
    scalars = ("steps_per_s", "wall_s", "steady_step_s", "overlap_fraction", "generator_idle_fraction",
               "learner_idle_fraction", "reward_first", "reward_last")
    out: dict = {k: _median([r[k] for r in runs]) for k in scalars}
    kinds = sorted({k for r in runs for k in r["span_s"]})
    out["span_s"] = {k: {stat: _median([r["span_s"][k][stat] for r in runs if k in r["span_s"]])
                         for stat in ("median", "max", "count")} for k in kinds}
    out["push_s_per_step"] = {k: _median([r["push_s_per_step"].get(k) for r in runs])
                              for k in sorted({k for r in runs for k in r["push_s_per_step"]})}
    hist: Counter[int] = Counter()
    for r in runs:
        hist.update(r["staleness_hist"])
    out["staleness_hist"] = dict(sorted(hist.items()))
    out["per_run_steps_per_s"] = [round(r["steps_per_s"], 4) for r in runs]
    out["_spans"] = runs[0]["_spans"]
    out["_timeline"] = runs[0].get("_timeline", [])
    return out


def run_all(config: str | None, overrides: list[str], staleness: int, repeats: int, base: Path) -> dict[str, dict]:
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for mode, r in schedule(repeats):
        run_dir = base / f"{mode}-{r}"
        run_mode(config, [*overrides, f"hub.max_staleness={staleness if mode == 'async' else 0}"], run_dir)
        runs[mode].append(analyse(run_dir))
    return {mode: median_of(rs) for mode, rs in runs.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    p.add_argument("config", nargs="?")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--plot", metavar="FILE.png")
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode, interleaved; medians reported")
    p.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR (default: removed at the end)")
    p.add_argument("--timeline", metavar="FILE.json",
                   help="write the first run of each mode's spans ([process, kind, start, end], seconds) to FILE")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give 1 or more")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = load_run_config(args.config or EMBEDDED, args.set)  # what launch will run
    staleness = max(cfg.hub.max_staleness, 1)
    base = Path(args.keep or tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        results = run_all(args.config, args.set, staleness, args.repeats, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.plot:
        plot(results, args.plot)
    if args.timeline:
        Path(args.timeline).write_text(json.dumps({mode: results[mode]["_timeline"] for mode in MODES}))
    print(json.dumps(result_line(results, cfg, staleness, args)))


def result_line(results: dict[str, dict], cfg, staleness: int, args: argparse.Namespace) -> dict:
    a, s = results["async"], results["sync"]
    return {
        "bench": "pipeline", "repeats": args.repeats, "order": "interleaved async, sync",
        "async_steps_per_s": a["steps_per_s"], "sync_steps_per_s": s["steps_per_s"],
        "async_over_sync": a["steps_per_s"] / s["steps_per_s"], "overlap_fraction": a["overlap_fraction"],
        "per_run_steps_per_s": {"async": a["per_run_steps_per_s"], "sync": s["per_run_steps_per_s"]},
        "steady_step_s": {"async": a["steady_step_s"], "sync": s["steady_step_s"]},
        "steady_async_over_sync": (s["steady_step_s"] / a["steady_step_s"]) if a["steady_step_s"] and s["steady_step_s"] else None,
        "span_s": {"async": a["span_s"], "sync": s["span_s"]},
        "sync_overlap_fraction": s["overlap_fraction"],
        "generator_idle_fraction": {"async": a["generator_idle_fraction"], "sync": s["generator_idle_fraction"]},
        "learner_idle_fraction": {"async": a["learner_idle_fraction"], "sync": s["learner_idle_fraction"]},
        "staleness_hist": {"async": a["staleness_hist"], "sync": s["staleness_hist"]},
        "push_s_per_step": a["push_s_per_step"], "max_staleness": staleness,
        "model": cfg.model.path, "batch": {"prompts_per_step": cfg.batch.prompts_per_step,
                                           "samples_per_prompt": cfg.batch.samples_per_prompt},
        "max_new_tokens": cfg.task.max_new_tokens, "steps": cfg.learner.steps,
        "device": cfg.generator.devices or "default", "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "learner": {"micro_batch_tokens": cfg.learner.micro_batch_tokens, "compile": cfg.learner.compile,
                    "checkpoint_every": cfg.learner.checkpoint_every},
        "commit": os.environ.get("ASYNCRL_COMMIT") or commit(), "run_dirs": args.keep or "removed",
        "timeline": args.timeline,
    }


if __name__ == "__main__":
    sys.exit(main())
