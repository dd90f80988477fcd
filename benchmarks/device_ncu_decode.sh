# ncu (--set full) of one M = 1 decode-kernel launch on three model weights: details and source pages as CSV under
# $OUT (summarise with benchmarks/ncu_summary.py SRC.csv WARPS [CUT ...]). Session 34; results/h200-ncu-decode-m1.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FASTNF4_CACHE=/tmp/fcache
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name --format=csv,noheader
python3 benchmarks/ncu_mma.py 64 256 1 >/dev/null 2>&1   # build the library once
for s in "qo 8192 8192" "qgu 25600 5120" "gd 5376 21504"; do
  set -- $s
  $NCU --set full --import-source no -k regex:gemv --launch-skip 3 --launch-count 1 -o /tmp/r_$1 python3 benchmarks/ncu_mma.py $2 $3 1 > /tmp/log_$1 2>&1 || tail -5 /tmp/log_$1
  $NCU -i /tmp/r_$1.ncu-rep --page details --csv > $OUT/det_$1.csv 2>&1
  $NCU -i /tmp/r_$1.ncu-rep --page source --csv > $OUT/src_$1.csv 2>&1
  ls -la $OUT/det_$1.csv $OUT/src_$1.csv
  grep -E '"Duration"|"Memory Throughput"|"Issue Slots Busy"|"Registers Per Thread"|"Block Size"|"Grid Size"' $OUT/det_$1.csv | cut -d, -f5,12- | head -8
done
