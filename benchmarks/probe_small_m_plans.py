"""The weights of >= 8 MB that lose to bf16 cuBLAS at M = 8-32 (Gemma q / o / qkv / gate+up, Qwen q / qkv): every
kernel and split plan the package has for them, timed against cuBLAS and the production dispatch in one interleaved
graph timing (``harness.time_graphs``): the wgmma kernel with K split into s parts (every row tile), with the first
``full`` row tiles whole and the rest split (the tail plan), and the mma GEMM kernel (gemv_mma.cu) with its plan and
with forced splits. Each variant is first checked on fresh data with a poisoned output (error against a float64
product with the dequantized weight within 2x cuBLAS's, the issue's budget for these rounded-code kernels).
``--all``: every model weight of >= 8 MB with the kernels' own plans and the one-wave tail plans (dispatch at M 8-32).
``--m 8,16,32`` the rows of x, ``--only "gemma o,gemma qkv"`` some of the six weights; at M > 16 also two 16-row x tiles.
usage: python benchmarks/probe_small_m_plans.py [--all] [--m ...] [--only ...] [JSON]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma, wgmma
from probe_weights import check_and_time, model_weights, production, rotated, write_rows

MS = [int(v) for v in sys.argv[sys.argv.index("--m") + 1].split(",")] if "--m" in sys.argv else [8, 16, 32]
ONLY = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
WEIGHTS = [("gemma q", 4096, 5376), ("gemma o", 5376, 4096), ("gemma qkv", 8192, 5376),
           ("gemma gate+up", 21504, 5376), ("qwen q", 8192, 5120), ("qwen qkv", 10240, 5120)]


def variants(n, k, m, wide=True):
    """Every forced plan (``wide``), or (``--all``) the two kernels' own plans plus, where the row tiles fill more than
    half of the 264 two-block slots but not all of them, the tail plans that fill one wave with s = 2 / 3 / 4."""
    tiles = -(-n // 128)
    out = {"wg": dict(kind="wgmma", splits=None), "mma": dict(kind="mma")}
    if not wide:
        slots = 264
        if slots // 2 < tiles < slots:
            for s in (2, 3, 4):
                full = max(0, min(tiles - 1, -(-(s * tiles - slots) // (s - 1))))
                out[f"wg f{full} s{s}"] = dict(kind="wgmma", splits=s, full_tiles=full)
        return out
    for s in (1, 2, 3, 4, 5, 6, 8, 10, 12):
        out[f"wg s{s}"] = dict(kind="wgmma", splits=s)
        if m > 16:  # two 16-row x tiles instead of one of 32
            out[f"wg bm16 s{s}"] = dict(kind="wgmma", splits=s, bm=16)
    for full in (tiles // 2, (2 * tiles) // 3, tiles - tiles // 4):
        for s in (2, 3, 4, 6):
            if 0 < full < tiles:
                out[f"wg f{full} s{s}"] = dict(kind="wgmma", splits=s, full_tiles=full)
    slices = -(-k // gemv_mma.SLICE)
    for s in (1, 2, 3, 4, 6, 8):
        per = -(-slices // s)
        out[f"mma s{s}"] = dict(kind="mma", splits=(-(-slices // per), per))
    return out


def weights(every: bool):
    """(name, n, k, w, q): the losing weights above, or (``--all``) every model weight of >= 8 MB."""
    if every:
        for model, layer, n, k, w, q in model_weights():
            yield f"{model[:6]} {layer}", n, k, w, q
        return
    for name, n, k in WEIGHTS:
        if ONLY and name not in ONLY:
            continue
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        yield name, n, k, w, fastnf4.quantize(w, blocksize=64, double_quant=True)


def run(v, x, q, y=None):
    if v["kind"] == "wgmma":
        return wgmma.launch(x, *linear_args(q), y=y, splits=v["splits"], full_tiles=v.get("full_tiles"),
                            bm=v.get("bm"))
    return gemv_mma.launch(x, *linear_args(q), y=y, splits=v.get("splits"))


def main():
    rows = []
    torch.manual_seed(0)
    every = "--all" in sys.argv
    for name, n, k, w, q in weights(every):
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        for m in MS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            runs = {"fastnf4": production}
            runs.update({name_v: (lambda x, q, y=None, v=v: run(v, x, q, y))
                         for name_v, v in variants(n, k, m, wide=not every).items()})
            us, errs = check_and_time(x, wd, ws, qs, runs, name)
            best = min((p for p in us if p not in ("cublas", "fastnf4")), key=us.get)
            rows.append(dict(name=name, N=n, K=k, M=m, us=us, err=errs, best=best))
            print(f"{name:14s} M {m:2d} cuBLAS {us['cublas']:6.1f} fastnf4 {us['fastnf4']:6.1f} best {best} "
                  f"{us[best]:6.1f} ({us['cublas'] / us[best]:.2f}x cuBLAS) | "
                  + " ".join(f"{p}:{v:.1f}" for p, v in sorted(us.items(), key=lambda kv: kv[1])[:6]), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
