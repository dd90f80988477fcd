"""Prefill-size wgmma kernel (wgmma.cu) on the H200: correctness on odd shapes first (poisoned outputs, error against
a float64 reference on the dequantized weight relative to cuBLAS's on the same weight), then graph timing against
bf16 cuBLAS and fastnf4 dequantize + cuBLAS for every model weight of >= 8 MB packed.
usage: python benchmarks/probe_wgmma.py [JSON] [--quick | --mid | --m512 | --small | --tiny | --ms 64,256]
                                        [--checks] [--verbose]
--ms: those M; since session 26 every M's providers are timed with their replays interleaved (harness.time_graphs);
--kv: the weights under 8 MB (the k+v projections) instead of the others;
--small: M = 8 / 16 / 24 / 32 with the CUDA GEMM kernel of gemv_mma.cu (the path there before) timed too;
--tiny: the same at M = 3 / 4 / 6 / 8 (BM 16 only)."""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import model_shapes, rotation_count, time_graphs
from fastnf4.ops.matmul import gemv_mma, wgmma
from probe_weights import error_ratio

torch.manual_seed(0)
out = {"env": {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FASTNF4_COMMIT", "?"),
               "nvcc_flags": os.environ.get("FASTNF4_NVCC_FLAGS", ""),
               "torch": torch.__version__}, "check": [], "time": []}
worst = 0.0
fails = 0
for dtype in (torch.bfloat16, torch.float16):
    for (m, n, k, bs, nested, bias, bm, splits) in [
        (33, 128, 64, 64, True, False, None, None), (64, 200, 192, 64, False, True, None, None),
        (100, 4096, 4096, 64, True, True, None, None), (128, 1000, 5376, 128, True, False, None, None),
        (257, 640, 1024, 256, False, False, None, None), (512, 384, 8192, 4096, True, True, None, None),
        (129, 4096, 2048, 64, True, False, 256, None), (300, 1024, 4096, 64, True, True, 128, 4),
        (40, 8192, 1024, 64, False, False, 64, 3), (2048, 256, 512, 1024, True, False, None, None),
        (5, 300, 576, 64, True, True, None, None), (16, 4096, 2048, 128, False, False, None, 3),
        (17, 1000, 5376, 64, True, True, None, None), (32, 8192, 1024, 256, True, False, 32, 2),
        (24, 128, 64, 64, False, True, 16, None),
    ]:
        ratio, finite = error_ratio(lambda x, q, b, y, bm=bm, splits=splits:
                                    wgmma.launch(x, *linear_args(q, b), y=y, bm=bm, splits=splits),
                                    m, n, k, bs, nested, bias, dtype)
        ok = finite and ratio <= 2.0
        fails += not ok
        worst = max(worst, ratio)
        out["check"].append(dict(dtype=str(dtype), M=m, N=n, K=k, blocksize=bs, nested=nested, bias=bias, bm=bm,
                                 splits=splits, err_ratio=ratio, ok=ok))
        if not ok or "--verbose" in sys.argv:
            print(f"check {str(dtype)[6:]:8} M{m:5d} N{n:5d} K{k:5d} bs{bs:5d} nested {int(nested)} bias {int(bias)} "
                  f"bm {bm} splits {splits}: err x{ratio:.3f} {'ok' if ok else 'FAIL'}", flush=True)
print(f"checks: {fails} failed, worst error ratio {worst:.3f}", flush=True)
if fails:
    sys.exit(1)
if "--checks" in sys.argv:
    sys.exit(0)

quick = "--quick" in sys.argv
seen = set()
ms = (tuple(int(v) for v in sys.argv[sys.argv.index("--ms") + 1].split(",")) if "--ms" in sys.argv
      else (128, 256) if "--mid" in sys.argv else (512,) if "--m512" in sys.argv else (64, 128, 512, 2048) if quick
      else (8, 16, 24, 32) if "--small" in sys.argv else (3, 4, 6, 8) if "--tiny" in sys.argv
      else (64, 128, 256, 512, 2048))
for model, layer, n, k in model_shapes():
    if (n, k) in seen or (n * k // 2 < 8e6) != ("--kv" in sys.argv):
        continue
    seen.add((n, k))
    if quick and model != "llama-3.3-70b" and layer not in ("o", "gate_up"):
        continue
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    reps_q = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps_q - 1)]
    reps_w = rotation_count(n * k * 2)
    ws = [w] + [w.clone() for _ in range(reps_w - 1)]
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        row = dict(model=model, layer=layer, N=n, K=k, M=m)
        prov = {"cublas_us": [lambda i=i: x @ ws[i].T for i in range(reps_w)],
                "dq_cublas_us": [lambda i=i: x @ fastnf4.dequantize(qs[i]).T for i in range(reps_q)]}
        if m <= 32:
            prov["mma_us"] = [lambda i=i: gemv_mma.launch(x, *linear_args(qs[i])) for i in range(reps_q)]
        for bm in ((16,) if "--tiny" in sys.argv else (16, 32) if m <= 16 else (32, 64) if m <= 32 else (64, 128) if m <= 64 else (64, 128, 256) if m <= 256 else (256,) if m == 512 else (128, 256)):
            prov[f"wg{bm}_us"] = [lambda i=i, bm=bm: wgmma.launch(x, *linear_args(qs[i]), bm=bm) for i in range(reps_q)]
        per = 20 if m <= 512 else 5
        row.update({name: t["median_us"] for name, t in time_graphs(prov, per_graph=per, replays=10).items()})
        best = min(v for kk, v in row.items() if kk.startswith("wg"))
        row["vs_cublas"] = row["cublas_us"] / best
        if "mma_us" in row:
            row["wg_vs_mma"] = row["mma_us"] / best
        out["time"].append(row)
        print(f"{model[:6]:6} {layer[:8]:8} {n:6d}x{k:<6d} M{m:5d} cuBLAS {row['cublas_us']:8.1f} dq+cuBLAS "
              f"{row['dq_cublas_us']:8.1f} " + " ".join(f"{kk[:-3]} {v:8.1f}" for kk, v in row.items()
                                                       if kk.endswith("_us") and kk[:2] in ("wg", "mm"))
              + f"  x{row['vs_cublas']:.2f}" + (f" vs mma x{row['wg_vs_mma']:.2f}" if "wg_vs_mma" in row else ""),
              flush=True)
if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
    json.dump(out, open(sys.argv[1], "w"), indent=1)
