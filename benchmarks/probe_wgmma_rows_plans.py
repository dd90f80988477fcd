"""The 192-row wgmma build (wgmma.ROWS_WIDE) on the weights the dispatcher leaves to 128 rows (N < WIDE_MIN_N): is
it the build or its split plan (the 128-row plan model priced with 192-row tiles) that loses there? At the given M
(default 128), every model weight of >= 8 MB with N < WIDE_MIN_N (--all: every one): the default launch (128 rows),
192 rows with the plan's own split and 192 rows with K forced into S parts (every tile split alike, S in --splits,
default 1,2,3,4,6). Each variant is checked first (fresh x, poisoned y, error against a float64 product with the
dequantized weight <= 2x cuBLAS's on the same weight), then all are timed with bf16 cuBLAS in one interleaved graph
timing (harness.time_graphs).
usage: python benchmarks/probe_wgmma_rows_plans.py [--m 128] [--all] [--splits 1,2,3] [--json FILE]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import time_graphs
from fastnf4.ops.matmul import wgmma
from probe_weights import append_rows, model_weights, rotated

m = int(sys.argv[sys.argv.index("--m") + 1]) if "--m" in sys.argv else 128
splits = ([int(s) for s in sys.argv[sys.argv.index("--splits") + 1].split(",")] if "--splits" in sys.argv
          else [1, 2, 3, 4, 6])
wide = wgmma.ROWS_WIDE
torch.manual_seed(0)
rows = []
for model, layer, n, k, w, q in model_weights():
    if n >= wgmma.WIDE_MIN_N and "--all" not in sys.argv:  # (session 36's run: before WIDE_LONG_K)
        continue
    prep = wgmma.Prepared(*linear_args(q))
    # name -> launch keywords
    variants = {"default": {}, f"r{wide}": dict(rows=wide)}
    variants.update({f"r{wide}s{s}": dict(rows=wide, splits=s) for s in splits if s <= k // wgmma.STEP})
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    wd = fastnf4.dequantize(q)
    ref = x.double() @ wd.double().T
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    base = rel(x @ wd.T)
    errs, plans = {}, {}
    for name, kw in variants.items():
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        prep(x, y=y, **kw)
        errs[name] = rel(y) / base
        assert torch.isfinite(y).all() and errs[name] <= 2.0, (model, layer, name, errs[name])
        plans[name] = prep.launch_plan(m, x.dtype, splits=kw.get("splits"), rows=kw.get("rows"))
    del ref, wd
    wts, qs = rotated(w, q)
    preps = [wgmma.Prepared(*linear_args(qi)) for qi in qs]
    fns = {"cublas": [lambda wi=wi: x @ wi.T for wi in wts]}
    for name, kw in variants.items():
        fns[name] = [lambda p=p, kw=kw: p(x, **kw) for p in preps]
    t = time_graphs(fns, per_graph=20, replays=10)
    row = dict(model=model, layer=layer, N=n, K=k, M=m, cublas_us=t["cublas"]["median_us"],
               us={name: t[name]["median_us"] for name in variants}, err_ratio=errs,
               plan={name: list(p) for name, p in plans.items()})
    rows.append(row)
    best = min(row["us"], key=row["us"].get)
    print(f"{model[:6]:6} {layer:8} {n:6d}x{k:<6d} M{m:4d} cuBLAS {row['cublas_us']:7.1f} "
          + " ".join(f"{name} {v:7.1f}" for name, v in row["us"].items())
          + f"  best {best} (plan default {plans['default'][1]}x{plans['default'][2]} full {plans['default'][3]},"
          f" r{wide} {plans[f'r{wide}'][1]}x{plans[f'r{wide}'][2]} full {plans[f'r{wide}'][3]})", flush=True)
    del qs, preps, wts
    torch.cuda.empty_cache()
append_rows(rows)
