"""The wgmma kernel's split plans at M = 128 (and any --m): every model weight of >= 8 MB with its own plan
(``wgmma.plan``) and with K forced into s = 1 / 2 / 3 / 4 / 6 parts for every row tile, each checked on fresh data with
a poisoned output (exact decode at BM >= 64: error within 1.1x cuBLAS's), then timed in one interleaved graph timing
with bf16 cuBLAS (``probe_weights.check_and_time``). Session 30 saw the two-row-group build (half as many tiles)
gain 15% on Qwen qkv, whose 80 row tiles run whole on 132 SMs by the production plan.
usage: python benchmarks/probe_wgmma_m128_plans.py [--m 128] [JSON]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import wgmma
from probe_weights import check_and_time, model_weights, rotated, write_rows

M = int(sys.argv[sys.argv.index("--m") + 1]) if "--m" in sys.argv else 128
SPLITS = (1, 2, 3, 4, 6)


def main():
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        x = torch.randn(M, k, dtype=torch.bfloat16, device="cuda")
        runs = {"plan": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y)}
        runs.update({f"s{s}": (lambda x, q, y=None, s=s: wgmma.launch(x, *linear_args(q), y=y, splits=s))
                     for s in SPLITS})
        us, errs = check_and_time(x, wd, ws, qs, runs, f"{model} {layer}")
        assert max(errs.values()) <= 1.1, (model, layer, errs)
        prepared = wgmma.Prepared(*linear_args(q))
        own = prepared.launch_plan(M, x.dtype)
        best = min((p for p in us if p != "cublas"), key=us.get)
        rows.append(dict(model=model, layer=layer, N=n, K=k, M=M, plan=own, us=us, err=errs, best=best))
        print(f"{model[:6]} {layer:8s} plan {own[1]}x{own[2]} full {own[3]:3d}: {us['plan']:6.1f} us, best {best} "
              f"{us[best]:6.1f} (cuBLAS {us['cublas']:6.1f}) | " + " ".join(f"{p}:{us[p]:.1f}" for p in runs), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
