"""One wgmma.cu build (FASTNF4_NVCC_FLAGS, e.g. -DFASTNF4_WG_FAST_MAX_BM=128 for the rounded-code decode at BM 128)
on every model weight of >= 8 MB at the given M, default plan: its error against a float64 product with the
dequantized weight relative to cuBLAS's on the same weight (fresh data, outputs poisoned), then graph timing with
bf16 cuBLAS on the unquantized weight interleaved (harness.time_graphs). Run once per build, alternating, to A / B.
--rows 128,192: each forced weight-rows-per-block build (wgmma.Prepared's ``rows``; where it runs at this M) timed
in the same interleaved graphs, one row each (label LABEL/rROWS); default: the plan's own pick. --bm B forces the
x rows per block of those builds (e.g. --bm 128 --rows 128,192 at M = 512); --default adds the plan's own pick
beside them (label LABEL); --dq adds fastnf4 dequantize + cuBLAS (its time in each row's dq_us).
usage: FASTNF4_NVCC_FLAGS=... python benchmarks/probe_wgmma_build.py LABEL [--m 128] [--rows R,...] [--bm B]
       [--default] [--dq] [--json FILE]"""
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import time_graphs
from fastnf4.ops.matmul import wgmma
from probe_weights import append_rows, model_weights, rotated

label = sys.argv[1]
m = int(sys.argv[sys.argv.index("--m") + 1]) if "--m" in sys.argv else 128
forced = [int(r) for r in sys.argv[sys.argv.index("--rows") + 1].split(",")] if "--rows" in sys.argv else [None]
bm = int(sys.argv[sys.argv.index("--bm") + 1]) if "--bm" in sys.argv else None
# (bm, rows) of each timed build; the plan's own pick first where asked
specs = ([(None, None)] if "--default" in sys.argv and forced != [None] else []) + [(bm, r) for r in forced]
torch.manual_seed(0)
rows = []
for model, layer, n, k, w, q in model_weights():
    wd = fastnf4.dequantize(q)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    ref = x.double() @ wd.double().T
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    base = rel(x @ wd.T)
    builds, errs = [], {}
    prep = wgmma.Prepared(*linear_args(q))
    for b, r in specs:
        try:
            prep.launch_plan(m, x.dtype, bm=b, rows=r)
        except ValueError:
            continue  # no such build at this M
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        prep(x, y=y, bm=b, rows=r)
        errs[b, r] = rel(y) / base
        assert torch.isfinite(y).all() and errs[b, r] <= 2.0, (model, layer, b, r, errs[b, r])
        builds.append((b, r))
    del ref, wd
    wts, qs = rotated(w, q)
    preps = [wgmma.Prepared(*linear_args(qi)) for qi in qs]
    fns = {"cublas": [lambda wi=wi: x @ wi.T for wi in wts]}
    if "--dq" in sys.argv:
        fns["dq"] = [lambda qi=qi: x @ fastnf4.dequantize(qi).T for qi in qs]
    for b, r in builds:
        fns[f"wgmma{b},{r}"] = [lambda p=p, b=b, r=r: p(x, bm=b, rows=r) for p in preps]
    t = time_graphs(fns, per_graph=20, replays=10)
    for b, r in builds:
        pbm, *_, picked = preps[0].launch_plan(m, x.dtype, bm=b, rows=r)
        rows.append(dict(label=label if r is None else f"{label}/r{r}" + (f"/bm{b}" if b else ""),
                         flags=os.environ.get("FASTNF4_NVCC_FLAGS", ""), model=model, layer=layer, N=n, K=k, M=m,
                         bm=pbm, rows=picked, err_ratio=errs[b, r], us=t[f"wgmma{b},{r}"]["median_us"],
                         cublas_us=t["cublas"]["median_us"], dq_us=t["dq"]["median_us"] if "dq" in t else None))
    del qs, preps, wts
    torch.cuda.empty_cache()
for lab in dict.fromkeys(r["label"] for r in rows):
    print(lab, f"M {m}", " ".join(f"{r['model'][:5]}/{r['layer']}:{r['us']:.1f}({r['cublas_us'] / r['us']:.2f},"
                                  f"e{r['err_ratio']:.2f})" for r in rows if r["label"] == lab), flush=True)
if "--dq" in sys.argv:
    first = [r for r in rows if r["label"] == rows[0]["label"]] if rows else []
    print("dequantize+cublas", f"M {m}", " ".join(f"{r['model'][:5]}/{r['layer']}:{r['dq_us']:.1f}"
                                                   f"({r['cublas_us'] / r['dq_us']:.2f})" for r in first), flush=True)
append_rows(rows)
