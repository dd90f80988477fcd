"""Prebuild CUDA sources for sm_90 with several FASTNF4_NVCC_FLAGS sets into $FASTNF4_CACHE (for
benchmarks/device_build_ab.sh). usage: python benchmarks/build_variants.py VARIANTS_FILE SOURCE.cu [ARCH] (ARCH default sm_90; wgmma.cu: sm_90a)"""
import sys, os
from concurrent.futures import ThreadPoolExecutor
from fastnf4 import _cuda
flags = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith('#')]
flags = ['' if f == 'BASE' else f for f in flags]
def b(f):
    return _cuda.compile_source(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else 'sm_90', extra=tuple(f.split()))
with ThreadPoolExecutor(2) as ex:
    for f, r in zip(flags, ex.map(b, flags)):
        print(repr(f), os.path.basename(r))
