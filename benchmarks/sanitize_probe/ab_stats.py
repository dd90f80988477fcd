"""A / B of two gemv_mma.cu builds on the model weights at M = 1, 2 and 4 (decode, burst and pair-column kernels,
the dispatcher's own pick): session 37's change made the decode kernel's asynchronous statistics copies also ask for
an absmax array of whole 16-byte chunks, which moved the SASS of most of its builds by a few instructions. Checks
that both give the same bits, then times both in one interleaved graph timing per (weight, M), rotated weights.
usage: python benchmarks/sanitize_probe/ab_stats.py OLD.so [OUT.json]   (the package's own build is B)"""
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from probe_weights import model_weights, rotated  # noqa: E402

from fastnf4.api import linear_args  # noqa: E402
from fastnf4.bench.harness import time_graphs  # noqa: E402
from fastnf4.ops.matmul import gemv_mma  # noqa: E402

old_lib = gemv_mma._Lib(ctypes.CDLL(sys.argv[1]), 0)
new_lib = gemv_mma._lib_for(0)


def prepared(lib, x, q):
    keep = gemv_mma._lib_for
    gemv_mma._lib_for = lambda index: lib
    try:
        return gemv_mma.Prepared(x, *linear_args(q))
    finally:
        gemv_mma._lib_for = keep


rows = []
for model, layer, n, k, w, q in model_weights(5e6):
    ws, qs = rotated(w, q)
    del ws
    for m in (1, 2, 4):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        pa = [prepared(old_lib, x, qq) for qq in qs]
        pb = [prepared(new_lib, x, qq) for qq in qs]
        ya, yb = pa[0](x), pb[0](x)
        same = bool(torch.equal(ya, yb))
        t = time_graphs({"old": [lambda p=p: p(x) for p in pa], "new": [lambda p=p: p(x) for p in pb]},
                        per_graph=20, replays=15)
        a, b = t["old"]["median_us"], t["new"]["median_us"]
        rows.append({"model": model, "layer": layer, "N": n, "K": k, "M": m, "kernel": pb[0].v, "old_us": a,
                     "new_us": b, "bits_equal": same})
        print(f"{model[:6]:6} {layer:8} M {m} v{pb[0].v}: old {a:7.2f} new {b:7.2f} us  new/old {b / a:.3f}"
              f"{'' if same else '  BITS DIFFER'}", flush=True)
    del qs
r = [row["new_us"] / row["old_us"] for row in rows]
print(f"new/old: min {min(r):.3f} max {max(r):.3f} geomean {torch.tensor(r).log().mean().exp().item():.4f}; "
      f"bits differ on {sum(not row['bits_equal'] for row in rows)} of {len(rows)}")
if len(sys.argv) > 2:
    json.dump(rows, open(sys.argv[2], "w"), indent=1)
