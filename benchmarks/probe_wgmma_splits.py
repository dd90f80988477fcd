"""The wgmma kernel's split-K plan: ``wgmma.plan`` asks for ceil(slots / tiles) splits, which can put more blocks on
the GPU than it holds at once (e.g. 64 tiles x 5 splits = 320 blocks on 264 slots: a second, partial wave). Here
each weight that splits is timed with that plan and with floor(slots / tiles) splits (one wave at most), same
process, graph timing, against bf16 cuBLAS (rotated past L2 as bench matmul does).
usage: python benchmarks/probe_wgmma_splits.py [JSON]"""
import json
import sys

import torch

from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, rotation_count, time_graph
from fastnf4.ops.matmul import wgmma
from probe_weights import model_weights

ORIGINAL = wgmma.plan


def plan_floor(m: int, n: int, k: int, slots: int, bm: int) -> tuple[int, int]:
    steps = k // wgmma.STEP
    tiles = -(-m // bm) * -(-n // wgmma.ROWS)
    if tiles * 2 > slots:
        return 1, steps
    want = min(slots // tiles, max(1, steps // 8))
    per = -(-steps // want)
    if steps % 4 == 0:
        per = -(-per // 4) * 4
    return -(-steps // per), per


torch.manual_seed(0)
rows = []
for model, layer, n, k, w, q in model_weights():
    qs = [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)]
    ws = [w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)]
    for m in (16, 32, 64, 128):
        bm = wgmma.block_m(m)
        slots = 132 * (2 if bm <= 64 else 1)
        a, b = ORIGINAL(m, n, k, slots, bm), plan_floor(m, n, k, slots, bm)
        if a == b:
            continue
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        row = dict(model=model, layer=layer, N=n, K=k, M=m, bm=bm, plan=a, plan_floor=b)
        row["cublas_us"] = time_graph([lambda i=i: x @ ws[i].T for i in range(len(ws))])["median_us"]
        for name, fn in (("plan", ORIGINAL), ("floor", plan_floor), ("plan2", ORIGINAL)):
            wgmma.plan = fn
            row[f"{name}_us"] = time_graph([lambda i=i: wgmma.launch(x, *linear_args(qs[i]))
                                            for i in range(len(qs))])["median_us"]
        wgmma.plan = ORIGINAL
        rows.append(row)
        print(f"{model[:6]:6} {layer[:8]:8} {n:6d}x{k:<6d} M{m:4d} plan {a} {row['plan_us']:7.1f} / {row['plan2_us']:7.1f}"
              f" floor {b} {row['floor_us']:7.1f} us  cuBLAS {row['cublas_us']:7.1f}", flush=True)
if len(sys.argv) > 1:
    json.dump({"env": environment(), "rows": rows}, open(sys.argv[1], "w"), indent=1)
