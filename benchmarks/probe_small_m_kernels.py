"""Where the time of the small weights at M = 8-32 goes: the kernels behind one ``fastnf4.linear`` call and their
durations (torch profiler, graph replays of 20 back-to-back calls over rotated weights), against the graph-timed
time per call and bf16 cuBLAS on the unquantized weight in the same process (``harness.time_graphs``). The gap
between the per-call time and the sum of its kernels' durations is launch / dependency latency.
usage: python benchmarks/probe_small_m_kernels.py [JSON]"""
import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import fastnf4
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, rotation_count, time_graphs
from fastnf4.ops.matmul import dispatch

# Gemma q / o / qkv / gate+up, Qwen q / qkv: the weights of >= 8 MB that lose to cuBLAS at some M in 8-32
WEIGHTS = [("gemma q", 4096, 5376), ("gemma o", 5376, 4096), ("gemma qkv", 8192, 5376), ("gemma gate+up", 21504, 5376),
           ("qwen q", 8192, 5120), ("qwen qkv", 10240, 5120)]
rows = []
torch.manual_seed(0)
for name, n, k in WEIGHTS:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    qs = [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)]
    ws = [w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)]
    for m in (8, 16, 32):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        path = dispatch.pick_path(x, q.packed_u8, q.blocksize, n, k, True, 256)
        t = time_graphs({"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))],
                         "fastnf4": [lambda i=i: fastnf4.linear(x, qs[i]) for i in range(len(qs))]},
                        per_graph=20, replays=10)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(20):
                fastnf4.linear(x, qs[i % len(qs)])
        g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
        kern = defaultdict(list)
        for e in prof.events():
            if e.device_type.name == "CUDA" and e.device_time > 0:
                kern[e.name[:60]].append(e.device_time)
        ks = {kname: sum(v) / 100 for kname, v in kern.items()}  # us per call (5 replays x 20 calls)
        row = dict(name=name, N=n, K=k, M=m, path=path, us=t["fastnf4"]["median_us"], cublas_us=t["cublas"]["median_us"],
                   kernels=ks)
        rows.append(row)
        print(f"{name:14s} M {m:2d} {path:8s} {row['us']:6.1f} us (cuBLAS {row['cublas_us']:6.1f}) kernels "
              + ", ".join(f"{kn.split('<')[0][:24]} {v:.1f}" for kn, v in ks.items())
              + f" | sum {sum(ks.values()):.1f}", flush=True)
        del g
    del qs, ws
    torch.cuda.empty_cache()
if len(sys.argv) > 1:
    json.dump({"env": environment(), "rows": rows}, open(sys.argv[1], "w"), indent=1)
