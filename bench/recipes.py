"""Recipe runs side by side: launch whole runs (`python -m launch`) at once, then read what they learned.

    python -m bench.recipes start --out DIR --run NAME=CONFIG [--run ...] [--set KEY=VALUE] [--set NAME:KEY=VALUE]
    python -m bench.recipes collect --out DIR [--wait S] [--dest DIR] [--every S]

`start` launches each run in its own process session (so it outlives the calling shell, e.g. across two
device calls) with run directory DIR/NAME, and records the launch time. `collect` waits (at most --wait
seconds) for every run to end, then writes DIR/results.json and prints a table per run: each held-out
evaluation's strict pass@1 (and mean@k, pass@k) with the wall time from launch at which its round ended, the final
summary, and the restatement check: held-out answers that only restate the question (e.g. "(-95 / 95)" for
"Calculate -95 / 95.") and still scored. It draws each run's curves (asyncrl.plot) into --dest, and packs each
run's metrics, held-out answers, summary, config and log there as runs.tgz (one file: a device call brings few back).

Runs started together share the machine: each one's wall times include the others' load, and its memory: on one
H200 two `smollm2-arith-gpu` runs take 89 GiB, and a GSM run beside them ran out of memory (2026-12-05).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


STAGGER_S = 5.0  # between launches: each picks its free ports by binding port 0, then lets them go


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.recipes")
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("start", help="launch the runs, each in its own process session")
    s.add_argument("--out", required=True)
    s.add_argument("--run", action="append", required=True, metavar="NAME=CONFIG")
    s.add_argument("--set", action="append", default=[], metavar="[NAME:]KEY=VALUE",
                   help="override for every run, or for run NAME only")
    c = sub.add_parser("collect", help="wait for the runs, then summarize them")
    c.add_argument("--out", required=True)
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait for runs still going")
    c.add_argument("--dest", help="folder for results.json, results.md and the curve PNGs")
    c.add_argument("--every", type=float, default=0.0, metavar="S",
                   help="also write --dest every S seconds while waiting (what a cut-off call brings back)")
    return p.parse_args(argv)


def start(out: Path, runs: list[str], sets: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for spec in runs:
        name, _, config = spec.partition("=")
        overrides = [s.split(":", 1)[1] if _scoped(s) else s for s in sets if not _scoped(s) or s.startswith(name + ":")]
        cmd = [sys.executable, "-m", "launch", config, "--run-dir", str(out / name)]
        for o in overrides:
            cmd += ["--set", o]
        log = open(out / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (out / f"{name}.json").write_text(json.dumps({"name": name, "config": config, "overrides": overrides,
                                                     "pid": proc.pid, "launched": time.time(), "cmd": cmd}))
        print(f"started {name}: pid {proc.pid}: {' '.join(cmd)}", flush=True)
        time.sleep(STAGGER_S)


def _scoped(s: str) -> bool:
    head = s.split("=", 1)[0]
    return ":" in head


def collect(out: Path, wait_s: float, dest: Path | None, every_s: float = 0.0) -> list[dict[str, Any]]:
    """Wait for the runs (at most wait_s), then summarize them into DIR/results.json and --dest. With every_s > 0,
    also write --dest every every_s seconds while waiting: a device call cut off by its time limit, or by the
    machine going away, still brings back what the last snapshot held."""
    metas = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "results.json"]
    deadline = time.time() + wait_s
    snapshot = time.time() + every_s if every_s > 0 and dest is not None else float("inf")
    while any(_alive(m["pid"]) for m in metas) and time.time() < deadline:
        time.sleep(min(5.0, every_s) if every_s > 0 else 5.0)
        if time.time() >= snapshot:
            _write(out, dest, [summarize(out, m) for m in metas], quiet=True)
            snapshot = time.time() + every_s
    results = [summarize(out, m) for m in metas]
    _write(out, dest, results)
    return results


def _write(out: Path, dest: Path | None, results: list[dict[str, Any]], quiet: bool = False) -> None:
    """results.json in the runs' folder; with dest, results.json, results.md, each run's curve and runs.tgz."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = "\n\n".join(render(r) for r in results)
    if not quiet:
        print(text, flush=True)
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "results.json", dest / "results.json")
        (dest / "results.md").write_text(text + "\n")
        for r in results:
            _plot(out / r["name"], dest / f"{r['name']}.png")
        _pack(out, [r["name"] for r in results], dest / "runs.tgz")


RUN_FILES = ("metrics.jsonl", "eval.jsonl", "eval_responses.jsonl", "summary.json", "config.json")


def _pack(out: Path, names: list[str], tgz: Path) -> None:
    """Each run's metrics, evaluations, held-out answers, summary, config and log in one file (a device call
    brings back only a few files)."""
    import tarfile

    with tarfile.open(tgz, "w:gz") as tar:
        for name in names:
            for path in [out / name / f for f in RUN_FILES] + [out / f"{name}.log"]:
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(out)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a finished child of ours that nobody reaped is a zombie, not a run
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def summarize(out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    run = out / meta["name"]
    evals = _jsonl(run / "eval.jsonl")
    metrics = _jsonl(run / "metrics.jsonl")
    rows = []
    for e in evals:  # the round's end in wall time from launch
        wall = e["wall_time"] - meta["launched"] if "wall_time" in e else None
        rows.append({"step": e["step"], "pass@1": e["pass@1"], "mean@k": e.get("mean@k"), "pass@k": e.get("pass@k"),
                     "wall_s": wall, "tool_calls_mean": e.get("tool_calls_mean"),
                     "response_tokens": e.get("response_tokens"), "missing": e.get("missing")})
    summary = _json(run / "summary.json")
    end = (run / "summary.json").stat().st_mtime - meta["launched"] if summary else None
    return {"name": meta["name"], "config": meta["config"], "overrides": meta["overrides"], "evals": rows,
            "steps": metrics[-1]["step"] if metrics else 0, "end_wall_s": end,
            "reward_first10": _mean([m.get("reward_mean") for m in metrics[:10]]),
            "reward_last10": _mean([m.get("reward_mean") for m in metrics[-10:]]),
            "tool_calls_first10": _calls_per_episode(metrics[:10]),
            "tool_calls_last10": _calls_per_episode(metrics[-10:]),
            "accounting": (summary or {}).get("accounting"), "restated_and_scored": restated(run),
            "eval_prompts_in_batches": sum(m.get("eval_prompts_in_batch", 0) for m in metrics)}


def _calls_per_episode(metrics: list[dict[str, Any]]) -> float | None:
    """Tool calls per trained episode over these steps' batches; None when no step ran an environment."""
    rows = [m for m in metrics if "tool_calls" in m]
    episodes = sum(m.get("samples_trained", 0) for m in rows)
    return sum(m["tool_calls"] for m in rows) / episodes if episodes else None


def restated(run: Path) -> dict[str, int]:
    """Held-out greedy answers that are the question's expression itself (no value of their own), and how many scored."""
    seen = scored = 0
    for row in _jsonl(run / "eval_responses.jsonl"):
        expr = _expression(row.get("question") or "")
        if expr and _bare(row["response"]) == expr:
            seen += 1
            scored += row["score"] > 0
    return {"restated": seen, "restated_scored": scored}


def _expression(question: str) -> str:
    m = re.search(r"(?:Calculate|What is|Solve|Compute|Evaluate:)\s*(.+?)[.?]?\s*$", question.strip())
    return _bare(m.group(1)) if m else ""


def _bare(text: str) -> str:
    return re.sub(r"[\s().=]+", "", text)


def render(r: dict[str, Any]) -> str:
    lines = [f"## {r['name']} ({r['config']} {' '.join(r['overrides'])})",
             f"steps {r['steps']}, launch -> summary {_fmt(r['end_wall_s'])} s, reward mean first 10 steps "
             f"{_fmt(r['reward_first10'])}, last 10 {_fmt(r['reward_last10'])}, eval prompts in batches "
             f"{r['eval_prompts_in_batches']}, restated answers {r['restated_and_scored']}"
             + (f", tool calls per trained episode first 10 steps {_fmt(r['tool_calls_first10'])}, last 10 "
                f"{_fmt(r['tool_calls_last10'])}" if r.get("tool_calls_first10") is not None else ""),
             "", "| step | wall s from launch | held-out pass@1 | mean@k | pass@k | response tokens "
                 "| tool calls (greedy) |",
             "|---|---|---|---|---|---|---|"]
    for e in r["evals"]:
        lines.append(f"| {e['step']} | {_fmt(e['wall_s'])} | {e['pass@1']:.3f} | {_fmt(e['mean@k'])} | "
                     f"{_fmt(e.get('pass@k'))} | {_fmt(e['response_tokens'])} | {_fmt(e.get('tool_calls_mean'))} |")
    if r["accounting"]:
        lines.append(f"\naccounting: {json.dumps(r['accounting'])}")
    return "\n".join(lines)


def _plot(run: Path, png: Path) -> None:
    try:
        subprocess.run([sys.executable, "-m", "asyncrl.plot", str(run), "-o", str(png)], check=True, timeout=120)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"plot of {run} failed: {e}", file=sys.stderr)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a kill
    return out


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _mean(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if isinstance(x, (int, float))]
    return sum(vals) / len(vals) if vals else None


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) and abs(x) < 10 else f"{x:.0f}" if isinstance(x, float) else str(x))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verb == "start":
        start(Path(args.out), args.run, args.set)
    else:
        collect(Path(args.out), args.wait, Path(args.dest) if args.dest else None, args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
