"""Does heavy tensor-core work just before slow the decode kernel down? Times the M = 1 decode kernel (graph,
rotating copies) on Qwen q (8192 x 5120) idle, then right after ~3 s of bf16 GEMMs (8192^3) at several delays,
with the SM clock NVML reports (torch.cuda.clock_rate) and a copy of the same bytes as a memory-bound control.
usage: python benchmarks/probe_clock.py"""
import time

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import time_graph
from fastnf4.ops.matmul import gemv_mma

n, k = 8192, 5120
q = fastnf4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02)
qs = [q] + [clone_weight(q) for _ in range(2)]
x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
src = torch.empty(q.nbytes(), dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")


def sample(tag):
    clk = torch.cuda.clock_rate() if hasattr(torch.cuda, "clock_rate") else -1
    d0 = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), kernel=0) for i in range(3)])["median_us"]
    d5 = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), kernel=gemv_mma.DECODE_WIDE)
                     for i in range(3)])["median_us"]
    c = time_graph([lambda: dst.copy_(src)])["median_us"]
    print(f"{tag:>12s}: clock {clk} MHz, decode 16x6 {d0:5.1f} us, 20x4 {d5:5.1f} us, copy {c:5.1f} us", flush=True)


sample("idle")
sample("idle")
for delay in (0.0, 0.05, 0.2, 0.5, 1.0, 2.0):
    t0 = time.time()
    while time.time() - t0 < 3.0:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    time.sleep(delay)
    sample(f"after+{delay:.2f}s")
