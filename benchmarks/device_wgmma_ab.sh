#!/usr/bin/env bash
# One call on the lent GPU: the wgmma GPU tests on the default build, then an A / B of two wgmma.cu builds
# (FASTNF4_NVCC_FLAGS "$A" against "$B") with probe_wgmma_build.py at the M values in $MS (ROUNDS rounds each,
# alternating), then, if $DIAGS is set, probe_wgmma_parts.py --small at $DIAG_MS for the default build and each
# diagnostic flag set in $DIAGS (";"-separated).
# Logs and JSON under $OUT. usage: A=... B=... MS="16 32" ROUNDS=2 DIAGS="-DX;-DY" bash benchmarks/device_wgmma_ab.sh
set -u
export PYTHONPATH=$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu/test_wgmma.py 2>&1 | tail -15 | tee $OUT/tests.log
fi
for m in ${MS:-16 32}; do
  for r in $(seq 1 ${ROUNDS:-2}); do
    FASTNF4_NVCC_FLAGS="${A:-}" timeout 150 python3 benchmarks/probe_wgmma_build.py "A${r}" --m $m --json $OUT/ab.json 2>&1 | tail -3
    FASTNF4_NVCC_FLAGS="${B:-}" timeout 150 python3 benchmarks/probe_wgmma_build.py "B${r}" --m $m --json $OUT/ab.json 2>&1 | tail -3
  done
done
[ -z "${DIAGS:-}" ] && exit 0
IFS=';' read -ra D <<< "${DIAGS:-}"
for f in "" "${D[@]}"; do
  FASTNF4_NVCC_FLAGS="$f" timeout 120 python3 benchmarks/probe_wgmma_parts.py "diag[$f]" $OUT/diag-$(echo "$f" | tr -dc 'A-Za-z0-9_').json --small --ms ${DIAG_MS:-16} 2>&1 | tail -8
done
