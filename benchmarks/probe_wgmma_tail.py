"""wgmma.cu with the tail plan (wgmma.plan: whole tiles first, the last tiles split over K to fill the last wave)
against the one-wave plan it replaces (wgmma._one_wave: every tile split alike, or none), bf16 cuBLAS and fastnf4
dequantize + cuBLAS, for every model weight of >= 8 MB at M = 128 / 256 / 512; graph timing with the providers'
replays interleaved (harness.time_graphs). Correctness of both plans first (error against a float64 product with
the dequantized weight, relative to cuBLAS's on the same weight; outputs poisoned).
usage: python benchmarks/probe_wgmma_tail.py [JSON] [--m 128,256]"""
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

ms = (128, 256, 512)
for a in sys.argv[1:]:
    if a.startswith("--m"):
        ms = tuple(int(v) for v in sys.argv[sys.argv.index(a) + 1].split(","))
torch.manual_seed(0)
out = {"env": {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FASTNF4_COMMIT", "?"),
               "torch": torch.__version__}, "rows": []}
sms = torch.cuda.get_device_properties(0).multi_processor_count
for model, layer, n, k, w, q in model_weights():
    wd = fastnf4.dequantize(q)
    reps_q = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps_q - 1)]
    reps_w = rotation_count(n * k * 2)
    ws = [w] + [w.clone() for _ in range(reps_w - 1)]
    for m in ms:
        bm = wgmma.block_m(m)
        steps, tiles = k // wgmma.STEP, -(-m // bm) * -(-n // wgmma.ROWS)
        s_old, _ = wgmma._one_wave(tiles, steps, sms)
        new = wgmma.plan(m, n, k, sms, bm, 1)
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.double() @ wd.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        err = {}
        for name, force in (("old", dict(splits=s_old)), ("new", {})):
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            wgmma.launch(x, *linear_args(q), y=y, bm=bm, **force)
            err[name] = rel(y) / rel(x @ wd.T)
            assert torch.isfinite(y).all() and err[name] <= 1.1, (model, layer, m, name, err[name])
        t = time_graphs({
            "cublas": [lambda i=i: x @ ws[i].T for i in range(reps_w)],
            "dq_cublas": [lambda i=i: x @ fastnf4.dequantize(qs[i]).T for i in range(reps_q)],
            "wg_old": [lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=bm, splits=s_old) for i in range(reps_q)],
            "wg_new": [lambda i=i: wgmma.launch(x, *linear_args(qs[i]), bm=bm) for i in range(reps_q)],
        }, per_graph=10 if m >= 512 else 20, replays=10)
        row = dict(model=model, layer=layer, N=n, K=k, M=m, bm=bm, old_splits=s_old, new_plan=list(new),
                   err_old=err["old"], err_new=err["new"], **{f"{kk}_us": v["median_us"] for kk, v in t.items()})
        out["rows"].append(row)
        print(f"{model[:6]:6} {layer[:8]:8} {n:6d}x{k:<6d} M{m:4d} plan {s_old}->{tuple(new)} cuBLAS "
              f"{row['cublas_us']:7.1f} dq+cuBLAS {row['dq_cublas_us']:7.1f} wg old {row['wg_old_us']:7.1f} new "
              f"{row['wg_new_us']:7.1f}  new/old {row['wg_new_us'] / row['wg_old_us']:.3f}  cuBLAS/new "
              f"{row['cublas_us'] / row['wg_new_us']:.2f}", flush=True)
    del qs, ws
    torch.cuda.empty_cache()
if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
    json.dump(out, open(sys.argv[1], "w"), indent=1)
