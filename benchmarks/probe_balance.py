"""Decode kernel (M = 1, default plans): time against N at a fixed K, to see whether the time follows the plan's
rounds (a staircase: the work quantization of the uniform split-K plans costs time) or the bytes (a line).
Prints per shape: the kernel (16 / 20 warps), the plan (S x slices per split, block-local tiles per block / cluster),
the plan's slices per warp (rounds x (per + 1)), the balanced share (tiles x slices / warps) and the time.
usage: python benchmarks/probe_balance.py [K ...]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import copy_bandwidth, rotation_count, time_graph
from fastnf4.ops.matmul import gemv_mma

bw = copy_bandwidth(2**30)["GBps"]
ks = [int(a) for a in sys.argv[1:]] or [5120, 8192]
# N ranges around the model weights of each K, in steps of 66 tiles (one tile per cluster of two blocks)
RANGES = {5120: range(16896, 27457, 1056), 5376: range(16896, 23233, 1056), 8192: range(6336, 13729, 1056)}
for k in ks:
    for n in RANGES[k]:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w)
        del w
        reps = rotation_count(q.nbytes())
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
        prep = gemv_mma.Prepared(x, *linear_args(q))
        p = prep.params
        warps = prep.lib.warps[prep.v]
        tiles, slices = -(-n // 16), -(-k // 128)
        s, per = int(p.splits), int(p.slices_per_split)
        if p.local:
            tpb = int(p.local) // s
            groups = prep.grid // int(p.lcluster)
            rounds = -(-tiles // (groups * tpb))
        else:
            rounds = -(-tiles * s // (prep.grid * warps))
        share = tiles * slices / (prep.grid * warps)
        floor = (q.nbytes() + 2 * k + 2 * n) / bw / 1e3
        t = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i])) for i in range(reps)])["median_us"]
        print(f"{n:6d}x{k:5d} w{warps} S{s:2d}x{per:3d} local {int(p.local) // max(s, 1):2d}/{int(p.lcluster)}"
              f"{' sm' if p.lsplit else '   '} plan {rounds * (per + 1):5.1f} share {share:5.1f}"
              f" floor {floor:5.1f} t {t:6.1f} ({100 * floor / t:3.0f}%)", flush=True)
        del qs, q, prep
