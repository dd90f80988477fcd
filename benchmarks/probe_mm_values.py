"""Does cuBLAS's prefill GEMM time depend on the weight's values? (session 30's probe_dq_gap: cuBLAS on an already
dequantized weight took up to 2.5% longer than on the bf16 weight it came from, e.g. Gemma o at M = 2048 126.9 vs
123.8 us, which is most of that row's miss of issue 3's 1.15x line.) For a few weights at M = 2048, one interleaved
graph timing (harness.time_graphs) of bf16 cuBLAS ``x @ W.T`` on: the random bf16 weight, its fastnf4 dequantization,
that dequantization with its elements shuffled (same values, other places), a weight of zeros, and the bf16 weight
truncated to 3 mantissa bits (8 mantissa patterns). Every weight rotates past the L2.
usage: python benchmarks/probe_mm_values.py [JSON]"""
import torch

import fastnf4
from fastnf4.bench.harness import rotation_count, time_graphs
from probe_dq_gap import PICK  # the same four weights as that probe
from probe_weights import model_weights, write_rows


def main():
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights(only=PICK):
        r = rotation_count(n * k * 2)
        wd = fastnf4.dequantize(q)
        perm = torch.randperm(n * k, device="cuda")
        coarse = (w.float().view(torch.int32) & ~((1 << 20) - 1)).view(torch.float32).to(torch.bfloat16)  # 3 bits
        variants = {"bf16": w, "dequant": wd, "dequant shuffled": wd.flatten()[perm].view(n, k),
                    "zeros": torch.zeros_like(w), "3-bit mantissa": coarse}
        copies = {name: [t] + [t.clone() for _ in range(r - 1)] for name, t in variants.items()}
        x = torch.randn(2048, k, dtype=torch.bfloat16, device="cuda")
        t = time_graphs({name: [lambda c=c: x @ c.T for c in cs] for name, cs in copies.items()},
                        per_graph=10, replays=10)
        us = {p: v["median_us"] for p, v in t.items()}
        rows.append(dict(model=model, layer=layer, N=n, K=k, M=2048, us=us))
        print(f"{model[:6]} {layer:4s} M 2048: " + " ".join(f"{p} {v:.1f}" for p, v in us.items())
              + f" | dequant / bf16 {us['dequant'] / us['bf16']:.3f}, zeros / bf16 {us['zeros'] / us['bf16']:.3f}",
              flush=True)
        del copies, variants
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
