"""A / B timing of the wgmma kernel as the fastnf4 on PYTHONPATH builds it (run once per tree, alternating):
default plan, graph timing, us per call. usage: python benchmarks/probe_wgmma_ab.py TAG"""
import json
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graph
from fastnf4.ops.matmul import wgmma

CASES = [(8192, 5120, (128, 256)), (8192, 5376, (128, 256)), (5376, 4096, (128,)), (8192, 8192, (128,)),
         (28672, 8192, (128,)), (21504, 5376, (128,)), (5120, 25600, (128,))]
torch.manual_seed(0)
res = {}
for n, k, ms in CASES:
    q = fastnf4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02, blocksize=64, double_quant=True)
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        res[f"{n}x{k} M{m}"] = time_graph([lambda i=i: wgmma.launch(x, *linear_args(qs[i])) for i in range(reps)],
                                          per_graph=20, replays=15)["median_us"]
print(sys.argv[1], json.dumps({kk: round(v, 2) for kk, v in res.items()}), flush=True)
