"""The burst GEMM (benchmarks/probe_burst16.cu) at M = 3-32: checks (error against a float64 product within 2x
cuBLAS's, NaN-poisoned output, odd N and M, blocksizes 64-4096, double quant on / off, fp16 / bf16, bias, several
passes of x rows), then each build, fastnf4.linear and bf16 cuBLAS in one interleaved graph timing per (weight, M):
Gemma o at M 4 / 8 / 16 / 32 and Gemma q at M = 8 (FASTNF4_PROBE_WIDE=1: also Llama q+o, Qwen q / o and Gemma gate+up
at M = 8, the first run's set); the one-n-tile builds at M <= 8, the two-n-tile ones above.
usage: python benchmarks/probe_burst16.py [OUT.json]"""
import ctypes
import os

import torch

import fastnf4
from fastnf4 import _cuda
from fastnf4.bench.harness import copy_bandwidth
from probe_weights import (check_and_time, error_ratio, model_weights, probe_launcher, production, rotated,
                           write_rows)

CFGS = {0: "w8 nt2", 1: "w8 nt1", 2: "w12 nt2", 3: "w8 nt2 ax", 4: "w12 nt2 a1 ax", 5: "w16 nt2 a1 ax", 6: "w8 nt1 ax"}
SHAPE = {0: (8, 2), 1: (8, 1), 2: (12, 2), 3: (8, 2), 4: (12, 2), 5: (16, 2), 6: (8, 1)}  # (warps, n-tiles)
SMEM_MAX = 232448


def fits(cfg, k):
    w, nt = SHAPE[cfg]
    return 65536 + 1024 + 2 * w * 1024 + 8 * nt * (2 * k + 16) <= SMEM_MAX


def main():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_burst16.cu")
    lib = ctypes.CDLL(_cuda.compile_source(src, _cuda.device_arch(0)))  # (FASTNF4_CACHE: a prebuilt library)
    launcher = probe_launcher(lib.probe_burst16, "probe_burst16")

    fails = 0
    for cfg in CFGS:
        run = launcher(cfg)
        for (m, n, k, bs, nested, bias, dt) in ((16, 1000, 4096, 64, True, False, torch.bfloat16),
                                                (5, 777, 2048, 128, False, True, torch.float16),
                                                (32, 5376, 4096, 64, True, True, torch.bfloat16),
                                                (3, 40, 1280, 64, True, True, torch.bfloat16),
                                                (13, 300, 3072, 4096, False, False, torch.float16),
                                                (24, 17, 256, 256, True, False, torch.bfloat16),
                                                (8, 2048, 8192, 64, True, False, torch.bfloat16)):
            if not fits(cfg, k):
                continue
            r, finite = error_ratio(run, m, n, k, bs, nested, bias, dt)
            ok = finite and r <= 2.0
            fails += not ok
            print(f"check {CFGS[cfg]} M {m} {n}x{k} bs {bs} nested {nested} bias {bias} {dt}: err ratio {r:.2f} "
                  f"finite {finite} {'ok' if ok else 'FAIL'}", flush=True)
    print(f"checks: {fails} failed", flush=True)
    if fails:
        return
    gbs = copy_bandwidth()["GBps"]
    rows = []
    plan = {(5376, 4096): (4, 8, 16, 32), (4096, 5376): (8,)}
    if os.environ.get("FASTNF4_PROBE_WIDE"):  # the first run's M = 8 set
        plan.update({(8192, 5120): (8,), (8192, 8192): (8,), (21504, 5376): (8,), (5120, 8192): (8,)})
    for model, layer, n, k, w, q in model_weights(8e6):
        if (n, k) not in plan:
            continue
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q, torch.bfloat16)
        for m in plan[(n, k)]:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            runs = {"linear": production}
            for cfg, name in CFGS.items():
                if fits(cfg, k) and (SHAPE[cfg][1] == 1) == (m <= 8):
                    runs[name] = lambda x, q, y=None, r=launcher(cfg): r(x, q, None, y)
            a = runs[list(runs)[1]](x, q)
            assert torch.equal(a, runs[list(runs)[1]](x, q)), (model, layer, m)
            t, errs = check_and_time(x, wd, ws, qs, runs, f"{model} {layer}")
            floor = q.nbytes() / gbs / 1e3
            rows.append({"model": model, "layer": layer, "N": n, "K": k, "M": m, "floor_us": floor, "us": t,
                         "err": errs})
            best = min((v, nm) for nm, v in t.items() if nm in CFGS.values())
            print(f"{model[:6]:6} {layer:8} M {m:2} | " + " ".join(f"{nm} {v:6.1f}" for nm, v in t.items()) +
                  f" | best {best[1]} {best[0] / t['cublas']:.2f}x cuBLAS's time, linear {t['linear'] / t['cublas']:.2f}x",
                  flush=True)
        del ws, qs
    write_rows(rows)


if __name__ == "__main__":
    main()
