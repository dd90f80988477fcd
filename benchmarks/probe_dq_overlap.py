"""Large M: fastnf4 dequantize + cuBLAS with the weight cut into row chunks, each chunk's GEMM (into its columns of
y) on a second stream as soon as its dequantize is done, so that the dequantize of chunk c + 1 can run beside the
GEMM of chunk c (both in one CUDA graph), against the serial dequantize + cuBLAS and bf16 cuBLAS on the unquantized
weight; interleaved graph timing (harness.time_graphs). Correctness first: every schedule against a float64 product
with the dequantized weight, relative to cuBLAS's error on it (outputs poisoned).
usage: python benchmarks/probe_dq_overlap.py [JSON]"""
import json
import math
import os
import sys

import torch

import fastnf4
from fastnf4 import _ops
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graphs
from fastnf4.codebooks import kernel_code

WEIGHTS = [("gemma o", 5376, 4096), ("gemma q", 4096, 5376), ("qwen qkv", 10240, 5120), ("llama q+o", 8192, 8192),
           ("qwen gate+up", 25600, 5120), ("llama gate_up", 57344, 8192)]


def chunk_bounds(n, k, parts):
    # chunk starts on rows whose first element begins a nested-absmax block (256 blocks of 64)
    r0 = 16384 // math.gcd(k, 16384)
    step = -(-n // parts // r0) * r0
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def dq_rows(q, a, b, out):
    n, k = q.shape
    bs = q.blocksize
    nested = q.nested_absmax is not None
    na = q.nested_absmax[a * k // bs // 256: -(-b * k // bs // 256)] if nested else None
    _ops.dequantize_4bit_out(q.packed_u8[a * k // 2: b * k // 2], q.absmax[a * k // bs: b * k // bs],
                             kernel_code(q.quant_type, q.device), bs, (b - a) * k, q.nested_code, na, q.offset,
                             q.nested_blocksize, out[a:b].view(-1))


def make(q, x, wd, y, side, parts):
    n, k = q.shape
    bounds = chunk_bounds(n, k, parts)

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        for a, b in bounds:
            dq_rows(q, a, b, wd)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.mm(x, wd[a:b].T, out=y[:, a:b])
        main.wait_stream(side)
        return y
    return run


out = {"env": {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FASTNF4_COMMIT", "?")}, "rows": []}
torch.manual_seed(0)
side = torch.cuda.Stream()
for name, n, k in WEIGHTS:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    wd_ref = fastnf4.dequantize(q)
    for m in (512, 2048):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.double() @ wd_ref.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        e_cub = rel(x @ wd_ref.T)
        errs = {}
        for parts in (2, 4):
            wd = torch.full_like(wd_ref, float("nan"))
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            make(q, x, wd, y, side, parts)()
            torch.cuda.synchronize()
            assert torch.equal(wd, wd_ref), (name, parts)
            errs[parts] = rel(y) / e_cub
            assert torch.isfinite(y).all() and errs[parts] <= 1.1, (name, m, parts, errs[parts])
        reps = rotation_count(q.nbytes())
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        reps_w = rotation_count(n * k * 2)
        wts = [w] + [w.clone() for _ in range(reps_w - 1)]
        wds = [torch.empty_like(wd_ref) for _ in range(2)]
        ys = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        prov = {"cublas": [lambda i=i: x @ wts[i].T for i in range(reps_w)],
                "serial": [lambda i=i: x @ fastnf4.dequantize(qs[i]).T for i in range(reps)]}
        for parts in (2, 4):
            prov[f"pipe{parts}"] = [make(qs[i], x, wds[i % 2], ys[i % 2], side, parts) for i in range(reps)]
        t = time_graphs(prov, per_graph=10, replays=10)
        row = dict(weight=name, N=n, K=k, M=m, err=errs, **{f"{kk}_us": v["median_us"] for kk, v in t.items()})
        out["rows"].append(row)
        print(f"{name:14} M {m:5d} cuBLAS {row['cublas_us']:7.1f} serial {row['serial_us']:7.1f} "
              f"({row['serial_us'] / row['cublas_us']:.3f}) pipe2 {row['pipe2_us']:7.1f} "
              f"({row['pipe2_us'] / row['cublas_us']:.3f}) pipe4 {row['pipe4_us']:7.1f} "
              f"({row['pipe4_us'] / row['cublas_us']:.3f})", flush=True)
        del qs, wts, wds, ys, ref
        torch.cuda.empty_cache()
if len(sys.argv) > 1:
    json.dump(out, open(sys.argv[1], "w"), indent=1)
