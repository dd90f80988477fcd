#!/usr/bin/env bash
# On a GPU machine, one call: this tree's GPU suite, then `fastnf4 bench matmul` of this tree and of another one (an
# older commit's `git archive`, e.g. to show that a refactor changed no speed) run alternately twice each, and a
# per-row table of this tree's best-of-two time over the other's, with each tree's own run-to-run spread beside it.
#
#   tools/device_compare.sh OUT OTHER_TREE [bench matmul options, e.g. --models qwen3-32b --m 1 16 128 512]
#
# CUDA libraries: this tree uses fastnf4/_lib when it holds a wheel build (manifest.json and the libraries; *.gz files
# there are unpacked first: carry them compressed), else nvcc at first use; the other tree builds its own with nvcc in
# the background while the suite runs (on six CPU cores, at low priority). bitsandbytes comes from .whl/*.whl (the
# suite's bitsandbytes tests) and stays off the path of the timed runs. Writes OUT/gpu-tests.log,
# OUT/bench-{this,other,this2,other2}.json and OUT/compare.json.
set -u
out=$1; other=$(cd "$2" && pwd); shift 2
root=$PWD
mkdir -p "$out"
ls fastnf4/_lib/*.gz >/dev/null 2>&1 && gunzip -f fastnf4/_lib/*.gz
python3 -c "import fastnf4._cuda as c; print('this tree, packaged libraries:', c._manifest()[1] or 'manifest ok')"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
export PYTHONUNBUFFERED=1
( cd "$other" && PYTHONPATH=$other nice -n 19 taskset -c 10-15 python3 -c "
import fastnf4
from fastnf4.ops.matmul import gemv_mma, wgmma
print('other tree libraries:', gemv_mma._lib_for(0) is not None, wgmma._lib_for(0) is not None)" \
    > "$out/other-build.log" 2>&1 ) &
pid=$!
t0=$(date +%s)
FASTNF4_COMMIT=$(cat benchmarks/.commit 2>/dev/null) PYTHONPATH=/tmp/site:$root timeout "${SUITE_TIMEOUT:-330}" \
    python3 -m pytest -q --tb=short -p no:cacheprovider --durations=8 tests/gpu 2>&1 | tail -80 > "$out/gpu-tests.log"
echo "gpu suite: $(( $(date +%s) - t0 )) s: $(tail -1 "$out/gpu-tests.log")"
wait $pid; cat "$out/other-build.log"
for who in this other this2 other2; do
  case $who in this*) dir=$root;; *) dir=$other;; esac
  t0=$(date +%s)
  ( cd "$dir" && PYTHONPATH=$dir timeout "${BENCH_TIMEOUT:-120}" python3 -m fastnf4 bench matmul "$@" \
      --json "$out/bench-$who.json" 2>&1 | grep -v '%|' | tail -1 )
  echo "bench $who: $(( $(date +%s) - t0 )) s"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {w: {(r["model"], r["layer"], r["M"]): r for r in json.load(open(f"{out}/bench-{w}.json"))["rows"]}
        for w in ("this", "other", "this2", "other2")}
ratio, spread_this, spread_other = [], [], []
print(f"{'model':<16} {'layer':<10} {'N':>6} {'K':>6} {'M':>4}  {'path':<14} {'this':>8} {'this2':>8} {'other':>8} "
      f"{'other2':>8}  best this/other")
for key, r in runs["this"].items():
    t = {w: runs[w][key]["fastnf4_us"] for w in runs}
    ratio.append(min(t["this"], t["this2"]) / min(t["other"], t["other2"]))
    spread_this.append(t["this2"] / t["this"])
    spread_other.append(t["other2"] / t["other"])
    print(f"{key[0]:<16} {key[1]:<10} {r['N']:>6} {r['K']:>6} {key[2]:>4}  {r['path']:<14} {t['this']:8.1f} "
          f"{t['this2']:8.1f} {t['other']:8.1f} {t['other2']:8.1f}  {ratio[-1]:6.3f}")
print(f"rows {len(ratio)}: best-of-two this/other {min(ratio):.3f}-{max(ratio):.3f}; the same code twice: this2/this "
      f"{min(spread_this):.3f}-{max(spread_this):.3f}, other2/other {min(spread_other):.3f}-{max(spread_other):.3f}")
json.dump({"best_of_two_this_over_other": ratio, "this2_over_this": spread_this, "other2_over_other": spread_other},
          open(f"{out}/compare.json", "w"))
PY
