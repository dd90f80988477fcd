"""dequantize + cuBLAS with the dequantize's output stores .cs (0, the kernel's), plain (1) or evict_last (2): does keeping
the dequantized weight in the L2 for the GEMM that reads it next pay at M = 512 / 2048? (session 33; the kernel switch
OUT_HINT existed only in the commit that ran this, reverted in the next)
usage: python benchmarks/probe_dq_out_hint.py [JSON]"""
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import time_graphs
from fastnf4.ops.dequantize import kernel as dq_kernel
from probe_weights import model_weights, rotated, write_rows

PICK = {("gemma-3-27b", "o"), ("gemma-3-27b", "q"), ("qwen3-32b", "o"), ("llama-3.3-70b", "q+o"),
        ("gemma-3-27b", "gate+up"), ("qwen3-32b", "q")}


def main():
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        if (model, layer) not in PICK:
            continue
        ws, qs = rotated(w, q)
        r = len(qs)
        preps = {h: [dq_kernel.Prepared(*(lambda a: (a[0], a[1], a[2], a[3], n * k, a[6], a[7], a[8], a[9]))(
            linear_args(qq)), out_hint=h) for qq in qs] for h in (0, 1, 2)}
        ref = fastnf4.dequantize(qs[0]).view(-1)
        for h in (0, 1, 2):
            out = torch.full((n * k,), float("nan"), dtype=torch.bfloat16, device="cuda")
            assert torch.equal(preps[h][0](out), ref), h

        def dq(h, i):
            return preps[h][i](torch.empty(n * k, dtype=torch.bfloat16, device="cuda")).view(n, k)

        for m in (512, 2048):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            provs = {"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))]}
            for h in (0, 1, 2):
                provs[f"dq{h}"] = [lambda i=i, h=h: dq(h, i) for i in range(r)]
                provs[f"dq{h}+mm"] = [lambda i=i, h=h: x @ dq(h, i).T for i in range(r)]
            t = time_graphs(provs, per_graph=10, replays=10)
            us = {p: v["median_us"] for p, v in t.items()}
            rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, us=us))
            print(f"{model[:6]} {layer:7s} M {m:4d}: " + " ".join(f"{p} {v:.1f}" for p, v in us.items())
                  + " | /cuBLAS " + " ".join(f"{us[f'dq{h}+mm'] / us['cublas']:.3f}" for h in (0, 1, 2)), flush=True)
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
