"""A few launches of the CUDA decode kernel on one model shape (for ncu).
usage: python benchmarks/ncu_mma.py [N K M]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma

n, k, m = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (57344, 8192, 1)
w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
q = fastnf4.quantize(w)
del w
x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
for _ in range(4):
    gemv_mma.launch(x, *linear_args(q, None))
torch.cuda.synchronize()
