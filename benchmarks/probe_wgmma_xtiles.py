"""The wgmma kernel with fewer x rows per block than M (several x tiles: each weight tile decoded once per x tile,
but more blocks in flight) against the default BM (block_m: one x tile up to 256 rows), at M = 64 / 128 / 256, on
every model weight of >= 8 MB: each variant first checked on fresh data with a poisoned output (error against a
float64 product with the dequantized weight within 2x cuBLAS's), then interleaved graph timing with bf16 cuBLAS
(harness.time_graphs). usage: python benchmarks/probe_wgmma_xtiles.py [--ms 64,128,256] [JSON]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import wgmma
from probe_weights import check_and_time, model_weights, rotated, write_rows


def main():
    ms = [int(v) for v in sys.argv[sys.argv.index("--ms") + 1].split(",")] if "--ms" in sys.argv else [64, 128, 256]
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        for m in ms:
            runs = {f"bm{wgmma.block_m(m)}": lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y)}
            for bm in (b for b in wgmma.BLOCK_M if m // 4 <= b < wgmma.block_m(m) and b >= 32):
                runs[f"bm{bm}"] = lambda x, q, y=None, bm=bm: wgmma.launch(x, *linear_args(q), y=y, bm=bm)
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            us, errs = check_and_time(x, wd, ws, qs, runs, f"{model} {layer}")
            rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, us=us, err=errs))
            print(f"{model[:6]} {layer:8s} M {m:3d}: " + " ".join(f"{p} {v:.1f}" for p, v in us.items()), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
