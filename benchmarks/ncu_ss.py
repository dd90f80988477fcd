"""Run a probe_ss*.cu build (PROBE_SS_SRC, nvcc flags in argv[1]) a few times on Llama gate_up at M = 128, one split
(for ncu: benchmarks/probe_ss.py has the checks and the timing)."""
import sys

import torch

import fastnf4
import probe_ss

lib = probe_ss.build(sys.argv[1] if len(sys.argv) > 1 else "")
n, k, m = 57344, 8192, 128
q = fastnf4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02, blocksize=64, double_quant=True)
x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
for _ in range(3):
    probe_ss.ss_linear(lib, x, q, splits=1)
torch.cuda.synchronize()
