"""The CUDA matmul kernels under compute-sanitizer (memcheck): small shapes whose statistics arrays end inside a
4-byte word, nested and not, every kernel variant, split-K on and off (the small-weight kernels ignore it), the wgmma kernel's split tail.
usage: compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_mma.py"""
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma, wgmma

torch.manual_seed(0)
cases = 0
for n, k, bs in [(17, 192, 64), (33, 320, 256), (5, 128, 64), (129, 1088, 1024)]:
    for nested in (False, True):
        q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, blocksize=bs,
                             double_quant=nested)
        slices = -(-k // 128)
        for m in (1, 2, 3, 8, 16, 32):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            kernels = [gemv_mma.variant(m)] + ([gemv_mma.DECODE_WIDE, gemv_mma.SMALL] if m <= 2 else [])
            for kernel in kernels + ([gemv_mma.SPLIT] if m == 1 else []):
                for splits in (None, (1, slices), (3, -(-slices // 3))):
                    y = gemv_mma.launch(x, *linear_args(q), splits=splits, kernel=kernel)
                    cases += 1
            if m >= 3 and wgmma.supports(x, q.packed_u8, bs, n, k, nested, q.nested_blocksize):
                # the plan's launch, every tile split, and (two row tiles) the first whole and the second split
                for force in ({}, {"splits": 2}, {"splits": 3, "full_tiles": 1}):
                    y = wgmma.launch(x, *linear_args(q), **force)
                    cases += 1
torch.cuda.synchronize()
print(f"sanitize_mma: {cases} launches done")
