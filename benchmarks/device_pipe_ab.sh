#!/usr/bin/env bash
# Session 43 (the PIPE code is in wgmma.cu at 2d39d81 only; reverted): wgmma.cu with and without -DFASTNF4_WG_PIPE on every model weight of >= 8 MB (probe_wgmma_build.py:
# error check, then graph timing beside cuBLAS), at M = 512 and 128, builds alternating, ROUNDS rounds; the builds
# prebuilt into .fcache (benchmarks/build_variants.py benchmarks/variants_s43_pipe.txt). JSON: $OUT/pipe-ab.json.
set -u
rounds=${1:-2}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
OUT=${OUT:-/tmp/out}
cd benchmarks
for m in 512 128; do
  for r in $(seq 1 "$rounds"); do
    for f in "" "-DFASTNF4_WG_PIPE"; do
      FASTNF4_NVCC_FLAGS="$f" timeout 280 python3 probe_wgmma_build.py "${f:-base}" --m $m --json $OUT/pipe-ab.json 2>&1 \
        | grep -v Warning | tail -2
    done
  done
done
