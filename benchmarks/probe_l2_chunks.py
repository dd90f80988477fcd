"""Dequantize + cuBLAS in row chunks through one L2-sized buffer (M >= 128): does the bf16 weight stay in the L2
between a chunk's dequantize and its GEMM, so that neither the dequantize's writes nor the GEMM's weight reads go to
HBM? Per weight and M: bf16 cuBLAS on the unquantized weight, fastnf4 dequantize + cuBLAS on the whole weight, and the
chunked form with chunks of ~16 / 24 / 32 MB of bf16 (one reused buffer; each chunk's GEMM writes the columns of y
it owns through a strided output view). Error of each against a float64 product with the dequantized weight, relative
to cuBLAS's (fresh data, outputs poisoned), then graph timing with the providers' replays interleaved and the packed
/ bf16 weights rotated past the L2. usage: python benchmarks/probe_l2_chunks.py [--json FILE]"""
import json
import sys

import torch

import fastnf4
from fastnf4 import _ops
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import rotation_count, time_graphs
from fastnf4.codebooks import kernel_code

SHAPES = [("llama q+o", 8192, 8192), ("llama gate_up", 57344, 8192), ("llama down", 8192, 28672),
          ("qwen q", 8192, 5120), ("qwen gate+up", 25600, 5120), ("gemma o", 5376, 4096)]
MS = [128, 256, 512, 2048]
CHUNK_MB = [16, 24, 32]


def chunk_rows(n, k, mb):
    rows = max(64, (mb * 2**20 // (2 * k)) // 64 * 64)  # whole nested-statistics groups (K % 64 == 0 here)
    return min(rows, n)


def chunked(x, q, buf, rows, y):
    n, k = q.shape
    code = kernel_code(q.quant_type, q.device)
    per_row = k // q.blocksize  # absmax entries per row
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        a0, a1 = r0 * per_row, r1 * per_row
        assert a0 % q.nested_blocksize == 0
        w = buf[: (r1 - r0) * k]
        _ops.dequantize_4bit_out(q.packed_u8[r0 * k // 2: r1 * k // 2], q.absmax[a0:a1], code, q.blocksize,
                                 (r1 - r0) * k, q.nested_code,
                                 q.nested_absmax[a0 // q.nested_blocksize: -(-a1 // q.nested_blocksize)], q.offset,
                                 q.nested_blocksize, w)
        torch.mm(x, w.view(r1 - r0, k).T, out=y[:, r0:r1])
    return y


rows_out = []
torch.manual_seed(0)
for name, n, k in SHAPES:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w)
    wd = fastnf4.dequantize(q)
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    reps_w = rotation_count(n * k * 2)
    wts = [wd] + [wd.clone() for _ in range(reps_w - 1)]
    full_buf = torch.empty(n * k, dtype=torch.bfloat16, device="cuda")
    for m in MS:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.double() @ wd.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        e_cublas = rel(x @ wd.T)
        providers = {"cublas": [lambda i=i: x @ wts[i].T for i in range(reps_w)],
                     "dq+cublas": [lambda i=i: x @ fastnf4.dequantize(qs[i], out=full_buf).T for i in range(reps)]}
        line = {"shape": name, "N": n, "K": k, "M": m}
        for mb in CHUNK_MB:
            rows = chunk_rows(n, k, mb)
            if rows >= n:
                continue
            buf = torch.empty(rows * k, dtype=torch.bfloat16, device="cuda")
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            chunked(x, q, buf, rows, y)
            err = rel(y) / e_cublas
            assert torch.isfinite(y).all() and err <= 1.05, (name, m, mb, err)
            line[f"err_{mb}"] = err
            ys = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
            providers[f"chunk{mb}"] = [lambda i=i, b=buf, r=rows: chunked(x, qs[i], b, r, ys[i % 2])
                                       for i in range(reps)]
        t = time_graphs(providers, per_graph=5, replays=10)
        for p, v in t.items():
            line[p] = v["median_us"]
        rows_out.append(line)
        best = min((v, p) for p, v in line.items() if p.startswith("chunk"))
        print(f"{name:14s} M {m:4d} cublas {line['cublas']:7.1f} dq+cublas {line['dq+cublas']:7.1f} "
              + " ".join(f"{p} {line[p]:7.1f}" for p in line if p.startswith("chunk"))
              + f"  ratio dq {line['dq+cublas'] / line['cublas']:.3f} best {best[0] / line['cublas']:.3f}", flush=True)
        del x, ref
    del qs, wts, full_buf, w, wd
    torch.cuda.empty_cache()
if "--json" in sys.argv:
    json.dump(rows_out, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
