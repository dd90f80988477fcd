"""SASS check of wgmma.cu builds (session 43): HGMMA groups, A-fragment writes while a group is in flight (the scan of
tests/test_matmul.py) and the count of each wgmma wait, for each flag set given (one argument each; none: the default
build). Session 43 ran it on -DFASTNF4_WG_PIPE, whose code is in wgmma.cu at 2d39d81 only (reverted).
usage: FASTNF4_CACHE=... python benchmarks/sass_inflight_check.py ["-DFLAG ..." ...]"""
import subprocess
import sys

sys.path.insert(0, "tests")
from test_matmul import _cuobjdump, _in_flight_fragment_writes  # noqa: E402

from fastnf4 import _cuda  # noqa: E402
from fastnf4.ops.matmul import wgmma  # noqa: E402

for flags in [""] + sys.argv[1:]:
    lib = _cuda.compile_source(wgmma.SOURCE, "sm_90a", extra=tuple(flags.split()))
    sass = subprocess.run([_cuobjdump(), "-sass", lib], capture_output=True, text=True, check=True).stdout
    groups, bad = _in_flight_fragment_writes(sass)
    print(f"SASS check {flags or 'default'}: {groups} groups, {len(bad)} in-flight writes", bad[:5])
    print("  waits:", {n: sass.count(f"DEPBAR.LE gsb0, 0x{n}") for n in range(4)})
