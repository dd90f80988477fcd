python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASTNF4_COMMIT=$(cat benchmarks/.commit)
echo "== default (full check)"; timeout 300 python3 benchmarks/check_mma.py $OUT/mma.json 1 2 4 8 2>&1 | grep -v Warn | cut -c1-250
for F in "-DFASTNF4_MMA_MIN_BLOCKS=3" "-DFASTNF4_MMA_MIN_BLOCKS=5"; do echo "== $F"; QUICK=1 FASTNF4_NVCC_FLAGS="$F" timeout 100 python3 benchmarks/check_mma.py $OUT/mma$F.json 1 4 2>&1 | grep -v Warn | cut -c1-140; done
