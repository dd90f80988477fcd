#!/usr/bin/env bash
# One call on a GPU machine: install the carried bitsandbytes wheel (.whl/*.whl), then run the steps named in $@,
# each under its own time limit, logs and results under $OUT.
#
#   rcp                the rcp.approx exception table (tools/rcp_table.py) -> $OUT/rcp_approx_exceptions.safetensors
#   tune               dequantize tile / warp sweep (tools/tune_dequant.py) -> $OUT/tune.json
#   tune-matmul        Triton GEMV / GEMM configuration sweep (tools/tune_matmul.py) -> $OUT/tune-matmul.json
#   gpu-tests          tests/gpu
#   integration-tests  the transformers / bitsandbytes / PEFT tests with this machine's libraries (bitsandbytes loads
#                      its CUDA library wherever a GPU is, and its CPU decode differs there)
#   multi-gpu          tests/gpu/test_multi_gpu.py (a machine with two GPUs)
#   bench-dequant, bench-quantize, bench-matmul, bench-paper
#                      `fastnf4 bench NAME` -> $OUT/<gpu>-NAME.json
#   bench-e2e          `fastnf4 bench e2e` per model (E2E_MODELS, default all three) -> $OUT/<gpu>-e2e-<model>.json
#
# usage (repository root): git rev-parse --short HEAD > benchmarks/.commit   (the device copy has no .git; the
# commit goes into every result's env), then on the GPU machine: OUT=... bash tools/device_run.sh gpu-tests bench-matmul
# The sanitizer has its own script: tools/device_sanitize.sh.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -f benchmarks/.commit ] && export FASTNF4_COMMIT=$(cat benchmarks/.commit)
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# result files are named by the card that ran them (h100, h200; "gpu" for any other)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]\{3\}' | head -1 | tr H h)
gpu=${gpu:-gpu}
python3 -c "import torch, triton, bitsandbytes; print(torch.__version__, triton.__version__, bitsandbytes.__version__)"
bench() {  # name, time limit, extra arguments...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m fastnf4 bench "$name" "$@" 2>&1 | grep -v '%|'
}
for step in "$@"; do
  case $step in
    rcp) timeout 120 python3 tools/rcp_table.py "$OUT" 2>&1 | tee "$OUT/rcp.log" ;;
    tune) timeout 240 python3 tools/tune_dequant.py "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" ;;
    tune-matmul) timeout 420 python3 tools/tune_matmul.py "$OUT/tune-matmul.json" 2>&1 | tee "$OUT/tune-matmul.log" ;;
    gpu-tests) timeout 420 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu 2>&1 | tail -60 \
      | tee "$OUT/gpu-tests.log" ;;
    integration-tests) timeout 200 python3 -m pytest -q -rs --tb=short -p no:cacheprovider \
      tests/integrations/test_transformers.py tests/integrations/test_fuzz_transformers.py \
      tests/integrations/test_bnb_patch.py tests/integrations/test_peft.py 2>&1 | tail -30 \
      | tee "$OUT/integration-tests.log" ;;
    multi-gpu) timeout 400 python3 -m pytest -q -rs --tb=short -p no:cacheprovider tests/gpu/test_multi_gpu.py 2>&1 \
      | tail -40 | tee "$OUT/multi-gpu-tests.log" ;;
    bench-dequant) bench dequant 200 --json "$OUT/$gpu-dequant.json" | tee "$OUT/bench-dequant.log" ;;
    bench-quantize) bench quantize 150 --json "$OUT/$gpu-quantize.json" | tee "$OUT/bench-quantize.log" ;;
    bench-matmul) bench matmul 560 --json "$OUT/$gpu-matmul.json" | tee "$OUT/bench-matmul.log" ;;
    bench-paper) bench paper 300 --json "$OUT/$gpu-paper.json" | tee "$OUT/bench-paper.log" ;;
    bench-e2e)
      for model in ${E2E_MODELS:-llama-3.3-70b qwen3-32b gemma-3-27b}; do
        bench e2e 560 --models "$model" --json "$OUT/$gpu-e2e-$model.json"
      done 2>&1 | tee "$OUT/bench-e2e.log" ;;
    *) echo "unknown step: $step" ;;
  esac
done
