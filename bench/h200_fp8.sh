#!/usr/bin/env bash
# Issue 33's generation figures in one device call (~5 minutes): FP8 against bf16 weights side by side, HF
# `generate` in the same process for the first of each pair, on the issue's cases:
#   fp8_gpu      pytest -m gpu tests/engine/test_fp8_gpu.py (the FP8 GEMMs against bf16, under graph replay)
#   batch256     bench.generation --shapes 0.5b,1.5b --batches 256 --weights-dtypes model,fp8 (256 + 256 tokens)
#   rl           bench.generation --rl --shapes 0.5b --weights-dtypes model,fp8 (32 x 8, 512-token prompts,
#                <= 1,024 new at random lengths: bench/rl_workload.py)
#   gemm         bench.fp8_gemm --graph (per projection, 256 rows, replayed from one CUDA graph)
# Each step runs under its own timeout; results in $OUT/fp8/<step>.jsonl (+ .log), the env in env.txt.
#   ASYNCRL_COMMIT=<the tree sent> bash bench/h200_fp8.sh     (FP8_SKIP="rl gemm" leaves steps out)
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=$OUT/fp8
mkdir -p "$RES"
export ASYNCRL_COMMIT=${ASYNCRL_COMMIT:-$(python -c "from bench.provenance import commit; print(commit())" 2>/dev/null || echo unknown)}
{ nvidia-smi; python -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
  echo "commit $ASYNCRL_COMMIT"; } >"$RES/env.txt" 2>&1

run() {  # run NAME TIMEOUT CMD...: stdout -> NAME.jsonl, stderr -> NAME.log; prints rc and the last lines
  local name=$1 t=$2; shift 2
  if [[ " ${FP8_SKIP:-} " == *" $name "* ]]; then echo "[fp8] $name: skipped"; return; fi
  local start=$SECONDS
  timeout -k 10 "$t" "$@" >"$RES/$name.jsonl" 2>"$RES/$name.log"
  echo "[fp8] $name: rc=$? after $((SECONDS - start))s"
  tail -n 4 "$RES/$name.jsonl" | cut -c1-400
}

run fp8_gpu 120 python -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_fp8_gpu.py
run batch256 150 python -m bench.generation --shapes 0.5b,1.5b --batches 256 --weights-dtypes model,fp8
run rl 200 python -m bench.generation --rl --shapes 0.5b --weights-dtypes model,fp8
run gemm 60 python -m bench.fp8_gemm --graph --iters 50
