"""The dispatcher without the CUDA kernels (a GPU without nvcc, or one where they do not fit): on every model weight,
at each M, the Triton GEMV (M <= 4), the Triton GEMM, dequantize + cuBLAS, and the path ``pick_path`` takes when
gemv_mma / wgmma are unavailable, with bf16 cuBLAS on the unquantized weight. Checks first (fresh data, outputs
checked finite, error within 2x cuBLAS's on the dequantized weight), then one interleaved graph timing per (weight, M).
usage: python benchmarks/probe_triton_paths.py [--ms 1,2,4,8,16,32] [--json FILE]"""
import json
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import environment, time_graphs
from fastnf4.ops.matmul import dispatch, gemv_mma, wgmma
from probe_weights import model_weights, rotated

argv = sys.argv[1:]
ms = [int(v) for v in argv[argv.index("--ms") + 1].split(",")] if "--ms" in argv else [1, 2, 4, 8, 16, 32]
gemv_mma.supports = lambda *a, **kw: False  # the CUDA kernels unavailable, as without nvcc
wgmma.supports = lambda *a, **kw: False
torch.manual_seed(0)
rows = []
for model, layer, n, k, w, q in model_weights(min_packed_bytes=2e6):
    wts, qs = rotated(w, q)
    wd = fastnf4.dequantize(q)
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.double() @ wd.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        yard = rel(x @ wd.T)
        pick = dispatch.pick_path(x, q.packed_u8, q.blocksize, n, k, True, q.nested_blocksize)
        paths = (["gemv"] if m <= 4 else []) + ["gemm", "dequant+matmul"]
        errs = {}
        for p in paths:
            y = dispatch.linear_triton(x, *linear_args(q), path=p)
            torch.cuda.synchronize()
            errs[p] = rel(y) / yard
            assert torch.isfinite(y).all() and errs[p] <= 2.0, (model, layer, m, p, errs[p])
        fns = {"cublas": [lambda i=i: x @ wts[i].T for i in range(len(wts))]}
        for p in paths:
            fns[p] = [lambda qq=qq, p=p: dispatch.linear_triton(x, *linear_args(qq), path=p) for qq in qs]
        t = time_graphs(fns, per_graph=20, replays=10)
        us = {p: t[p]["median_us"] for p in fns}
        best = min(paths, key=lambda p: us[p])
        rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, pick=pick, best=best, err_ratio=errs,
                         **{f"{p}_us": v for p, v in us.items()}))
        print(f"{model[:6]:6s} {layer:8s} M {m:3d} cublas {us['cublas']:7.1f} " +
              " ".join(f"{p} {us[p]:7.1f}" for p in paths) + f"  pick {pick} ({us[pick] / us[best]:.2f}x best)",
              flush=True)
    wts = qs = wd = fns = ref = None
    torch.cuda.empty_cache()
worst = max(rows, key=lambda r: r[f"{r['pick']}_us"] / r["dequant+matmul_us"])
print("pick / dequant+matmul worst:", worst["model"], worst["layer"], worst["M"],
      round(worst[f"{worst['pick']}_us"] / worst["dequant+matmul_us"], 3))
if "--json" in argv:
    json.dump({"env": environment(), "rows": rows}, open(argv[argv.index("--json") + 1], "w"), indent=1)
