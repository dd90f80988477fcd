#!/usr/bin/env bash
# A / B of kernel builds on the lent GPU: the builds are prebuilt here into .fcache (benchmarks/build_variants.py,
# same nvcc 13.0 as the device) and carried, so the device spends no time compiling.
# usage: bash benchmarks/device_build_ab.sh VARIANTS_FILE ROUNDS "TEST ARGS" -- PROBE COMMAND...
#   VARIANTS_FILE: one FASTNF4_NVCC_FLAGS value per line (BASE = none); each round runs the probe once per build,
#   the builds in file order; TEST ARGS (may be empty): pytest arguments run first under the second build's flags.
set -u
vfile=$1 rounds=$2 targs=$3
shift 4
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
OUT=${OUT:-/tmp/out}
mapfile -t builds < <(grep -v '^#' "$vfile" | grep -v '^$')
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ -n "$targs" ]; then
  f=${builds[1]}; [ "$f" = BASE ] && f=
  FASTNF4_NVCC_FLAGS="$f" timeout 200 python3 -m pytest -q -x -p no:cacheprovider $targs 2>&1 | tail -5 | tee $OUT/tests.log
fi
for r in $(seq 1 "$rounds"); do
  for f in "${builds[@]}"; do
    label=$f; [ "$f" = BASE ] && f=
    echo "== round $r: $label" | tee -a $OUT/probe.log
    FASTNF4_NVCC_FLAGS="$f" timeout 150 "$@" 2>&1 | grep -v Warning | tee -a $OUT/probe.log
  done
done
