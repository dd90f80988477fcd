# Device script for a kernel iteration of gemv_mma.cu: GPU tests of the kernels, SASS histogram of one kernel
# (SASS_FN, default the M <= 2 decode kernel), ncu summary on Llama gate_up (NCU_SHAPE="N K M", NONCU=1 skips),
# then benchmarks/check_mma.py (QUICK=1: 5 shapes) for MS (default 1 2 4), then build variants (VARIANTS, kernel
# time only, at VMS, default 1; NOVAR=1 skips).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASTNF4_COMMIT=$(cat benchmarks/.commit)
timeout 200 python3 -m pytest -q -x --tb=short -p no:cacheprovider tests/gpu/test_gemv_mma.py 2>&1 | grep -v Warn | tail -30
so=$(ls -t ~/.cache/fastnf4/*.so 2>/dev/null | head -1)
if [ -n "$so" ]; then
  fn=${SASS_FN:-_ZN11fastnf4_mma13gemv_mma_pipeI13__nv_bfloat16Li1ELb1EEEvNS_6ParamsE}
  cuobjdump -sass -fun "$fn" $so > $OUT/pipe.sass 2>&1
  echo "== SASS ($fn): $(grep -c '/\*[0-9a-f]\{4\}\*/' $OUT/pipe.sass) instructions"
  grep -o '^ */\*[0-9a-f]*\*/ *[@!PT0-9 ]*[A-Z][A-Z0-9_.]*' $OUT/pipe.sass | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -14 | tr '\n' ' '; echo
  grep -m3 'LDS' $OUT/pipe.sass
fi
if [ -z "${NONCU:-}" ]; then
  timeout 120 ncu --clock-control none -k regex:mma_pipe --launch-skip 2 --launch-count 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy python3 benchmarks/ncu_mma.py ${NCU_SHAPE:-} > $OUT/ncu.txt 2>&1
  grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Achieved Active|Registers" $OUT/ncu.txt
fi
QUICK=${QUICK-1} timeout 300 python3 benchmarks/check_mma.py $OUT/mma.json ${MS:-1 2 4} 2>&1 | grep -v Warn | cut -c1-200 | tail -40
# build variants (warps per block, ring stages): kernel time only
for v in ${VARIANTS:-"-DFASTNF4_PIPE_STAGES1=5"}; do
  [ -n "${NOVAR:-}" ] && break
  echo "== variant $v"; FASTNF4_NVCC_FLAGS="$v" MMA_ONLY=1 QUICK=1 timeout 100 python3 benchmarks/check_mma.py "" ${VMS:-1} 2>&1 | grep -v Warn | grep "M=" | cut -c1-75
done
