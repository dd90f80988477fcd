"""``fastnf4 bench matmul``: y = x @ W.T at M rows, for every linear shape of the three models.

Providers, in one run: bf16 cuBLAS on the unquantized weight, bitsandbytes ``matmul_4bit`` (double quant),
fastnf4 dequantize + cuBLAS, fastnf4 ``linear``. ``floor_us`` = NF4 bytes (packed + 8-bit statistics + x + y)
over the copy bandwidth. Correctness first, on fresh data: relative Frobenius error of fastnf4 ``linear`` and of
cuBLAS on the dequantized weight against a float64 reference.
"""
from __future__ import annotations

import time

import torch

import fastnf4
import fastnf4.ops.matmul.dispatch
from fastnf4.bench.common import bnb_functional, clone_weight
from fastnf4.bench.harness import copy_bandwidth, format_table, progress, rotation_count, selected_shapes, time_graphs
from fastnf4.bench.registry import register

M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048)


def _forced(x, q, path):
    from fastnf4.api import linear_args
    from fastnf4.ops.matmul import dispatch

    return dispatch.linear_triton(x, *linear_args(q), path=path)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


@register("matmul")
def run(opts) -> dict:
    F = bnb_functional()
    copy = copy_bandwidth()
    shapes = selected_shapes(opts.models)
    ms = tuple(opts.m) if getattr(opts, "m", None) else M_VALUES
    rows = []
    for model, layer, n, k in progress(shapes, desc="matmul"):
        g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g) * 0.02
        if F is not None:
            packed, qs = F.quantize_4bit(w, blocksize=opts.blocksize, compress_statistics=True, quant_type="nf4")
            q = fastnf4.NF4Weight.from_bnb(packed, qs)
        else:
            q = fastnf4.quantize(w, blocksize=opts.blocksize, double_quant=True)
        wd = fastnf4.dequantize(q)
        wd64 = wd.double()
        reps = rotation_count(n * k * 2)
        ws = [w] + [w.clone() for _ in range(reps - 1)]
        qs_ = [q] + [clone_weight(q) for _ in range(reps - 1)]
        bnbs = [(x.packed, x.to_bnb()[1]) for x in qs_] if F is not None else None
        nf4_bytes = q.nbytes()
        # the previous weight's M = 512-2048 rows leave the SM clock power-capped for ~0.2 s (H200: 1455 instead of
        # 1980 MHz right after 3 s of GEMMs; benchmarks/probe_clock.py): the compute-bound decode kernels measured
        # up to 25% slower in the M = 1 rows that followed, memory-bound kernels did not (NOTES.md, session 13)
        torch.cuda.synchronize()
        time.sleep(0.5)
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=g)
            ref = x.double() @ wd64.T
            y = fastnf4.linear(x, q)
            row = dict(op="matmul", model=model, layer=layer, N=n, K=k, M=m, dtype="bfloat16", nested=True,
                       blocksize=opts.blocksize, nf4_mb=nf4_bytes / 1e6,
                       err_fastnf4=rel_err(y, ref), err_cublas_dequant=rel_err(x @ wd.T, ref))
            row["err_ratio"] = row["err_fastnf4"] / row["err_cublas_dequant"]
            from fastnf4.ops.matmul import dispatch

            row["path"] = dispatch.pick_path(x, q.packed_u8, opts.blocksize, n, k, q.nested_code is not None,
                                             q.nested_blocksize)
            floor_bytes = nf4_bytes + m * k * 2 + m * n * 2
            row["floor_us"] = floor_bytes / copy["GBps"] / 1e3
            provs = {
                "cublas_bf16": lambda i: x @ ws[i].T,
                "fastnf4_dq_cublas": lambda i: x @ fastnf4.dequantize(qs_[i]).T,
                "fastnf4": lambda i: fastnf4.linear(x, qs_[i]),
            }
            if m <= 256 and fastnf4.ops.matmul.kernel.group_elems(k, opts.blocksize):
                # the fused tensor-core GEMM on its own, whatever the dispatcher picks (for the thresholds)
                provs["fastnf4_gemm"] = lambda i: _forced(x, qs_[i], "gemm")
            if F is not None:
                import bitsandbytes

                provs["bnb"] = lambda i: bitsandbytes.matmul_4bit(x, bnbs[i][0].t(), quant_state=bnbs[i][1])
            # interleaved replays: at M >= 512 the GEMMs lower the SM clock within the row (time_graphs)
            times = time_graphs({name: [lambda i=i, fn=fn: fn(i) for i in range(reps)] for name, fn in provs.items()},
                                per_graph=10 if m >= 512 else 20, replays=10)
            for name, t in times.items():
                row[f"{name}_us"] = t["median_us"]
            row["fastnf4_pct_floor"] = 100 * row["floor_us"] / row["fastnf4_us"]
            row["vs_cublas"] = row["cublas_bf16_us"] / row["fastnf4_us"]
            if F is not None:
                row["vs_bnb"] = row["bnb_us"] / row["fastnf4_us"]
            rows.append(row)
        del ws, qs_, bnbs, wd, wd64
        torch.cuda.empty_cache()
    cols = [("model", "{}"), ("layer", "{}"), ("N", "{}"), ("K", "{}"), ("M", "{}"), ("path", "{}"),
            ("err_ratio", "{:.2f}"), ("floor_us", "{:.1f}"), ("fastnf4_us", "{:.1f}"), ("fastnf4_pct_floor", "{:.0f}"),
            ("cublas_bf16_us", "{:.1f}"), ("bnb_us", "{:.1f}"), ("fastnf4_dq_cublas_us", "{:.1f}"), ("fastnf4_gemm_us", "{:.1f}"),
            ("vs_cublas", "{:.2f}"), ("vs_bnb", "{:.2f}")]
    table = f"copy bandwidth: {copy['GBps']:.0f} GB/s\n" + format_table(rows, cols)
    return {"copy": copy, "rows": rows, "table": table}
