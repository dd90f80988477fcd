#!/usr/bin/env bash
# One call on the lent GPU: every kernel under compute-sanitizer (tools/sanitize.py): memcheck over all parts,
# synccheck and initcheck on the quick shape set, racecheck on one launch per CUDA build. Each tool's log under $OUT,
# a summary line per run here. Every tensor its own allocation (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so that a read
# past an array's end is a read past an allocation. ~4 minutes on an H200.
# usage (repository root): FASTNF4_CACHE=$PWD/.fcache bash tools/device_sanitize.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
OUT=${OUT:-/tmp/out}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name --format=csv,noheader
$CS --version | tail -1
run() {  # tool, timeout, parts...
  local tool=$1 limit=$2 log="$OUT/$1-${3}.log"
  shift 2
  timeout "$limit" "$CS" --tool "$tool" --error-exitcode 3 --print-limit 10 python3 tools/sanitize.py "$@" \
    > "$log" 2>&1
  echo "$tool $*: rc=$? | $(grep -E '^sanitize:' "$log") | $(grep -E 'SUMMARY' "$log")"
}
run memcheck 300 triton gemv_mma wgmma linear
FASTNF4_SANITIZE_QUICK=1 run synccheck 80 gemv_mma wgmma
FASTNF4_SANITIZE_QUICK=1 run initcheck 80 gemv_mma wgmma
run racecheck 100 race
