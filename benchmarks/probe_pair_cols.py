"""The decode kernel with pair columns (gemv_mma.cu kPair, variants 7 / 8: one column group holds four x rows where a
64-code chunk pair lies in one quantization block) at M = 3 / 4 against the production dispatch there (the wgmma kernel
with 8-row x tiles, or the GEMM kernel / dequantize + cuBLAS on small weights) and bf16 cuBLAS, on every model weight.
Checks first: odd shapes, both dtypes, double quant on / off, bias, blocksizes 64-4096, forced splits, poisoned outputs,
error against a float64 product with the dequantized weight within 2x cuBLAS's on the same weight.
usage: python benchmarks/probe_pair_cols.py [--ms 3,4] [JSON]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma, wgmma
from probe_weights import check_and_time, rotated, write_rows
from fastnf4.bench.harness import model_shapes

MS = [int(v) for v in sys.argv[sys.argv.index("--ms") + 1].split(",")] if "--ms" in sys.argv else [3, 4]


def checks():
    torch.manual_seed(1)
    worst, fails = 0.0, 0
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k, bs, nested, bias, v, splits, local, lc in [
            (3, 200, 192, 64, True, True, 7, None, None, None), (4, 1000, 5376, 64, True, False, 8, None, None, None),
            (1, 136, 640, 128, False, True, 7, None, None, None), (2, 4096, 1024, 256, True, False, 8, (3, 3), False, None),
            (4, 520, 4160, 4096, True, True, 7, (5, 7), False, None), (3, 4096, 4096, 64, False, False, 8, (7, 5), False, None),
            (4, 16, 64, 64, False, True, 7, None, None, None), (3, 2056, 8192, 64, True, False, 7, (1, 64), None, None),
            (4, 3000, 5376, 64, True, True, 7, (3, 14), True, None), (3, 1000, 4096, 128, False, False, 8, (4, 8), True, 2),
            (4, 40000, 1536, 64, True, False, 7, (2, 6), True, None), (4, 700, 8192, 64, False, True, 8, (8, 8), True, 2),
        ]:
            w = torch.randn(n, k, dtype=dtype, device="cuda") * 0.02
            q = fastnf4.quantize(w, blocksize=bs, double_quant=nested)
            wd = fastnf4.dequantize(q, dtype)
            x = torch.randn(m, k, dtype=dtype, device="cuda")
            b = torch.randn(n, dtype=dtype, device="cuda") if bias else None
            ref = x.double() @ wd.double().T + (b.double() if bias else 0)
            y = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            gemv_mma.launch(x, *linear_args(q, b), y=y, kernel=v, splits=splits, local=local, local_cluster=lc)
            torch.cuda.synchronize()
            rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
            ratio = rel(y) / rel(torch.nn.functional.linear(x, wd, b))
            ok = bool(torch.isfinite(y).all()) and ratio <= 2.0
            fails += not ok
            worst = max(worst, ratio)
            print(f"check {str(dtype)[6:]:8} M{m} N{n:5d} K{k:5d} bs{bs:5d} nested {int(nested)} bias {int(bias)} "
                  f"v{v} splits {splits} local {local} lc {lc}: err x{ratio:.3f} {'ok' if ok else 'FAIL'}", flush=True)
    print(f"checks: {fails} failed, worst error ratio {worst:.3f}", flush=True)
    return fails


def main():
    if checks():
        sys.exit(1)
    rows = []
    torch.manual_seed(0)
    seen = set()
    for model, layer, n, k in model_shapes():
        if (n, k) in seen:
            continue
        seen.add((n, k))
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w, blocksize=64, double_quant=True)
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        name = f"{model[:6]} {layer}"
        for m in MS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            runs = {"fastnf4": lambda x, q, y=None: fastnf4.linear(x, q) if y is None else y.copy_(fastnf4.linear(x, q))}
            for v in (7, 8):
                tag = f"pair{16 if v == 7 else 20}"
                runs[tag] = lambda x, q, y=None, v=v: gemv_mma.launch(x, *linear_args(q), y=y, kernel=v)
                runs[tag + "g"] = lambda x, q, y=None, v=v: gemv_mma.launch(x, *linear_args(q), y=y, kernel=v, local=False)
            if wgmma.supports(x, q.packed_u8, 64, n, k, True):
                runs["wgmma"] = lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y)
            us, errs = check_and_time(x, wd, ws, qs, runs, name)
            rows.append(dict(name=name, N=n, K=k, M=m, us=us, err=errs))
            print(f"{name:16s} M {m} " + " ".join(f"{p}:{v:.1f}" for p, v in us.items()), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
