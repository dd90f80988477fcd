"""Where the warp-specialized wgmma kernel's time goes: the build selected by FASTNF4_NVCC_FLAGS (diagnostic macros
FASTNF4_WS_NO_DECODE / FASTNF4_WS_NO_MMA: wrong results) at BM 128 against the block-synchronous kernel and cuBLAS,
interleaved graph timing. usage: FASTNF4_NVCC_FLAGS=... python benchmarks/probe_wgmma_ws_parts.py TAG [M]"""
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graphs
from fastnf4.ops.matmul import wgmma

m = int(sys.argv[2]) if len(sys.argv) > 2 else 128
torch.manual_seed(0)
line = f"{sys.argv[1]:10} M {m}:"
for n, k in ((57344, 8192), (8192, 28672), (21504, 5376), (8192, 8192)):
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    t = time_graphs({"cublas": [lambda: x @ w.T],
                     "ws": [lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=128, ws=True) for i in range(reps)]},
                    per_graph=20, replays=8)
    line += f"  {n}x{k} ws {t['ws']['median_us']:6.1f} (cuBLAS {t['cublas']['median_us']:6.1f})"
    del qs, w
    torch.cuda.empty_cache()
print(line, flush=True)
