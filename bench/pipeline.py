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

    python -m bench.pipeline configs/gpu-1-lora.toml --set model.path=DIR --modes async --repeats 1 --stop-after 6

--lora-rank R sets learner.lora_rank. --modes async skips the synchronous baseline. --stop-after N stops each
run once N steps are in its metrics (as Ctrl-C does: the learner finishes its step and checkpoints, and there
is no export, which for a 7B model is a 15 GB write). Per run it also reports each push's bytes and times
(median over steps, from metrics.jsonl), the files of the last checkpoint, and the GPU memory of every
process: each service process of the run gets a `sitecustomize` (written into a temporary folder, put first
on PYTHONPATH) whose daemon thread samples, every 0.5 s once CUDA is initialised in that process, its
torch.cuda.max_memory_allocated / max_memory_reserved and the device's free memory (torch.cuda.mem_get_info),
and writes them to <run>/gpu_memory/<process>.json. Memory the caching allocator reserved counts as used in
`min_free_gib`; a spike shorter than 0.5 s can be missed by it, never by the peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

from asyncrl.config.run import load_run_config
from asyncrl.observe.timeline import read_timelines
from bench import provenance
from bench.intervals import clip, intersect, total, union
from launch.__main__ import EMBEDDED
from launch.__main__ import main as launch_main


MEMORY_ENV = "ASYNCRL_BENCH_MEMORY_DIR"
PROBE = """# bench.pipeline's GPU memory probe (written by bench/pipeline.py; see its docstring).
import json, os, sys, threading, time


def _sample(out):
    name = sys.argv[sys.argv.index("--name") + 1] if "--name" in sys.argv[:-1] else os.path.basename(sys.argv[0])
    path = os.path.join(out, name + ".json")
    while True:
        time.sleep(0.5)
        try:
            torch = sys.modules.get("torch")
            if torch is None or not torch.cuda.is_initialized():
                continue
            rows = {}
            for i in range(torch.cuda.device_count()):
                stats = torch.cuda.memory_stats(i)
                if stats.get("allocated_bytes.all.peak", 0) == 0:
                    continue  # no tensor of this process on device i
                free, total = torch.cuda.mem_get_info(i)
                rows[str(i)] = {"peak_allocated_gib": stats["allocated_bytes.all.peak"] / 2**30,
                                "peak_reserved_gib": stats["reserved_bytes.all.peak"] / 2**30,
                                "free_gib": free / 2**30, "total_gib": total / 2**30}
            if not rows:
                continue
            try:
                with open(path) as f:
                    old = json.load(f)
            except (OSError, ValueError):
                old = {}
            for dev, row in rows.items():
                row["min_free_gib"] = min(row.pop("free_gib"), old.get(dev, {}).get("min_free_gib", 1e9))
            with open(path + ".tmp", "w") as f:
                json.dump({**old, **rows}, f)
            os.replace(path + ".tmp", path)
        except Exception:
            pass


if os.environ.get("%s"):
    os.makedirs(os.environ["%s"], exist_ok=True)
    threading.Thread(target=_sample, args=(os.environ["%s"],), name="bench-memory-probe", daemon=True).start()
""" % ((MEMORY_ENV,) * 3)


def run_mode(config: str | None, overrides: list[str], run_dir: Path, stop_after: int = 0) -> None:
    """One launch of the config in this process; with `stop_after`, stopped (SIGTERM to this process, which
    launch takes as Ctrl-C) once that many steps are in the run's metrics."""
    argv = [*([config] if config else []), *sum((["--set", o] for o in overrides), []),
            "--set", "launch.progress=false", "--run-dir", str(run_dir)]
    done = threading.Event()
    if stop_after:
        threading.Thread(target=stop_when, args=(run_dir / "metrics.jsonl", stop_after, done), daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-probe-") as site, memory_probe(Path(site), run_dir / "gpu_memory"):
            code = launch_main(argv)
    finally:
        done.set()
    if code != 0 and not (stop_after and code == 130):
        raise SystemExit(f"bench.pipeline: the run in {run_dir} failed (exit {code}); see its logs/")


def stop_when(metrics: Path, steps: int, done: threading.Event) -> None:
    while not done.wait(0.5):
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            print(f"bench.pipeline: {steps} steps done, stopping the run", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return


class memory_probe:
    """PYTHONPATH and MEMORY_ENV set for the launched processes while the block runs, then put back."""

    def __init__(self, site: Path, out: Path) -> None:
        self.site, self.out, self.saved = site, out, {}

    def __enter__(self) -> None:
        self.site.mkdir(parents=True, exist_ok=True)
        (self.site / "sitecustomize.py").write_text(PROBE)
        self.saved = {k: os.environ.get(k) for k in ("PYTHONPATH", MEMORY_ENV)}
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.site), self.saved["PYTHONPATH"]) if p)
        os.environ[MEMORY_ENV] = str(self.out)

    def __exit__(self, *exc) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def gpu_memory(run_dir: Path) -> dict[str, dict]:
    """{process: {device: peaks and min free, GiB}} from the probe's files."""
    out = {}
    for f in sorted((run_dir / "gpu_memory").glob("*.json")):
        try:
            out[f.stem] = {d: {k: round(v, 2) for k, v in row.items()} for d, row in json.loads(f.read_text()).items()}
        except ValueError:
            continue  # caught mid-write by a killed process
    return out


def checkpoint_files(run_dir: Path) -> dict[str, int]:
    """Bytes of each file of the run's last complete checkpoint ({} without one)."""
    steps = sorted((run_dir / "checkpoints").glob("step-*"))
    return {f.name: f.stat().st_size for f in steps[-1].iterdir() if f.is_file()} if steps else {}


def push_medians(metrics: list[dict]) -> dict:
    """Median over the run's pushes of their bytes and seconds (metrics' "push": weights/report.py), and kind."""
    pushes = [m["push"] for m in metrics if m.get("push")]
    keys = ("bytes", "total_s", "paused_s", "recv_s", "load_s", "apply_s", "transfer_s", "gather_s")
    out: dict = {k: _median([p.get(k) for p in pushes]) for k in keys}
    out["kind"] = sorted({str(p.get("kind")) for p in pushes})
    return out


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
        "push": push_medians(metrics), "gpu_memory": gpu_memory(run_dir), "checkpoint_files": checkpoint_files(run_dir),
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
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 2.2 * len(results)), sharex=True, squeeze=False)
    axes = axes[:, 0]
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


def schedule(repeats: int, modes: tuple[str, ...] = MODES) -> list[tuple[str, int]]:
    """Interleaved (async, sync, async, sync, ...) so that drift in machine load hits both modes alike."""
    return [(mode, r) for r in range(repeats) for mode in modes]


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
    out["push"] = {k: _median([r["push"].get(k) for r in runs]) for k in runs[0].get("push", {}) if k != "kind"}
    out["push"]["kind"] = sorted({k for r in runs for k in r.get("push", {}).get("kind", [])})
    out["gpu_memory"] = runs[0].get("gpu_memory", {})  # the first run's: peaks are a process's own
    out["checkpoint_files"] = runs[0].get("checkpoint_files", {})
    out["per_run_steps_per_s"] = [round(r["steps_per_s"], 4) for r in runs]
    out["_spans"] = runs[0]["_spans"]
    out["_timeline"] = runs[0].get("_timeline", [])
    return out


def run_all(config: str | None, overrides: list[str], staleness: int, args: argparse.Namespace, base: Path) -> dict[str, dict]:
    runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    for mode, r in schedule(args.repeats, args.modes):
        run_dir = base / f"{mode}-{r}"
        print(f"bench.pipeline: {mode} run {r + 1}/{args.repeats} in {run_dir}", file=sys.stderr, flush=True)
        run_mode(config, [*overrides, f"hub.max_staleness={staleness if mode == 'async' else 0}"], run_dir,
                 args.stop_after)
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
    p.add_argument("--lora-rank", type=int, default=None, metavar="R", help="learner.lora_rank (0: full fine-tuning)")
    p.add_argument("--modes", default=",".join(MODES), help="async,sync (default) or one of them")
    p.add_argument("--stop-after", type=int, default=0, metavar="N",
                   help="stop each run after N steps (no export; default: run learner.steps)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give 1 or more")
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes {','.join(args.modes)}: give async, sync or async,sync")
    if args.lora_rank is not None:
        args.set = [*args.set, f"learner.lora_rank={args.lora_rank}"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = load_run_config(args.config or EMBEDDED, args.set)  # what launch will run
    staleness = max(cfg.hub.max_staleness, 1)
    base = Path(args.keep or tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        results = run_all(args.config, args.set, staleness, args, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.plot:
        plot(results, args.plot)
    if args.timeline:
        Path(args.timeline).write_text(json.dumps({mode: results[mode]["_timeline"] for mode in results}))
    print(json.dumps(result_line(results, cfg, staleness, args)))


def result_line(results: dict[str, dict], cfg, staleness: int, args: argparse.Namespace) -> dict:
    """The JSON line; a mode left out by --modes reads None (and every ratio between the modes too)."""
    a, s = results.get("async", {}), results.get("sync", {})

    def per_mode(key: str) -> dict:
        return {mode: results[mode][key] if mode in results else None for mode in MODES}

    def over(x, y):
        return x / y if x and y else None

    first = a or s
    return {
        "bench": "pipeline", "repeats": args.repeats, "modes": list(args.modes), "order": "interleaved async, sync",
        "async_steps_per_s": a.get("steps_per_s"), "sync_steps_per_s": s.get("steps_per_s"),
        "async_over_sync": over(a.get("steps_per_s"), s.get("steps_per_s")), "overlap_fraction": a.get("overlap_fraction"),
        "per_run_steps_per_s": per_mode("per_run_steps_per_s"), "steady_step_s": per_mode("steady_step_s"),
        "steady_async_over_sync": over(s.get("steady_step_s"), a.get("steady_step_s")),
        "span_s": per_mode("span_s"), "sync_overlap_fraction": s.get("overlap_fraction"),
        "generator_idle_fraction": per_mode("generator_idle_fraction"),
        "learner_idle_fraction": per_mode("learner_idle_fraction"), "staleness_hist": per_mode("staleness_hist"),
        "push_s_per_step": first["push_s_per_step"], "push": per_mode("push"), "gpu_memory": per_mode("gpu_memory"),
        "checkpoint_files": per_mode("checkpoint_files"), "max_staleness": staleness,
        "model": cfg.model.path, "batch": {"prompts_per_step": cfg.batch.prompts_per_step,
                                           "samples_per_prompt": cfg.batch.samples_per_prompt},
        "max_new_tokens": cfg.task.max_new_tokens, "steps": cfg.learner.steps, "stop_after": args.stop_after,
        "device": cfg.generator.devices or "default", "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "learner": {"micro_batch_tokens": cfg.learner.micro_batch_tokens, "compile": cfg.learner.compile,
                    "checkpoint_every": cfg.learner.checkpoint_every,
                    "activation_checkpointing": cfg.learner.activation_checkpointing},
        "lora": {"rank": cfg.learner.lora_rank, "alpha": cfg.learner.lora_alpha, "targets": cfg.learner.lora_targets,
                 "trainable": cfg.learner.lora_trainable, "push": cfg.learner.lora_push} if cfg.learner.lora_rank else None,
        "commit": provenance.commit(), "run_dirs": args.keep or "removed",
        "timeline": args.timeline,
    }


if __name__ == "__main__":
    sys.exit(main())
