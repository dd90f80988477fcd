"""The warp-specialized wgmma kernel (wgmma.cu nf4_wgmma_ws: TMA producers, statistics warps, mbarrier stages; BM
128) against the block-synchronous one (nf4_wgmma, BM 128) and bf16 cuBLAS on the unquantized weight.
First correctness on small odd shapes (both kernels, forced split plans, outputs poisoned with NaN; the two must be
bitwise equal: same fragments, same wgmma order), then graph timing with the providers' replays interleaved
(harness.time_graphs) on every model weight of >= 8 MB at the given M (default 128).
usage: python benchmarks/probe_wgmma_ws.py [JSON] [--m 128,100] [--checks-only]"""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import model_shapes, rotation_count, time_graphs
from fastnf4.ops.matmul import wgmma

ms = (128,)
if "--m" in sys.argv:
    ms = tuple(int(v) for v in sys.argv[sys.argv.index("--m") + 1].split(","))
torch.manual_seed(0)
out = {"env": {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FASTNF4_COMMIT", "?"),
               "torch": torch.__version__}, "checks": [], "rows": []}

# ---- correctness: ws against the block-synchronous kernel (bitwise) and against float64 (error ratio)
bad = 0
for n, k in ((200, 64), (1000, 576), (4096, 2048), (333, 5376)):
    for blocksize in (64, 256, 4096):
        for nested in (False, True):
            for dtype in (torch.bfloat16, torch.float16):
                q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                                     double_quant=nested)
                wd = fastnf4.dequantize(q, dtype)
                for m in (65, 128, 100):
                    x = torch.randn(m, k, device="cuda", dtype=dtype)
                    bias = torch.randn(n, device="cuda", dtype=dtype) if m == 100 else None
                    ref = x.double() @ wd.double().T + (bias.double() if bias is not None else 0)
                    steps = k // 64
                    for force in ({}, {"splits": min(3, steps)}, {"splits": min(2, steps), "full_tiles": 1}):
                        ys = []
                        for ws, cl in ((False, None), (True, 1), (True, None)):
                            y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                            wgmma.launch(x, *linear_args(q, bias), y=y, bm=128, ws=ws, cl=cl, **force)
                            ys.append(y)
                        torch.cuda.synchronize()
                        cub = torch.nn.functional.linear(x, wd, bias)
                        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
                        for name, yv in (("cl1", ys[1]), ("cl2", ys[2])):
                            ratio = rel(yv) / rel(cub)
                            equal = torch.equal(ys[0], yv)
                            ok = equal and bool(torch.isfinite(yv).all()) and ratio <= 1.1
                            bad += not ok
                            out["checks"].append(dict(N=n, K=k, blocksize=blocksize, nested=nested, dtype=str(dtype),
                                                      M=m, force=force, kernel=name, equal=equal, err_ratio=ratio))
                            if not ok:
                                print(f"FAIL {name} {n}x{k} bs {blocksize} nested {nested} {dtype} M {m} {force}: "
                                      f"equal {equal} ratio {ratio:.3f} finite {bool(torch.isfinite(yv).all())}",
                                      flush=True)
print(f"checks: {len(out['checks'])} cases, {bad} failed", flush=True)
if bad or "--checks-only" in sys.argv:
    sys.exit(1 if bad else 0)

# ---- timing
seen = set()
for model, layer, n, k in model_shapes():
    if (n, k) in seen or n * k // 2 < 8e6:
        continue
    seen.add((n, k))
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    reps_q = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps_q - 1)]
    reps_w = rotation_count(n * k * 2)
    wts = [w] + [w.clone() for _ in range(reps_w - 1)]
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        y0 = wgmma.launch(x, *linear_args(q), bm=128, ws=False)
        y1 = wgmma.launch(x, *linear_args(q), bm=128, ws=True, cl=1)
        y2 = wgmma.launch(x, *linear_args(q), bm=128, ws=True)
        assert torch.equal(y0, y1) and torch.equal(y0, y2), (model, layer, m)
        t = time_graphs({
            "cublas": [lambda i=i: x @ wts[i].T for i in range(reps_w)],
            "sync": [lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=128, ws=False) for i in range(reps_q)],
            "ws1": [lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=128, ws=True, cl=1) for i in range(reps_q)],
            "ws": [lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=128, ws=True) for i in range(reps_q)],
        }, per_graph=20, replays=10)
        row = dict(model=model, layer=layer, N=n, K=k, M=m, plan=list(wgmma.plan(m, n, k, 132, 128, 1)),
                   **{f"{kk}_us": v["median_us"] for kk, v in t.items()})
        out["rows"].append(row)
        print(f"{model[:6]:6} {layer[:8]:8} {n:6d}x{k:<6d} M{m:4d} plan {tuple(row['plan'])} cuBLAS "
              f"{row['cublas_us']:7.1f} sync {row['sync_us']:7.1f} ws1 {row['ws1_us']:7.1f} ws {row['ws_us']:7.1f}  ws/sync "
              f"{row['ws_us'] / row['sync_us']:.3f}  cuBLAS/ws {row['cublas_us'] / row['ws_us']:.2f}", flush=True)
    del qs, wts
    torch.cuda.empty_cache()
if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
    json.dump(out, open(sys.argv[1], "w"), indent=1)
