"""Prebuild a CUDA source with several FASTNF4_NVCC_FLAGS sets into $FASTNF4_CACHE, for benchmarks/device_build_ab.sh:
the device copy then loads them instead of compiling (the cache key is the source, the target and the flags; the
local nvcc is the device's 13.0).
usage: python benchmarks/build_variants.py VARIANTS_FILE SOURCE.cu [ARCH]
  VARIANTS_FILE: one flag set per line (BASE = none, # comments); ARCH: sm_90 (default), sm_90a for wgmma.cu."""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from fastnf4 import _cuda

source = sys.argv[2]
arch = sys.argv[3] if len(sys.argv) > 3 else "sm_90"
lines = [line.strip() for line in open(sys.argv[1]) if line.strip() and not line.startswith("#")]
flag_sets = ["" if line == "BASE" else line for line in lines]
with ThreadPoolExecutor(2) as pool:
    libs = pool.map(lambda f: _cuda.compile_source(source, arch, extra=tuple(f.split())), flag_sets)
    for flags, lib in zip(flag_sets, libs):
        print(repr(flags), os.path.basename(lib))
