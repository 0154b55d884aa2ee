"""The curves figure: one row per panel, one column per x axis (learner step, wall time), one colour per run.

    training reward      reward_mean per step, and its rolling mean
    held-out eval        pass@1 (greedy), mean@k and pass@k of eval.jsonl, a marker at each evaluated step
    response length      response_len_mean of the trained samples; the eval's greedy response_tokens
    KL / mismatch        kl, behav_prox_logp_absdiff (mean, p99): whichever the run logged; log scale when > 0
    step time            step_time_s of the learner, and its rolling mean
    tool calls           multi-turn runs only: tool calls per trained episode (tool_calls / samples_trained), its
                         rolling mean, and the eval's greedy tool_calls_mean

Series are styled by what they are (a grey legend in the title row of each panel of the first column) and
coloured by run (a legend under the title when there is more than one run). matplotlib is imported here only,
with the Agg backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from asyncrl.plot.run_data import Run  # noqa: E402

GREY = "0.35"


@dataclass(kw_only=True, slots=True)
class Series:
    label: str
    y: Callable[[Run], list[float]]
    evals: bool = False  # one point per eval result (x: its step / arrival time), not per learner step
    style: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class Panel:
    title: str
    ylabel: str
    series: list[Series]
    log_when_positive: bool = False
    empty: str = "not in this run's metrics"  # shown when no run has any of the series


def rolling_window(n: int) -> int:
    return max(1, min(20, n // 10))


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` finite values (NaN steps are skipped, not zeros)."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - window + 1): i + 1] if math.isfinite(v)]
        out.append(sum(recent) / len(recent) if recent else math.nan)
    return out


def panels(runs: list[Run]) -> list[Panel]:
    window = rolling_window(len(runs[0].steps))
    ks = {e.get("k") for r in runs for e in r.evals if e.get("mean@k") is not None}
    k = ks.pop() if len(ks) == 1 else "k"
    mean_k, pass_k = f"mean@{k}", f"pass@{k} (one of {k} right)"
    raw, smooth = dict(lw=0.8, alpha=0.35), dict(lw=2)
    return [
        Panel(title="training reward (mean of a step's samples)", ylabel="reward", series=[
            Series(label="per step", y=lambda r: r.column("reward_mean"), style=raw),
            Series(label=f"rolling mean ({window})", y=lambda r: rolling_mean(r.column("reward_mean"), window),
                   style=smooth)]),
        Panel(title="held-out eval", ylabel="accuracy", empty="no eval results (eval.jsonl)", series=[
            Series(label="pass@1 (greedy)", y=lambda r: r.eval_column("pass@1"), evals=True,
                   style=dict(lw=1.5, marker="o", ms=4)),
            Series(label=mean_k, y=lambda r: r.eval_column("mean@k"), evals=True,
                   style=dict(lw=1.2, ls="--", marker="s", ms=4)),
            Series(label=pass_k, y=lambda r: r.eval_column("pass@k"), evals=True,
                   style=dict(lw=1, ls=":", marker="^", ms=4))]),
        Panel(title="response length (mean)", ylabel="tokens", series=[
            Series(label="trained samples", y=lambda r: r.column("response_len_mean"), style=dict(lw=1.2)),
            Series(label="eval (greedy)", y=lambda r: r.eval_column("response_tokens"), evals=True,
                   style=dict(lw=1, ls=":", marker="o", ms=3))]),
        Panel(title="KL / engine-learner mismatch", ylabel="per token", log_when_positive=True, series=[
            Series(label="KL to ref", y=lambda r: r.column("kl"), style=dict(lw=1.2)),
            Series(label="|prox - behav| logp", y=lambda r: r.column("behav_prox_logp_absdiff"),
                   style=dict(lw=1.2, ls="-.")),
            Series(label="its p99", y=lambda r: r.column("behav_prox_logp_absdiff_p99"),
                   style=dict(lw=0.8, ls="--", alpha=0.6))]),
        Panel(title="learner step time", ylabel="seconds", series=[
            Series(label="per step", y=lambda r: r.column("step_time_s"), style=raw),
            Series(label=f"rolling mean ({window})", y=lambda r: rolling_mean(r.column("step_time_s"), window),
                   style=smooth)]),
        *([tool_panel(window, raw, smooth)] if any(r.has("tool_calls") for r in runs) else []),
    ]


def tool_panel(window: int, raw: dict[str, Any], smooth: dict[str, Any]) -> Panel:
    """How often the policy calls its tools: per trained episode (each step's batch) and per greedy held-out one."""
    return Panel(title="tool calls per episode", ylabel="calls", series=[
        Series(label="trained episodes", y=calls_per_episode, style=raw),
        Series(label=f"rolling mean ({window})", y=lambda r: rolling_mean(calls_per_episode(r), window), style=smooth),
        Series(label="eval (greedy)", y=lambda r: r.eval_column("tool_calls_mean"), evals=True,
               style=dict(lw=1, ls=":", marker="o", ms=3))])


def calls_per_episode(run: Run) -> list[float]:
    """tool_calls (a step's batch total) over the step's trained samples; NaN where either is missing."""
    return [c / n if n > 0 else math.nan for c, n in zip(run.column("tool_calls"), run.column("samples_trained"))]


def time_unit(runs: list[Run]) -> tuple[str, float]:
    """(unit, seconds per unit) that keeps the longest run's wall time readable."""
    longest = max((t for r in runs for t in r.wall_s() if math.isfinite(t)), default=0.0)
    return ("s", 1.0) if longest <= 180 else ("min", 60.0) if longest <= 3 * 3600 else ("h", 3600.0)


def xs(run: Run, axis: str, evals: bool, per_unit: float) -> list[float]:
    if axis == "step":
        return [float(e["step"]) for e in run.evals] if evals else [float(m["step"]) for m in run.steps]
    return [t / per_unit for t in (run.eval_wall_s() if evals else run.wall_s())]


def draw(runs: list[Run], axes: list[str], out: Path) -> Path:
    """runs[0] is the run the figure is about; the others are drawn over it. axes: "step" and/or "time"."""
    rows = panels(runs)
    unit, per_unit = time_unit(runs)
    fig, grid = plt.subplots(len(rows), len(axes), figsize=(6.4 * len(axes), 2.4 * len(rows)), sharex="col",
                             squeeze=False, layout="constrained")
    for col, axis in enumerate(axes):
        for row, panel in enumerate(rows):
            _panel(grid[row][col], panel, runs, axis, per_unit, legend=col == 0)
        grid[-1][col].set_xlabel("learner step" if axis == "step" else f"wall time ({unit} since the learner started)")
    _header(fig, runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _header(fig: Any, runs: list[Run]) -> None:
    """The title and, with --compare, a line naming each run in its colour, in a band kept free of panels."""
    band = (0.35 if len(runs) == 1 else 0.3 + 0.25 * math.ceil(len(runs) / 4)) / fig.get_figheight()
    fig.get_layout_engine().set(rect=(0, 0, 1, 1 - band))
    fig.text(0.5, 1 - 0.08 / fig.get_figheight(), runs[0].title, ha="center", va="top", fontsize=12)
    if len(runs) > 1:
        handles = [Line2D([], [], color=_colour(i), lw=2.5) for i in range(len(runs))]
        fig.legend(handles, [r.name for r in runs], loc="upper center", ncol=min(len(runs), 4), frameon=False,
                   fontsize=10, bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_figheight()))


def _panel(ax: Any, panel: Panel, runs: list[Run], axis: str, per_unit: float, legend: bool) -> None:
    """One panel for every run; its series legend (grey: style, not run) sits in the title row, right-aligned."""
    drawn: list[Series] = []
    values: list[float] = []
    for i, run in enumerate(runs):
        for s in panel.series:
            y = s.y(run)
            if not any(math.isfinite(v) for v in y):
                continue
            ax.plot(xs(run, axis, s.evals, per_unit), y, color=_colour(i), **s.style)
            values += [v for v in y if math.isfinite(v)]
            if s not in drawn:
                drawn.append(s)
    ax.set_title(panel.title, fontsize=10, loc="left")
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, panel.empty, transform=ax.transAxes, ha="center", va="center", color=GREY)
        return
    if panel.log_when_positive and min(values) > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 1-2-5 ticks, plain numbers: a decade or less
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # of data still gets several labels
        ax.yaxis.set_minor_formatter(NullFormatter())
    if legend:
        handles = [Line2D([], [], color=GREY, **s.style) for s in drawn]
        ax.legend(handles, [s.label for s in drawn], loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(drawn),
                  fontsize=7.5, frameon=False, borderaxespad=0.1, handlelength=2.2, columnspacing=1.0)


def _colour(i: int) -> str:
    return f"C{i % 10}"
