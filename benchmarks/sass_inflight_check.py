"""SASS check of the wgmma builds with and without -DFASTNF4_WG_PIPE (session 43): HGMMA groups, A-fragment writes while
a group is in flight (tests/test_matmul.py), and the waits. The PIPE code is in wgmma.cu at 2d39d81 only (reverted). usage: FASTNF4_CACHE=... python benchmarks/sass_inflight_check.py"""
import glob, subprocess, sys
sys.path.insert(0, "tests")
from test_matmul import _cuobjdump, _in_flight_fragment_writes
from fastnf4 import _cuda
from fastnf4.ops.matmul import wgmma
for flags in ("", "-DFASTNF4_WG_PIPE"):
    lib = _cuda.compile_source(wgmma.SOURCE, "sm_90a", extra=tuple(flags.split()))
    sass = subprocess.run([_cuobjdump(), "-sass", lib], capture_output=True, text=True, check=True).stdout
    g, bad = _in_flight_fragment_writes(sass)
    print(f"SASS check {flags or 'BASE'}: {g} groups, {len(bad)} in-flight writes", bad[:5])
    print("  DEPBAR gsb0 0x1:", sass.count("DEPBAR.LE gsb0, 0x1"), " 0x0:", sass.count("DEPBAR.LE gsb0, 0x0"))
