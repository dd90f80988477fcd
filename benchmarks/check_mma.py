"""Device check of the CUDA tensor-core decode kernel (ops/matmul/gemv_mma.cu): correctness on odd shapes
first (float64 reference on the dequantized weight, error against cuBLAS on that weight, poisoned output),
then time on the model shapes beside bf16 cuBLAS, bitsandbytes, the Triton paths and dequantize + cuBLAS.
usage: python benchmarks/check_mma.py [OUT.json] [M ...]"""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args as args
from fastnf4.bench.common import bnb_functional, clone_weight
from fastnf4.bench.harness import copy_bandwidth, environment, rotation_count, selected_shapes, time_graph
from fastnf4.bench.matmul import rel_err as err
from fastnf4.ops.matmul import dispatch, gemv_mma


def correctness():
    worst = 0.0
    fails = []
    cases = 0
    for n, k in [(4096, 4096), (1000, 4128), (17, 96), (3000, 5376), (40, 32)]:
        for bs in (32, 64, 128, 256, 1024, 4096):
            for nested in (False, True):
                for dtype in (torch.bfloat16, torch.float16):
                    w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.05
                    q = fastnf4.quantize(w, blocksize=bs, double_quant=nested)
                    wd = fastnf4.dequantize(q)
                    for m in (1, 2, 3, 5, 8, 11, 16, 24, 32):
                        x = torch.randn(m, k, device="cuda", dtype=dtype)
                        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
                        ref = x.double() @ wd.double().T + (bias.double() if bias is not None else 0)
                        yc = torch.nn.functional.linear(x, wd, bias)
                        e_cub = err(yc, ref)
                        for splits in (None, (1, 10**6), (3, -(-(-(-k // 128)) // 3))):
                            y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                            gemv_mma.launch(x, *args(q, bias), y=y, splits=splits)
                            torch.cuda.synchronize()
                            e = err(y, ref)
                            cases += 1
                            ratio = e / max(e_cub, 1e-12)
                            worst = max(worst, ratio)
                            if not (ratio <= 2.0 and torch.isfinite(y).all()):
                                fails.append((n, k, bs, nested, str(dtype), m, splits, e, e_cub))
    # the dispatcher end to end, and a capture in a CUDA graph
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) * 0.02
    q = fastnf4.quantize(w)
    x = torch.randn(1, 8192, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ fastnf4.dequantize(q).double().T
    g = torch.cuda.CUDAGraph()
    y = fastnf4.linear(x, q)
    with torch.cuda.graph(g):
        yg = fastnf4.linear(x, q)
    yg.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    graph_ok = err(yg, ref) < 1e-2 and torch.equal(yg, y)
    return dict(cases=cases, worst_err_ratio=worst, fails=fails[:400], nfails=len(fails), graph_ok=bool(graph_ok))


def timing(ms):
    F = bnb_functional()
    copy = copy_bandwidth()["GBps"]
    rows = []
    shapes = selected_shapes(None)
    if os.environ.get("QUICK"):
        shapes = [s for s in shapes if (s[0], s[1]) in {("llama-3.3-70b", "gate_up"), ("llama-3.3-70b", "down"),
                                                          ("qwen3-32b", "qkv"), ("gemma-3-27b", "o"),
                                                          ("llama-3.3-70b", "k+v")}]
    for model, layer, n, k in shapes:
        g = torch.Generator(device="cuda").manual_seed(n + k)
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g) * 0.02
        if F is not None:
            packed, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
            q = fastnf4.NF4Weight.from_bnb(packed, qs)
        else:
            q = fastnf4.quantize(w)
        reps = rotation_count(n * k * 2)
        ws = [w] + [w.clone() for _ in range(reps - 1)]
        qs_ = [q] + [clone_weight(q) for _ in range(reps - 1)]
        bnbs = [(c.packed, c.to_bnb()[1]) for c in qs_] if F is not None else None
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=g)
            floor = (q.nbytes() + 2 * m * (n + k)) / copy / 1e3
            row = dict(model=model, layer=layer, N=n, K=k, M=m, nf4_mb=q.nbytes() / 1e6, floor_us=floor)
            provs = {"mma": lambda i: gemv_mma.launch(x, *args(qs_[i])),
                     "cublas": lambda i: x @ ws[i].T,
                     "dq_cublas": lambda i: x @ fastnf4.dequantize(qs_[i]).T}
            if m <= 2 and not os.environ.get("QUICK"):
                provs["triton_gemv"] = lambda i: dispatch.linear_triton(x, *args(qs_[i]), path="gemv")
            if F is not None:
                import bitsandbytes
                provs["bnb"] = lambda i: bitsandbytes.matmul_4bit(x, bnbs[i][0].t(), quant_state=bnbs[i][1])
            if os.environ.get("MMA_ONLY"):  # variant sweeps: the kernel alone
                provs = {"mma": provs["mma"]}
            for name, fn in provs.items():
                row[name + "_us"] = time_graph([lambda i=i, fn=fn: fn(i) for i in range(reps)], per_graph=20,
                                               replays=10)["median_us"]
            row["pct_floor"] = 100 * floor / row["mma_us"]
            row["vs_cublas"] = row.get("cublas_us", float("nan")) / row["mma_us"]
            row["vs_bnb"] = row.get("bnb_us", float("nan")) / row["mma_us"]
            rows.append(row)
            print(f"{model:14s} {layer:8s} {n:6d} {k:6d} M={m:<3d} floor {floor:7.1f} mma {row['mma_us']:7.1f} "
                  f"({row['pct_floor']:4.0f}%) cublas {row.get('cublas_us', 0):7.1f} bnb {row.get('bnb_us', 0):7.1f} "
                  f"dq+cub {row.get('dq_cublas_us', 0):7.1f} tg {row.get('triton_gemv_us', 0):7.1f} "
                  f"x{row['vs_cublas']:.2f} cub x{row['vs_bnb']:.2f} bnb", flush=True)
        del ws, qs_, bnbs
        torch.cuda.empty_cache()
    return dict(copy_GBps=copy, rows=rows)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else None
    ms = [int(a) for a in sys.argv[2:]] or [1, 4, 8, 16]
    c = correctness() if not os.environ.get("QUICK") else {}
    print("correctness:", json.dumps(c), flush=True)
    t = timing(ms)
    if out:
        json.dump(dict(correctness=c, timing=t, env=environment()), open(out, "w"), indent=1)
