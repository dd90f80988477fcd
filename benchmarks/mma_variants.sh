python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASTNF4_COMMIT=$(cat benchmarks/.commit)
python3 -c "
import torch,fastnf4
from fastnf4.ops.matmul import gemv_mma
l=gemv_mma._lib_for(0); print('occ',l.occupancy)
print(gemv_mma.plan(1,57344,8192,132*4*4), gemv_mma.plan(1,1024,8192,132*4*4))
" 2>&1 | grep -v Warn
for U in 2 4; do echo "== UNROLL $U"; QUICK=1 FASTNF4_NVCC_FLAGS="-DFASTNF4_MMA_UNROLL=$U" timeout 150 python3 benchmarks/check_mma.py $OUT/mma-u$U.json 1 4 8 2>&1 | grep -v Warn | cut -c1-140; done
