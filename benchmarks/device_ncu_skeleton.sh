#!/usr/bin/env bash
# Session 43: ncu stall breakdown of the wgmma kernel at M = 128 on Llama gate_up (the 192-row build), the production
# build beside its weight-stream skeleton (-DFASTNF4_WG_NO_DECODE -DFASTNF4_WG_NO_MMA -DFASTNF4_WG_NO_XLOAD): why a
# step of the skeleton takes ~0.5 us. Builds prebuilt into .fcache from benchmarks/variants_s43_ncu.txt.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FASTNF4_CACHE=$PWD/.fcache
OUT=${OUT:-/tmp/out}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
while read -r f; do
  [ "$f" = BASE ] && f=
  tag=${f:+skeleton}; tag=${tag:-base}
  FASTNF4_NVCC_FLAGS="$f" timeout 200 $NCU --profile-from-start off -k regex:nf4_wgmma \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,dram__bytes_read.sum.per_second,sm__cycles_elapsed.avg" \
    python3 benchmarks/ncu_cublas_m128.py fastnf4 57344 8192 128 > $OUT/ncu-skeleton-$tag.txt 2>&1
  echo "== $tag"
  grep -E "duration|inst_executed|issue_active|warps_active|dram__bytes|cycles_elapsed|stalled" $OUT/ncu-skeleton-$tag.txt \
    | awk '{v=$NF; if (v+0 > 0.05 || $1 !~ /stalled/) print $1, $(NF-1), v}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
done < benchmarks/variants_s43_ncu.txt
