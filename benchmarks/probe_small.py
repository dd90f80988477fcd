"""Decode kernel on the small weights (k/v, Gemma q/o) at M = 1: time per split-K choice, beside bitsandbytes.
usage: python benchmarks/probe_small.py"""
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import bnb_functional, clone_weight
from fastnf4.bench.harness import rotation_count, time_graph
from fastnf4.ops.matmul import gemv_mma

F = bnb_functional()
for n, k in [(1024, 5120), (1024, 8192), (2048, 5376), (4096, 5376), (5376, 4096)]:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w)
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    slices = -(-k // 128)
    plan = gemv_mma.plan(1, n, k, 132 * 16)
    line = f"{n:5d}x{k:5d} plan {plan}:"
    for s in (1, 2, 3, 4, 6, 8, 10, 16):
        per = -(-slices // s)
        t = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), splits=(s, per)) for i in range(reps)])
        line += f" s{s} {t['median_us']:5.1f}"
    if F is not None:
        import bitsandbytes
        bq = [(c.packed, c.to_bnb()[1]) for c in qs]
        t = time_graph([lambda i=i: bitsandbytes.matmul_4bit(x, bq[i][0].t(), quant_state=bq[i][1]) for i in range(reps)])
        line += f" | bnb {t['median_us']:5.1f}"
    print(line, flush=True)
