"""Run one fastnf4.dequantize on an 8192x8192 NF4 weight (for ncu)."""
import torch

import fastnf4

w = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
q = fastnf4.quantize(w, double_quant=False)
for _ in range(3):
    fastnf4.dequantize(q)
torch.cuda.synchronize()
