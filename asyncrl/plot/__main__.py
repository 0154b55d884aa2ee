"""python -m asyncrl.plot RUN_DIR [-o curves.png] [--compare OTHER_RUN ...] [--x step|time|both]

Writes one PNG of the run's training curves (asyncrl.plot.figure) and prints its path. Nothing to plot
(no such directory, no metrics.jsonl, no step in it) or no matplotlib: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asyncrl.plot.run_data import RunDataError, load_run

EXIT_USAGE = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m asyncrl.plot", description="Plot a run's training curves as a PNG.")
    p.add_argument("run_dir", help="the run directory (metrics.jsonl, eval.jsonl, config.json)")
    p.add_argument("-o", "--out", help="the PNG to write (default RUN_DIR/curves.png)")
    p.add_argument("--compare", nargs="+", default=[], metavar="OTHER_RUN",
                   help="run directories drawn over it, one colour each")
    p.add_argument("--x", choices=("step", "time", "both"), default="both",
                   help="x axis: learner step, wall time, or both side by side (default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = [load_run(d) for d in [args.run_dir, *args.compare]]
    except RunDataError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    try:
        from asyncrl.plot.figure import draw
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("matplotlib"):
            raise
        print("matplotlib is not installed: pip install asyncrl[plot]", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out) if args.out else Path(args.run_dir) / "curves.png"
    axes = ["step", "time"] if args.x == "both" else [args.x]
    print(draw(runs, axes, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
