"""Two launches of one probe_xa.cu build for ncu: python benchmarks/ncu_xa.py N K M "nvcc flags" """
import sys

import torch

import fastnf4
from probe_xa import Build, xa_linear

n, k, m = (int(a) for a in sys.argv[1:4])
b = Build("ncu", sys.argv[4] if len(sys.argv) > 4 else "-DPROBE_XA_T=4")
q = fastnf4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02)
x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
for _ in range(2):
    xa_linear(b, x, q)
torch.cuda.synchronize()
