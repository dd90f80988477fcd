#!/usr/bin/env bash
# One call on the lent GPU: install the carried bitsandbytes wheel, then run the steps named in $@
# (rcp, tune, gpu-tests, integration-tests, bench-dequant, bench-quantize, ...), each with its own time limit, logs under $OUT.
# Results: $OUT/<h100|h200>-<bench>.json. Before the call: git rev-parse --short HEAD > benchmarks/.commit (the device copy has no .git).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -f benchmarks/.commit ] && export FASTNF4_COMMIT=$(cat benchmarks/.commit)
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# result files are named by the card that ran them (the device tool may hand out an H100 when an H200 is asked for)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]\{3\}' | head -1 | tr H h)
gpu=${gpu:-gpu}
python3 -c "import torch, triton, bitsandbytes; print(torch.__version__, triton.__version__, bitsandbytes.__version__)"
for step in "$@"; do
  case $step in
    rcp) timeout 120 python3 benchmarks/rcp_table.py $OUT 2>&1 | tee $OUT/rcp.log ;;
    tune) timeout 240 python3 benchmarks/tune_dequant.py $OUT/tune.json 2>&1 | tee $OUT/tune.log ;;
    gpu-tests) timeout 420 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu 2>&1 | tail -60 | tee $OUT/gpu-tests.log ;;
    # the CPU tests of the integrations with the GPU machine's transformers and bitsandbytes' CUDA-build library (which
    # bitsandbytes loads wherever a GPU is; its CPU decode differs there, session 41); -rs lists anything skipped
    integration-tests) timeout 200 python3 -m pytest -q -rs --tb=short -p no:cacheprovider tests/test_transformers.py \
      tests/test_fuzz_transformers.py tests/test_bnb_patch.py tests/test_peft.py 2>&1 | tail -30 | tee $OUT/integration-tests.log ;;
    # two GPUs (kind nvidia-h200-x2): the device-guard tests, then probe_multi_gpu.py's cases (one process each) with
    # this package and, where carried as .mgpu_old/fastnf4 (git archive 0089436 fastnf4), the package before the guard
    multi-gpu) timeout 400 python3 -m pytest -q -rs --tb=short -p no:cacheprovider tests/gpu/test_multi_gpu.py 2>&1 \
      | tail -40 | tee $OUT/multi-gpu-tests.log
      for pkg in $PWD .mgpu_old; do
        [ -d $pkg/fastnf4 ] || continue
        for case in quantize dequantize 1 64 700; do
          echo "[$pkg] $(PYTHONPATH=/tmp/site:$pkg timeout 240 python3 benchmarks/probe_multi_gpu.py $case 2>&1 | tail -1)"
        done
      done 2>&1 | tee $OUT/multi-gpu-probe.log ;;
    bench-dequant) timeout 200 python3 -m fastnf4 bench dequant --json $OUT/$gpu-dequant.json 2>&1 | grep -v '%|' | tee $OUT/bench-dequant.log ;;
    tune-matmul) timeout 420 python3 benchmarks/tune_matmul.py $OUT/tune-matmul.json 2>&1 | tee $OUT/tune-matmul.log ;;
    bench-matmul) timeout 560 python3 -m fastnf4 bench matmul --json $OUT/$gpu-matmul.json 2>&1 | grep -v '%|' | tee $OUT/bench-matmul.log ;;
    bench-paper) timeout 300 python3 -m fastnf4 bench paper --json $OUT/$gpu-paper.json 2>&1 | grep -v '%|' | tee $OUT/bench-paper.log ;;
    bench-quantize) timeout 150 python3 -m fastnf4 bench quantize --json $OUT/$gpu-quantize.json 2>&1 | grep -v '%|' | tee $OUT/bench-quantize.log ;;
  esac
done
