"""Where the wgmma kernel's time goes: graph timing of a few shapes for one build (FASTNF4_NVCC_FLAGS selects
diagnostic variants: -DFASTNF4_WG_NO_DECODE, -DFASTNF4_WG_NO_MMA,
-DFASTNF4_WG_NO_STATS, -DFASTNF4_WG_WSTAGES=n, -DFASTNF4_WG_XSTAGES=n), against bf16 cuBLAS in the same process.
-DFASTNF4_WG_FAST_MAX_BM=n (rounded-code decode up to BM n).
-DFASTNF4_WG_NO_WCOPY / NO_XLOAD / NO_LUT (session 43): no weight copies, x loaded for the first stages only, no
table lookups (wrong results, time only).
--small: M 16 / 32 / 64 on eight weights only; --ms 16,32 keeps those M of --small (M > 256: BM 256); --five: five of
the eight weights (Llama gate_up, down, q+o, Gemma o, gate+up).
usage: FASTNF4_NVCC_FLAGS=... python benchmarks/probe_wgmma_parts.py LABEL [JSON] [--small] [--ms LIST] [--five]"""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graph
from fastnf4.ops.matmul import wgmma

SMALL = "--small" in sys.argv
if SMALL:
    sys.argv.remove("--small")
MS = (16, 32, 64)
FIVE = "--five" in sys.argv
if FIVE:
    sys.argv.remove("--five")
if "--ms" in sys.argv:
    at = sys.argv.index("--ms")
    MS = tuple(int(v) for v in sys.argv[at + 1].split(","))
    del sys.argv[at:at + 2]
label = sys.argv[1]
rows = []
SHAPES = ((57344, 8192, 16, 16), (5120, 25600, 32, 32), (51200, 5120, 32, 32), (5120, 8192, 16, 16),
          (57344, 8192, 64, 64), (57344, 8192, 128, 128), (57344, 8192, 256, 256),
          (57344, 8192, 512, 256), (57344, 8192, 2048, 256), (8192, 28672, 128, 128),
          (5120, 8192, 128, 128), (57344, 8192, 256, 128), (57344, 8192, 512, 128))
if SMALL:
    weights = ((57344, 8192), (8192, 28672), (8192, 8192), (10240, 5120), (5120, 25600), (8192, 5376), (5376, 4096),
               (21504, 5376))
    if FIVE:
        weights = tuple(weights[i] for i in (0, 1, 2, 6, 7))
    SHAPES = tuple((n, k, m, wgmma.block_m(m)) for m in MS for n, k in weights)
for n, k, m, bm in SHAPES:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    t = time_graph([lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=bm) for i in range(reps)])["median_us"]
    c = time_graph([lambda: x @ w.T])["median_us"]
    rows.append(dict(label=label, flags=os.environ.get("FASTNF4_NVCC_FLAGS", ""), N=n, K=k, M=m, bm=bm, us=t,
                     cublas_us=c))
    print(f"{label:10} {n:6d}x{k:<6d} M{m:5d} bm{bm:4d}: {t:8.1f} us (cuBLAS {c:8.1f}, x{c / t:.2f})", flush=True)
if len(sys.argv) > 2:
    json.dump(rows, open(sys.argv[2], "w"), indent=1)
