"""The wgmma kernel with 8 rows of x per block (m64n8k16, BM 8) against 16 (BM 16, what M <= 16 takes) at M = 4 / 8,
with the GEMM kernel of gemv_mma.cu and bf16 cuBLAS, on every model weight of >= 8 MB: each variant first checked on
fresh data with a poisoned output (error against a float64 product with the dequantized weight within 2x cuBLAS's),
then interleaved graph timing (harness.time_graphs). usage: python benchmarks/probe_wgmma_bm8.py [JSON]"""
import json
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, rotation_count, time_graphs
from fastnf4.ops.matmul import gemv_mma, wgmma
from probe_weights import model_weights

VARIANTS = {"wg16": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y, bm=16),
            "wg8": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y, bm=8),
            "mma": lambda x, q, y=None: gemv_mma.launch(x, *linear_args(q), y=y)}


def main():
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        qs = [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)]
        ws = [w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)]
        wd = fastnf4.dequantize(q)
        for m in (4, 8):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ref = x.double() @ wd.double().T
            rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
            base = rel(x @ wd.T)
            prov = {"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))]}
            errs = {}
            for name, run in VARIANTS.items():
                y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                run(x, q, y)
                errs[name] = rel(y) / base
                assert torch.isfinite(y).all() and errs[name] <= 2.0, (model, layer, m, name, errs[name])
                prov[name] = [lambda i=i, run=run: run(x, qs[i]) for i in range(len(qs))]
            t = time_graphs(prov, per_graph=20, replays=10)
            us = {p: r["median_us"] for p, r in t.items()}
            rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, us=us, err=errs))
            print(f"{model[:6]} {layer:8s} M {m}: " + " ".join(f"{p} {v:.1f}" for p, v in us.items())
                  + f" | wg8/wg16 {us['wg8'] / us['wg16']:.3f}", flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    out = [a for a in sys.argv[1:] if a.endswith(".json")]
    if out:
        json.dump({"env": environment(), "rows": rows}, open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
