"""One wgmma launch per (N, K, M, BM) from argv, for ncu: python benchmarks/ncu_wgmma.py N K M BM"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import wgmma

n, k, m, bm = (int(a) for a in sys.argv[1:5])
q = fastnf4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02)
x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
for _ in range(2):
    wgmma.launch(x, *linear_args(q), bm=bm)
torch.cuda.synchronize()
