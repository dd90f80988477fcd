# Device script for the CUDA decode kernel: GPU tests, then benchmarks/check_mma.py (correctness + timing).
# Variants build with FASTNF4_NVCC_FLAGS="-DFASTNF4_MMA_UNROLL=4 -DFASTNF4_MMA_MIN_BLOCKS=3" and QUICK=1 (5 shapes).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASTNF4_COMMIT=$(cat benchmarks/.commit)
timeout 280 python3 -m pytest -q --tb=short -p no:cacheprovider tests/gpu 2>&1 | grep -v Warn | tail -25
echo "== check (full)"; timeout 280 python3 benchmarks/check_mma.py $OUT/h200-mma-check.json 1 2 4 8 2>&1 | grep -v Warn | cut -c1-220 | head -3
