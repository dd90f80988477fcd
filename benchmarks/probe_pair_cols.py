"""The decode kernel with pair columns (gemv_mma.cu kPair, variants 7 / 8: one column group holds four x rows where a
64-code chunk pair lies in one quantization block), checked first (odd shapes, both dtypes, double quant on / off, bias,
blocksizes 64-4096, forced global and block-local split-K, clusters; poisoned outputs; error against a float64 product
with the dequantized weight within 2x cuBLAS's on that weight), then timed in one interleaved graph timing per
(weight, M) with bf16 cuBLAS and the production dispatch:
- default: every model weight at M = 3 / 4 (``--ms``), the pair kernels of 16 / 20 warps with their own plans and with
  the global settle (``g``), and the wgmma kernel (the path there before session 27);
- ``--parts``: five weights at M = 1-4, the pair kernels with their plans and unsplit (``s1``), against the production
  decode kernels at M <= 2 (where the pair kernel's time goes).
usage: python benchmarks/probe_pair_cols.py [--ms 3,4 | --parts] [JSON]"""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import model_shapes
from fastnf4.ops.matmul import gemv_mma, wgmma
from probe_weights import check_and_time, error_ratio, production, rotated, write_rows

PARTS = "--parts" in sys.argv
MS = ([1, 2, 3, 4] if PARTS else
      [int(v) for v in sys.argv[sys.argv.index("--ms") + 1].split(",")] if "--ms" in sys.argv else [3, 4])
PART_WEIGHTS = [("llama gate_up", 57344, 8192), ("llama q+o", 8192, 8192), ("qwen down", 5120, 25600),
                ("gemma gate+up", 21504, 5376), ("qwen gate+up", 25600, 5120)]


def checks() -> int:
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
            ratio, finite = error_ratio(
                lambda x, q, b, y, v=v, splits=splits, local=local, lc=lc:
                gemv_mma.launch(x, *linear_args(q, b), y=y, kernel=v, splits=splits, local=local, local_cluster=lc),
                m, n, k, bs, nested, bias, dtype)
            ok = finite and ratio <= 2.0
            fails += not ok
            worst = max(worst, ratio)
            print(f"check {str(dtype)[6:]:8} M{m} N{n:5d} K{k:5d} bs{bs:5d} nested {int(nested)} bias {int(bias)} "
                  f"v{v} splits {splits} local {local} lc {lc}: err x{ratio:.3f} {'ok' if ok else 'FAIL'}", flush=True)
    print(f"checks: {fails} failed, worst error ratio {worst:.3f}", flush=True)
    return fails


def weights():
    """(name, n, k): the five of ``--parts``, else each distinct model weight."""
    if PARTS:
        yield from PART_WEIGHTS
        return
    seen = set()
    for model, layer, n, k in model_shapes():
        if (n, k) not in seen:
            seen.add((n, k))
            yield f"{model[:6]} {layer}", n, k


def variants(x, q, n, k):
    """name -> run(x, q, y=None) of the pair kernels (and, by default, the wgmma kernel)."""
    runs = {}
    for v in (gemv_mma.PAIR, gemv_mma.PAIR_WIDE):
        tag = f"pair{16 if v == gemv_mma.PAIR else 20}"
        runs[tag] = lambda x, q, y=None, v=v: gemv_mma.launch(x, *linear_args(q), y=y, kernel=v)
        if PARTS:
            runs[tag + " s1"] = (lambda x, q, y=None, v=v:
                                 gemv_mma.launch(x, *linear_args(q), y=y, kernel=v, splits=(1, k // 128)))
        else:
            runs[tag + "g"] = lambda x, q, y=None, v=v: gemv_mma.launch(x, *linear_args(q), y=y, kernel=v, local=False)
    if not PARTS and wgmma.supports(x, q.packed_u8, 64, n, k, True):
        runs["wgmma"] = lambda x, q, y=None: wgmma.launch(x, *linear_args(q), y=y)
    return runs


def main():
    if checks():
        sys.exit(1)
    rows = []
    torch.manual_seed(0)
    for name, n, k in weights():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w, blocksize=64, double_quant=True)
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        for m in MS:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            us, errs = check_and_time(x, wd, ws, qs, {"fastnf4": production, **variants(x, q, n, k)}, name)
            rows.append(dict(name=name, N=n, K=k, M=m, us=us, err=errs))
            print(f"{name:16s} M {m} " + " ".join(f"{p}:{v:.1f}" for p, v in us.items()), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
