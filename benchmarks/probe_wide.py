"""The two decode-kernel configurations (16 warps x 6 stages = variant 0, 20 x 4 = variant 5) at M = 1 on the
mid-size weights, with the weights rotated over two working-set sizes: as many copies as ``bench matmul`` takes
(sized for the bf16 weight: ~65-90 MB of NF4 copies, about the 60 MB L2) and as many as ``probe_decode.py`` takes
(>= 4x L2 of NF4 copies). usage: python benchmarks/probe_wide.py"""
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graph
from fastnf4.ops.matmul import gemv_mma

SHAPES = [(8192, 5120), (10240, 5120), (8192, 5376), (4096, 5376), (5376, 4096), (5120, 8192), (10240, 8192),
          (8192, 8192), (25600, 5120)]
for n, k in SHAPES:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w)
    del w
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    line = f"{n:5d}x{k:5d} {q.nbytes() / 1e6:5.1f} MB:"
    for reps in (rotation_count(n * k * 2), rotation_count(q.nbytes())):
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        for kernel in (0, gemv_mma.DECODE_WIDE, 0, gemv_mma.DECODE_WIDE):
            t = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), kernel=kernel) for i in range(reps)])
            line += f" r{reps}/v{kernel} {t['median_us']:5.1f}"
        del qs
    print(line, flush=True)
