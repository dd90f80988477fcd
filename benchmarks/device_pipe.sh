# Device script for a decode-kernel iteration: GPU tests of the kernel, SASS histogram of the M <= 2 kernel's
# loop, ncu summary on Llama gate_up M = 1, then benchmarks/check_mma.py (QUICK=1: 5 shapes) for M = 1 2 4.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASTNF4_COMMIT=$(cat benchmarks/.commit)
timeout 200 python3 -m pytest -q -x --tb=short -p no:cacheprovider tests/gpu/test_gemv_mma.py 2>&1 | grep -v Warn | tail -30
so=$(ls -t ~/.cache/fastnf4/*.so 2>/dev/null | head -1)
if [ -n "$so" ]; then
  cuobjdump -sass -fun '_ZN11fastnf4_mma13gemv_mma_pipeI13__nv_bfloat16Li1ELb1EEEvNS_6ParamsE' $so > $OUT/pipe.sass 2>&1
  echo "== SASS (bf16, CG 1, nested): $(grep -c '/\*[0-9a-f]\{4\}\*/' $OUT/pipe.sass) instructions"
  grep -o '^ */\*[0-9a-f]*\*/ *[@!PT0-9 ]*[A-Z][A-Z0-9_.]*' $OUT/pipe.sass | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -14 | tr '\n' ' '; echo
  grep -m3 'LDS' $OUT/pipe.sass
fi
timeout 120 ncu --clock-control none -k regex:gemv_mma --launch-skip 2 --launch-count 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy python3 benchmarks/ncu_mma.py > $OUT/ncu.txt 2>&1
grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Achieved Active|Registers" $OUT/ncu.txt
QUICK=${QUICK-1} timeout 300 python3 benchmarks/check_mma.py $OUT/mma.json ${MS:-1 2 4} 2>&1 | grep -v Warn | cut -c1-200 | tail -22
# variants of the M <= 2 kernel (warps per block, ring stages): kernel time only, M = 1
for v in ${VARIANTS:-"-DFASTNF4_PIPE_STAGES1=5"}; do
  [ -n "${NOVAR:-}" ] && break
  echo "== variant $v"; FASTNF4_NVCC_FLAGS="$v" MMA_ONLY=1 QUICK=1 timeout 100 python3 benchmarks/check_mma.py "" 1 2>&1 | grep -v Warn | grep "M=1" | cut -c1-75
done
