"""One wgmma.cu build (FASTNF4_NVCC_FLAGS, e.g. -DFASTNF4_WG_FAST_MAX_BM=128 for the rounded-code decode at BM 128)
on every model weight of >= 8 MB at the given M, default plan: its error against a float64 product with the
dequantized weight relative to cuBLAS's on the same weight (fresh data, outputs poisoned), then graph timing with
bf16 cuBLAS on the unquantized weight interleaved (harness.time_graphs). Run once per build, alternating, to A / B.
usage: FASTNF4_NVCC_FLAGS=... python benchmarks/probe_wgmma_build.py LABEL [--m 128] [--json FILE]"""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graphs
from fastnf4.ops.matmul import wgmma
from probe_weights import model_weights

label = sys.argv[1]
m = int(sys.argv[sys.argv.index("--m") + 1]) if "--m" in sys.argv else 128
torch.manual_seed(0)
rows = []
for model, layer, n, k, w, q in model_weights():
    wd = fastnf4.dequantize(q)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    ref = x.double() @ wd.double().T
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    wgmma.launch(x, *linear_args(q), y=y)
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    err = rel(y) / rel(x @ wd.T)
    assert torch.isfinite(y).all() and err <= 2.0, (model, layer, err)
    del ref, wd
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    reps_w = rotation_count(n * k * 2)
    wts = [w] + [w.clone() for _ in range(reps_w - 1)]
    t = time_graphs({"cublas": [lambda i=i: x @ wts[i].T for i in range(reps_w)],
                     "wgmma": [lambda i=i: wgmma.launch(x, *linear_args(qs[i])) for i in range(reps)]},
                    per_graph=20, replays=10)
    rows.append(dict(label=label, flags=os.environ.get("FASTNF4_NVCC_FLAGS", ""), model=model, layer=layer, N=n, K=k,
                     M=m, err_ratio=err, us=t["wgmma"]["median_us"], cublas_us=t["cublas"]["median_us"]))
    del qs, wts
    torch.cuda.empty_cache()
print(label, f"M {m}", " ".join(f"{r['model'][:5]}/{r['layer']}:{r['us']:.1f}({r['cublas_us'] / r['us']:.2f},"
                                 f"e{r['err_ratio']:.2f})" for r in rows), flush=True)
if "--json" in sys.argv:
    path = sys.argv[sys.argv.index("--json") + 1]
    old = json.load(open(path)) if os.path.exists(path) else []
    json.dump(old + rows, open(path, "w"), indent=1)
