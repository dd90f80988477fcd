#!/usr/bin/env bash
# On a GPU machine, one call: this tree's GPU suite, then `fastnf4 bench matmul` of this tree and of another one (an
# older commit's `git archive`, e.g. to show that a refactor changed no speed) run alternately ROUNDS times each
# (default 2: the H200 suite takes ~320 s of the 600 s a device call may run, its time-out SUITE_TIMEOUT defaults to
# 450 s, and two models at four M are ~28 s per bench run), and a per-row table of this tree's best time over the
# other's, with each tree's own run-to-run spread (slowest / fastest of its runs) beside it.
#
#   tools/device_compare.sh OUT OTHER_TREE [bench matmul options, e.g. --models qwen3-32b --m 1 16 128 512]
#
# CUDA libraries: this tree uses fastnf4/_lib when it holds a wheel build (manifest.json and the libraries; *.gz files
# there are unpacked first: carry them compressed), else nvcc at first use; the other tree builds its own with nvcc in
# the background while the suite runs (on six CPU cores, at low priority). bitsandbytes comes from .whl/*.whl (the
# suite's bitsandbytes tests) and stays off the path of the timed runs. Writes OUT/gpu-tests.log,
# OUT/bench-{this,other}-<round>.json and OUT/compare.json.
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
FASTNF4_COMMIT=$(cat benchmarks/.commit 2>/dev/null) PYTHONPATH=/tmp/site:$root timeout "${SUITE_TIMEOUT:-450}" \
    python3 -m pytest -q --tb=short -p no:cacheprovider --durations=8 tests/gpu 2>&1 | tail -80 > "$out/gpu-tests.log"
echo "gpu suite: $(( $(date +%s) - t0 )) s: $(tail -1 "$out/gpu-tests.log")"
wait $pid; cat "$out/other-build.log"
rounds=${ROUNDS:-2}
for r in $(seq 1 "$rounds"); do
  for who in this other; do
    case $who in this) dir=$root;; *) dir=$other;; esac
    t0=$(date +%s)
    ( cd "$dir" && PYTHONPATH=$dir timeout "${BENCH_TIMEOUT:-120}" python3 -m fastnf4 bench matmul "$@" \
        --json "$out/bench-$who-$r.json" 2>&1 | grep -v '%|' | tail -1 )
    echo "bench $who round $r: $(( $(date +%s) - t0 )) s"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {(w, i): {(r["model"], r["layer"], r["M"]): r for r in json.load(open(f"{out}/bench-{w}-{i}.json"))["rows"]}
        for w in ("this", "other") for i in range(1, rounds + 1)}
ratio, spread = [], {"this": [], "other": []}
print(f"{'model':<16} {'layer':<10} {'N':>6} {'K':>6} {'M':>4}  {'path':<14} {'this best':>9} {'other best':>10}  "
      f"this/other  spread this / other")
for key, r in runs[("this", 1)].items():
    t = {w: [runs[(w, i)][key]["fastnf4_us"] for i in range(1, rounds + 1)] for w in ("this", "other")}
    ratio.append(min(t["this"]) / min(t["other"]))
    for w in t:
        spread[w].append(max(t[w]) / min(t[w]))
    print(f"{key[0]:<16} {key[1]:<10} {r['N']:>6} {r['K']:>6} {key[2]:>4}  {r['path']:<14} {min(t['this']):9.1f} "
          f"{min(t['other']):10.1f}  {ratio[-1]:10.3f}  {spread['this'][-1]:.3f} / {spread['other'][-1]:.3f}")
print(f"rows {len(ratio)}: best-of-{rounds} this/other {min(ratio):.3f}-{max(ratio):.3f}; the same code's slowest / "
      f"fastest run: this up to {max(spread['this']):.3f}, other up to {max(spread['other']):.3f}")
json.dump({"rounds": rounds, "best_this_over_other": ratio, "spread_this": spread["this"],
           "spread_other": spread["other"]}, open(f"{out}/compare.json", "w"))
PY
