"""Where dequantize + cuBLAS loses to cuBLAS alone at prefill sizes (issue 3's M = 2048 line, Gemma o at 1.16x in the
560d779 bench): for a few weights at M = 512 / 2048, one interleaved graph timing (``harness.time_graphs``) of bf16
cuBLAS on the unquantized weight, fastnf4.linear (its dequantize + matmul path), the dequantize alone into a
preallocated buffer, cuBLAS on an already dequantized weight, and the two back to back through one preallocated
buffer. Every input rotates past the L2 as in bench matmul. The "gap" printed is linear - dequantize - matmul
(meaningful where linear takes the dequantize + matmul path: at M = 512 Llama q+o takes the wgmma kernel).
Checked first: linear's output equals cuBLAS on the dequantized weight bit for bit.
usage: python benchmarks/probe_dq_gap.py [JSON]"""
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import time_graphs
from fastnf4.ops.dequantize import kernel as dq_kernel
from probe_weights import model_weights, rotated, write_rows

PICK = {("gemma-3-27b", "o"), ("gemma-3-27b", "q"), ("qwen3-32b", "o"), ("llama-3.3-70b", "q+o")}


def main():
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights(only=PICK):
        ws, qs = rotated(w, q)
        wds = [fastnf4.dequantize(qq) for qq in qs]
        bufs = [torch.empty(n * k, dtype=torch.bfloat16, device="cuda") for _ in qs]

        def dq(i):
            a = linear_args(qs[i])  # (packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nb)
            dq_kernel.launch(a[0], a[1], a[2], bufs[i], a[3], n * k, a[6], a[7], a[8], a[9])
            return bufs[i]

        for m in (512, 2048):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            y = fastnf4.linear(x, qs[0])
            assert torch.equal(y, x @ wds[0].T), (model, layer, m)
            r = len(qs)
            t = time_graphs({
                "cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))],
                "linear": [lambda i=i: fastnf4.linear(x, qs[i]) for i in range(r)],
                "dequant": [lambda i=i: dq(i) for i in range(r)],
                "matmul": [lambda i=i: x @ wds[i].T for i in range(r)],
                "dq+mm": [lambda i=i: x @ dq(i).view(n, k).T for i in range(r)],
            }, per_graph=10, replays=10)
            us = {p: v["median_us"] for p, v in t.items()}
            gap = us["linear"] - us["dequant"] - us["matmul"]
            rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, us=us, gap_us=gap))
            print(f"{model[:6]} {layer:4s} M {m:4d}: " + " ".join(f"{p} {v:.1f}" for p, v in us.items())
                  + f" | linear / cuBLAS {us['linear'] / us['cublas']:.3f}, gap {gap:.1f} us", flush=True)
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
