set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
cd benchmarks
timeout 400 python3 probe_small_m_plans.py --m 16,24,32 --only "gemma o,gemma q" $OUT/h200-probe-gemma-o-m16-32.json 2>&1 | tail -20
