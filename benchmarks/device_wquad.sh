#!/usr/bin/env bash
# Session 43 (the WQUAD code is in wgmma.cu at d0e0e04 only; reverted): the 192-row build with its weights in 128-byte row pieces (-DFASTNF4_WG_WQUAD): GPU tests of the wgmma
# kernel under it, then the 17 weights at M = 128 (probe_wgmma_build.py: error check, graph timing beside cuBLAS), base
# and WQUAD alternating, 2 rounds; then the weight-stream skeleton of both (probe_wgmma_parts.py). Builds prebuilt into
# .fcache from benchmarks/variants_s43_wquad.txt.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
OUT=${OUT:-/tmp/out}
FASTNF4_NVCC_FLAGS=-DFASTNF4_WG_WQUAD timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_wgmma.py 2>&1 | tail -3
cd benchmarks
for r in 1 2; do
  for f in "" "-DFASTNF4_WG_WQUAD"; do
    FASTNF4_NVCC_FLAGS="$f" timeout 280 python3 probe_wgmma_build.py "${f:-base}" --m 128 --json $OUT/wquad-ab.json 2>&1 \
      | grep -v Warning | tail -1
  done
done
while read -r f; do
  [ "$f" = BASE ] && f=
  echo "== $f"
  FASTNF4_NVCC_FLAGS="$f" timeout 150 python3 probe_wgmma_parts.py wq --small --ms 128 --five 2>&1 | grep -v Warning
done < variants_s43_wquad.txt
