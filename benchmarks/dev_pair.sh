set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
cd benchmarks
timeout 500 python3 probe_pair_cols.py --ms 3,4 $OUT/h200-probe-pair-cols-local.json 2>&1 | tail -50
