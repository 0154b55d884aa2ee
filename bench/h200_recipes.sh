#!/usr/bin/env bash
# The recipe runs of docs/benchmarks.md ("A real model learns") on a lent H200, which has no registry:
# wheels travel in .whl/, the 98 MB GGUF in three 40 MiB parts (.part_a/, .part_b/, .part_c/: a call carries at
# most 64 MiB with the working tree) over three calls to a warm machine. Make the parts once:
#   split -b 40M SmolLM2-135M-Instruct.Q4_1.gguf ggpart_   # -> ggpart_aa in .part_a/, _ab in .part_b/, _ac in .part_c/
#   bash bench/h200_recipes.sh env        # first call: the carried wheels into /tmp/site (PYTHONPATH)
#   bash bench/h200_recipes.sh part_a     # call 1: keep part A in /tmp (part_b: call 2)
#   bash bench/h200_recipes.sh model      # call 3: part C, join, check sha256, convert (prints the .gguf path)
# then `python -m bench.recipes start|collect` (bench/recipes.py).
set -euo pipefail
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
M=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-env}" in
  env)
    if [ ! -d /tmp/site/zmq ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
      # reasoning-gym imports pycosat for its zebra puzzles only; no cp312 wheel exists on PyPI
      printf 'def _missing(*a, **k):\n    raise ImportError("pycosat is not installed here")\nitersolve = solve = _missing\n' > /tmp/site/pycosat.py
    fi ;;
  part_a|part_b) mkdir -p /tmp/parts && cp ".$1"/* /tmp/parts/ && ls -la /tmp/parts ;;
  model)
    mkdir -p /tmp/parts /tmp/models && { cp .part_c/* /tmp/parts/ 2>/dev/null || true; }  # already there: fine (sha256 checks)
    [ -f $M ] || cat /tmp/parts/ggpart_* > $M
    echo "$SHA  $M" | sha256sum -c -
    python3 -c "from pathlib import Path; from asyncrl.models.gguf import converted; print(converted(Path('$M'), print))" ;;
esac
