"""Large M through the wgmma kernel in row chunks: one launch per CHUNK rows of x (the last one with the block size
of what is left), each with its own plan, against one launch over all M (M <= 512), dequantize + cuBLAS and bf16
cuBLAS, all in one interleaved graph timing (harness.time_graphs) per (weight, M). Separate timings of M = 256 and
M = 512 (bench matmul) are not comparable: the H200 lowers its clock under sustained GEMM load. Each chunked form is
checked first (fresh x, poisoned y: every element finite, the error against a float32 product with the dequantized
weight (no TF32; float64 would take minutes at M = 2048) <= 2x cuBLAS's on the same weight, and the last chunk's
rows bitwise those of that chunk launched alone).
usage: python benchmarks/probe_wgmma_chunks.py [--ms 384,512,2048] [--chunks 128,256] [--only model/layer,...]
       [--json FILE]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import time_graphs
from fastnf4.ops.matmul import wgmma
from probe_weights import append_rows, model_weights, rotated


def arg(name, default):
    return [int(v) for v in sys.argv[sys.argv.index(name) + 1].split(",")] if name in sys.argv else default


ms = arg("--ms", [384, 512, 1024, 2048])
chunk_sizes = arg("--chunks", [256])
only = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None


def chunked(prep, x, y, chunk):
    """y = x @ W.T by wgmma launches over row chunks of x (views: y's rows are contiguous)."""
    for i in range(0, x.shape[0], chunk):
        prep(x[i:i + chunk], y=y[i:i + chunk])
    return y


torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
rows = []
for model, layer, n, k, w, q in model_weights():
    if only is not None and f"{model[:5]}/{layer}" not in only:
        continue
    wd = fastnf4.dequantize(q)
    wts, qs = rotated(w, q)
    preps = [wgmma.Prepared(*linear_args(qi)) for qi in qs]
    prep = preps[0]  # (of q itself)
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.float() @ wd.float().T
        base = ((x @ wd.T).float() - ref).norm().item()
        errs = {}
        for c in chunk_sizes:
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            chunked(prep, x, y, c)
            errs[c] = ((y.float() - ref).norm().item()) / base
            alone = prep(x[-(m % c or c):].contiguous())  # the last chunk launched by itself
            assert torch.isfinite(y).all() and errs[c] <= 2.0 and torch.equal(y[-(m % c or c):], alone), \
                (model, layer, m, c, errs[c])
        del ref
        ys = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        fns = {"cublas": [lambda wi=wi: x @ wi.T for wi in wts],
               "dq": [lambda qi=qi: x @ fastnf4.dequantize(qi).T for qi in qs]}
        if m <= wgmma.MAX_M:
            fns["wgmma"] = [lambda i=i: preps[i](x, y=ys[i % 2]) for i in range(len(preps))]
        for c in chunk_sizes:
            if c < m:
                fns[f"chunks{c}"] = [lambda i=i, c=c: chunked(preps[i], x, ys[i % 2], c) for i in range(len(preps))]
        t = time_graphs(fns, per_graph=10 if m <= 512 else 4, replays=10)
        row = dict(model=model, layer=layer, N=n, K=k, M=m, err_ratio=errs,
                   **{f"{name}_us": v["median_us"] for name, v in t.items()})
        rows.append(row)
        fused = min(v["median_us"] for name, v in t.items() if name not in ("cublas", "dq"))
        print(f"{model[:6]:6} {layer:8} {n:6d}x{k:<6d} M{m:5d} "
              + " ".join(f"{name} {v['median_us']:8.1f}" for name, v in t.items())
              + f"  cuBLAS / best fused x{t['cublas']['median_us'] / fused:.2f}", flush=True)
        del ys
    del qs, preps, wts, wd
    torch.cuda.empty_cache()
append_rows(rows)
