"""The wgmma kernel with 8 rows of x per block (m64n8k16, BM 8) against 16 (BM 16, what M <= 16 takes) at M = 4 / 8,
with the GEMM kernel of gemv_mma.cu and bf16 cuBLAS, on every model weight of >= 8 MB: each variant first checked on
fresh data with a poisoned output (error against a float64 product with the dequantized weight within 2x cuBLAS's),
then interleaved graph timing (harness.time_graphs). usage: python benchmarks/probe_wgmma_bm8.py [JSON]"""

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma, wgmma
from probe_weights import check_and_time, model_weights, rotated, write_rows

VARIANTS = {"wg16": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y, bm=16),
            "wg8": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y, bm=8),
            "mma": lambda x, q, y=None: gemv_mma.launch(x, *linear_args(q), y=y)}


def main():
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        for m in (4, 8):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            us, errs = check_and_time(x, wd, ws, qs, VARIANTS, f"{model} {layer}")
            rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, us=us, err=errs))
            print(f"{model[:6]} {layer:8s} M {m}: " + " ".join(f"{p} {v:.1f}" for p, v in us.items())
                  + f" | wg8/wg16 {us['wg8'] / us['wg16']:.3f}", flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
