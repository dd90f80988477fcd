#!/usr/bin/env bash
# Session 43 (this code is in wgmma.cu at 730bfe5 only; reverted): the weight quads with the statistics quads on the same mbarriers (-DFASTNF4_WG_WQUAD_STATS), 3 or 2
# stages: GPU tests of the wgmma kernel under it, the 17 weights at M = 128 (probe_wgmma_build.py) for each build of
# benchmarks/variants_s43_wquad2.txt but the last, then the stream skeleton (probe_wgmma_parts.py) of the last.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
OUT=${OUT:-/tmp/out}
FASTNF4_NVCC_FLAGS="-DFASTNF4_WG_WQUAD -DFASTNF4_WG_WQUAD_STATS" timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_wgmma.py 2>&1 | tail -2
cd benchmarks
mapfile -t builds < <(grep -v '^#' variants_s43_wquad2.txt)
for f in "${builds[@]:0:3}"; do
  [ "$f" = BASE ] && f=
  FASTNF4_NVCC_FLAGS="$f" timeout 280 python3 probe_wgmma_build.py "${f:-base}" --m 128 --json $OUT/wquad2-ab.json 2>&1 \
    | grep -v Warning | tail -1
done
for f in "${builds[3]}"; do
  echo "== $f"
  FASTNF4_NVCC_FLAGS="$f" timeout 150 python3 probe_wgmma_parts.py wq --small --ms 128 --five 2>&1 | grep -v Warning
done
