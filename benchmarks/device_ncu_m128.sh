# ncu (--set full) of bf16 cuBLAS and of fastnf4.linear at M = 128 on two weights (Llama gate_up, Gemma o): details
# pages as text under $OUT, a short table of the figures that compare them. Session 42.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name --format=csv,noheader
for s in "lgu 57344 8192" "go 5376 4096"; do
  set -- $s
  for which in cublas fastnf4; do
    timeout 240 $NCU --set full --profile-from-start off --import-source no python3 benchmarks/ncu_cublas_m128.py $which $2 $3 128 \
      > $OUT/ncu-$1-$which.txt 2>&1 || tail -5 $OUT/ncu-$1-$which.txt
    timeout 120 $NCU --profile-from-start off --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,launch__cluster_dim_x,launch__cluster_dim_y,launch__cluster_dim_z \
      python3 benchmarks/ncu_cublas_m128.py $which $2 $3 128 > $OUT/ncu-metrics-$1-$which.txt 2>&1
    echo "== $1 $which"
    grep -E '^  [a-zA-Z_].*\(|__' $OUT/ncu-metrics-$1-$which.txt | sed 's/  */ /g' | cut -c1-150
    grep -E '^  [a-zA-Z_].*\(|Duration|Cluster Size|Registers Per Thread|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Issued Warp Per Scheduler|Active Warps Per Scheduler|Grid Size|Block Size|L2 Hit Rate|Mem Busy|Max Bandwidth|SM Frequency' \
      $OUT/ncu-$1-$which.txt | sed 's/  */ /g' | cut -c1-150
  done
done
