"""Build the embedded model: `python -m asyncrl.task.build_embedded [--out DIR] [--steps N]`.

Prints one JSON line with its size, warm-start time and accuracy (greedy and sampled at T = 1).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from asyncrl.task.embedded import ASSET_DIR, build
from asyncrl.task.warmstart import WarmStartConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ASSET_DIR, help=f"output folder (default {ASSET_DIR})")
    parser.add_argument("--steps", type=int, default=WarmStartConfig().steps, help="warm-start steps")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    info = build(args.out, WarmStartConfig(steps=args.steps))
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(json.dumps({"out": str(args.out), "bytes": size, **info}))


if __name__ == "__main__":
    main()
