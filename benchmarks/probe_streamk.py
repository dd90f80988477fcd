"""The burst decode kernel with its stream-K split (gemv_mma.cu variant 9, session 29: every block the same share of the
tiles' slice pairs) forced on every model weight it takes (K % 256 == 0, M K <= 16384) at M = 1 and 2, against
fastnf4.linear (the dispatcher's pick) and bf16 cuBLAS in one interleaved graph timing per weight, after the checks of
probe_weights.check_and_time (error within 2x cuBLAS's on the dequantized weight, NaN-poisoned output) and a check that
two calls give the same bits. Prints the plan (grid, slots) per weight.
usage: [FASTNF4_PROBE_MIN_MB=2] python benchmarks/probe_streamk.py [OUT.json]"""
import os

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import copy_bandwidth
from fastnf4.ops.matmul import gemv_mma
from probe_weights import check_and_time, model_weights, production, rotated, write_rows


def burst(x, q, y=None):
    return gemv_mma.launch(x, *linear_args(q), y=y, kernel=gemv_mma.BURST)


def main():
    gbs = copy_bandwidth()["GBps"]
    lib = gemv_mma._lib_for(torch.cuda.current_device())
    blocks = lib.sms * lib.occupancy[(0, gemv_mma.BURST, 1)]
    rows = []
    for model, layer, n, k, w, q in model_weights(float(os.environ.get("FASTNF4_PROBE_MIN_MB", "2")) * 1e6):
        if k % 256:
            continue
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q, torch.bfloat16)
        for m in (1, 2):
            if m * k > 16384:
                continue
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            a, b = burst(x, q), burst(x, q)
            assert torch.equal(a, b), (model, layer, m)
            t, errs = check_and_time(x, wd, ws, qs, {"linear": production, "burst": burst}, f"{model} {layer}")
            floor = q.nbytes() / gbs / 1e3
            grid, slots = gemv_mma.burst_plan(n, k, blocks)
            pick = gemv_mma.Prepared(x, *linear_args(q)).v
            rows.append({"model": model, "layer": layer, "N": n, "K": k, "M": m, "floor_us": floor, "us": t,
                         "err": errs, "grid": grid, "slots": slots, "linear_kernel": pick})
            print(f"{model[:6]:6} {layer:8} M {m} floor {floor:5.1f} | linear {t['linear']:6.1f} (v{pick}) burst "
                  f"{t['burst']:6.1f} cublas {t['cublas']:6.1f} | burst/linear {t['burst'] / t['linear']:.3f} | "
                  f"% floor linear {100 * floor / t['linear']:4.1f} burst {100 * floor / t['burst']:4.1f} | "
                  f"grid {grid} slots {slots} err {errs['burst']:.2f}", flush=True)
        del ws, qs
    write_rows(rows)


if __name__ == "__main__":
    main()
