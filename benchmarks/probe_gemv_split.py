"""M = 1 split-row CUDA-core GEMV probe (benchmarks/probe_gemv_split.cu) against ``fastnf4.linear`` (the production
choice) and bitsandbytes, bf16, double-quantized statistics, blocksize 64, graph timing with rotated weights, the
decode-size weights of the three models (K <= 8192: x staged in shared memory). Correctness first on poisoned
outputs: error against a float64 reference on the dequantized weight, relative to cuBLAS's on the same weight.

    python benchmarks/probe_gemv_split.py [--json out.json]
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time

import torch

import fastnf4
from fastnf4 import _cuda
from fastnf4.bench.common import bnb_functional, clone_weight
from fastnf4.bench.harness import environment, rotation_count, time_graph
from fastnf4.codebooks import kernel_code

SRC = __file__.replace(".py", ".cu")
SHAPES = [("llama k/v", 1024, 8192), ("qwen k/v", 1024, 5120), ("gemma k/v", 2048, 5376), ("gemma q", 4096, 5376),
          ("gemma o", 5376, 4096), ("qwen q", 8192, 5120), ("qwen o", 5120, 8192), ("gemma qkv", 8192, 5376),
          ("qwen qkv", 10240, 5120), ("llama q+o", 8192, 8192), ("llama qkv", 10240, 8192)]
CONFIGS = [(s, rw, j) for s in (1, 2, 4, 8) for rw in (1, 2) for j in (2, 4, 6)]
if os.environ.get("FASTNF4_PROBE_SHAPES"):  # e.g. "gemma": only the shapes whose name contains one of these
    SHAPES = [s for s in SHAPES if any(t in s[0] for t in os.environ["FASTNF4_PROBE_SHAPES"].split(","))]
    CONFIGS = [(2, 2, 4), (1, 2, 2)]


class Args(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("absmax", ctypes.c_void_p), ("nested_code", ctypes.c_void_p),
                ("nested_absmax", ctypes.c_void_p), ("offset", ctypes.c_void_p), ("code", ctypes.c_void_p),
                ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("N", ctypes.c_int), ("K", ctypes.c_int),
                ("log2_bs", ctypes.c_int)]


lib = ctypes.CDLL(_cuda.compile_source(SRC, _cuda.device_arch(0)))
lib.probe_gemv_split.argtypes = [ctypes.POINTER(Args), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_void_p]
assert lib.probe_args_size() == ctypes.sizeof(Args)


def launcher(q, x, y, cfg):
    s, rw, j = cfg
    code = kernel_code("nf4", q.device)
    a = Args(packed=q.packed_u8.data_ptr(), absmax=q.absmax.data_ptr(), nested_code=q.nested_code.data_ptr(),
             nested_absmax=q.nested_absmax.data_ptr(), offset=q.offset.data_ptr(), code=code.data_ptr(),
             x=x.data_ptr(), y=y.data_ptr(), N=q.shape[0], K=q.shape[1], log2_bs=q.blocksize.bit_length() - 1)
    per = lib.probe_rows_per_block(s, rw)
    grid = -(-q.shape[0] // per)

    def run():
        rc = lib.probe_gemv_split(ctypes.byref(a), 1, s, rw, j, grid, torch.cuda.current_stream().cuda_stream)
        assert rc == 0, rc
    run.keep = code
    return run


def main():
    out_json = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    F = bnb_functional()
    rows = []
    for name, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g) * 0.02
        if F is not None:
            packed, st = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
            q = fastnf4.NF4Weight.from_bnb(packed, st)
        else:
            q = fastnf4.quantize(w, blocksize=64, double_quant=True)
        wd = fastnf4.dequantize(q)
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda", generator=g)
        ref = x.double() @ wd.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        cub = rel(x @ wd.T)
        reps = rotation_count(q.nbytes())
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        ys = [torch.empty(1, n, dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        torch.cuda.synchronize()
        time.sleep(0.5)
        row = dict(name=name, N=n, K=k, mb=q.nbytes() / 1e6)
        row["prod_us"] = time_graph([lambda i=i: fastnf4.linear(x, qs[i]) for i in range(reps)])["median_us"]
        from fastnf4.api import linear_args
        from fastnf4.ops.matmul import gemv_mma

        for v in (gemv_mma.SPLIT, gemv_mma.DECODE_WIDE):  # through the package's launcher (its grid and plan)
            if v == gemv_mma.SPLIT and not gemv_mma.small_fits(1, k, 2):
                continue
            row[f"v{v}_us"] = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), kernel=v)
                                          for i in range(reps)])["median_us"]
        if F is not None:
            import bitsandbytes

            bq = [(c.packed, c.to_bnb()[1]) for c in qs]
            row["bnb_us"] = time_graph([lambda i=i: bitsandbytes.matmul_4bit(x, bq[i][0].t(), quant_state=bq[i][1])
                                        for i in range(reps)])["median_us"]
        best = None
        for cfg in CONFIGS:
            y = torch.full((1, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            launcher(q, x, y, cfg)()
            err = rel(y) / cub
            runs = [launcher(qs[i], x, ys[i], cfg) for i in range(reps)]
            t = time_graph([lambda i=i: runs[i]() for i in range(reps)])["median_us"]
            row[f"s{cfg[0]}rw{cfg[1]}j{cfg[2]}"] = dict(us=t, err_ratio=err)
            if err < 2 and (best is None or t < best[1]):
                best = (cfg, t)
        row["best"] = best
        rows.append(row)
        print(f"{name:10} {n:6d}x{k:<5d} {row['mb']:5.1f} MB prod {row['prod_us']:6.2f} bnb {row.get('bnb_us', 0):6.2f}"
              f" v6 {row.get('v6_us', 0):6.2f} v5 {row.get('v5_us', 0):6.2f}"
              f" split best {best[1]:6.2f} us {best[0]}  worst err x{max(v['err_ratio'] for v in row.values() if isinstance(v, dict)):.2f}",
              flush=True)
    if out_json:
        with open(out_json, "w") as f:
            json.dump(dict(env=environment(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
