#!/usr/bin/env bash
# On a GPU machine: build fastnf4's wheel from this tree, install it into a fresh environment with no CUDA toolkit on
# PATH, show `fastnf4 doctor`, and time `fastnf4 bench matmul` for the installed wheel against this checkout (and,
# when given, another tree, e.g. `git archive` of an older commit) in the same run.
#
#   tools/device_wheel_check.sh OUT [OTHER_TREE] -- [bench matmul options, e.g. --models qwen3-32b --m 1 16 128]
#   (BEFORE_BENCH="shell command" runs before the timed part; WHEEL=path installs that wheel instead of building one)
#
# Writes OUT/wheel-build.log, OUT/doctor.txt, OUT/doctor.json, OUT/bench-<installed|checkout|other>-<n>.json and
# prints a table of the fastnf4 times per row with the ratios to the installed wheel's.
set -u
out=$1; shift
other=""
if [ "${1:-}" != "--" ] && [ -n "${1:-}" ]; then other=$(cd "$1" && pwd); shift; fi
[ "${1:-}" = "--" ] && shift
root=$PWD
mkdir -p "$out"
python3 -c "import setuptools, torch; print('setuptools', setuptools.__version__, 'torch', torch.__version__)"

# 1. the wheel: WHEEL=path (built elsewhere from a clean clone), else built here from a clean copy of this tree
if [ -n "${WHEEL:-}" ]; then
  whl=$WHEEL
else
  src=$(mktemp -d)/src; mkdir -p "$src"
  tar -C "$root" --exclude=./.whl --exclude=./.peers --exclude=./.snap --exclude=./.old --exclude=./.dist \
      --exclude=./build --exclude='*.egg-info' --exclude=./fastnf4/_lib -cf - . | tar -C "$src" -xf -
  ( cd "$src" && FASTNF4_REQUIRE_CUDA_BUILD=1 python3 -m pip wheel . --no-deps --no-build-isolation -v -w /tmp/dist ) \
      > "$out/wheel-build.log" 2>&1 || { tail -40 "$out/wheel-build.log"; exit 1; }
  whl=$(ls /tmp/dist/fastnf4-*.whl)
fi
echo "wheel: $(basename "$whl") $(du -h "$whl" | cut -f1)"

# 2. a fresh folder holding only the wheel (the machine's python, torch and Triton; nothing of fastnf4 or this
#    checkout on the path), no CUDA toolkit on PATH, an empty kernel cache
python3 -m pip install -q --no-deps --no-index --target /tmp/fresh "$whl"
clean_path=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
run_installed() {
  (cd /tmp && env -u CUDA_HOME PYTHONPATH=/tmp/fresh PATH="$clean_path" FASTNF4_CACHE="$(mktemp -d)" "$@")
}
run_installed sh -c 'command -v nvcc && { echo "nvcc still on PATH"; exit 1; }; echo "no nvcc on PATH"' || exit 1
run_installed python3 -c "import fastnf4, sys; print('fastnf4 from', fastnf4.__file__); sys.exit(not fastnf4.__file__.startswith('/tmp/fresh/'))" || exit 1
run_installed python3 -m fastnf4 doctor > "$out/doctor.txt" 2>&1; echo "doctor exit $?"; cat "$out/doctor.txt"
run_installed python3 -m fastnf4 doctor --json > "$out/doctor.json" 2>/dev/null

# (BEFORE_BENCH: a command to finish first, e.g. waiting for other work on the machine, so that it does not share the GPU)
[ -n "${BEFORE_BENCH:-}" ] && eval "$BEFORE_BENCH"

# 3. bench matmul: installed, checkout, other, installed again (the spread of the same code shows in the two installed runs)
BENCH_ARGS=("$@")
i=0
for who in installed checkout ${other:+other} installed; do
  i=$((i + 1)); json="$out/bench-$who-$i.json"
  case $who in
    installed) run_installed sh -c "python3 -m fastnf4 bench matmul $* --json $json 2>&1 | grep -v '%|' | tail -2" ;;
    checkout) (cd "$root" && PYTHONPATH="$root:${PYTHONPATH:-}" FASTNF4_STRICT=1 python3 -m fastnf4 bench matmul "$@" --json "$json" 2>&1 | grep -v '%|' | tail -2) ;;
    other) (cd "$other" && PYTHONPATH="$other:${PYTHONPATH:-}" python3 -m fastnf4 bench matmul "$@" --json "$json" 2>&1 | grep -v '%|' | tail -2) ;;
  esac
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {os.path.basename(p)[6:-5]: json.load(open(p))["rows"] for p in sorted(glob.glob(f"{out}/bench-*.json"))}
names = list(runs)
base = names[0]
print("fastnf4 linear, median us (ratio to " + base + ")")
print("layer            N      K     M  " + "  ".join(f"{n:>20}" for n in names))
summary = {n: [] for n in names}
for i, r in enumerate(runs[base]):
    cells = []
    for n in names:
        t = runs[n][i]["fastnf4_us"]
        ratio = t / r["fastnf4_us"]
        summary[n].append(ratio)
        cells.append(f"{t:9.1f} ({ratio:5.3f})")
    print(f"{r['layer']:<12} {r['N']:>6} {r['K']:>6} {r['M']:>5}  " + "  ".join(f"{c:>20}" for c in cells))
for n in names:
    print(f"{n}: ratio to {base} min {min(summary[n]):.3f} max {max(summary[n]):.3f}")
json.dump({"base": base, "ratios": summary}, open(f"{out}/compare.json", "w"))
PY
