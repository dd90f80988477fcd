"""One profiled call (for ncu --profile-from-start off) of bf16 cuBLAS (F.linear on the unquantized weight) or of
fastnf4.linear on the NF4 weight, warmed up first: python benchmarks/ncu_cublas_m128.py cublas|fastnf4 N K M
Session 42: what cuBLAS's kernel does at M = 128 (tile, cluster, tensor-pipe and L2 figures) beside the wgmma kernel."""
import sys

import torch
import torch.nn.functional as F

import fastnf4

which, (n, k, m) = sys.argv[1], (int(a) for a in sys.argv[2:5])
w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
if which == "cublas":
    def call():
        return F.linear(x, w)
else:
    q = fastnf4.quantize(w, double_quant=True)
    del w

    def call():
        return fastnf4.linear(x, q)
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.profiler.start()
call()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
