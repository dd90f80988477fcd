"""Small-weight decode kernel (gemv_mma.cu ``gemv_small``) against the tensor-core decode kernel and bitsandbytes,
M = 1 and 2, every model shape it can take (M * K * 2 <= 32 KiB), graph timing; correctness first (error against
a float64 reference on the dequantized weight, relative to cuBLAS's on the same weight).
usage: python benchmarks/probe_small_kernel.py [JSON]"""
import json
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import bnb_functional, clone_weight
from fastnf4.bench.harness import model_shapes, rotation_count, time_graph
from fastnf4.ops.matmul import gemv_mma

F = bnb_functional()
rows, seen = [], set()
for model, layer, n, k in model_shapes():
    if (n, k) in seen:
        continue
    seen.add((n, k))
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    if F is not None:
        packed, st = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        q = fastnf4.NF4Weight.from_bnb(packed, st)
    else:
        q = fastnf4.quantize(w)
    wd = fastnf4.dequantize(q)
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(c) for c in [q] * (reps - 1)]
    for m in (1, 2):
        if not gemv_mma.small_fits(m, k, 2):
            continue
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.double() @ wd.double().T
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemv_mma.launch(x, *linear_args(q), y=y, kernel=gemv_mma.SMALL)
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        row = dict(model=model, layer=layer, N=n, K=k, M=m, mb=q.nbytes() / 1e6,
                   err_ratio=rel(y) / rel(x @ wd.T))
        row["small_us"] = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), kernel=gemv_mma.SMALL)
                                      for i in range(reps)])["median_us"]
        row["mma_us"] = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), kernel=0)
                                    for i in range(reps)])["median_us"]
        if F is not None:
            import bitsandbytes

            bq = [(c.packed, c.to_bnb()[1]) for c in qs]
            row["bnb_us"] = time_graph([lambda i=i: bitsandbytes.matmul_4bit(x, bq[i][0].t(), quant_state=bq[i][1])
                                        for i in range(reps)])["median_us"]
        rows.append(row)
        print(f"{model[:6]:6} {layer[:8]:8} {n:6d}x{k:<6d} M{m} {row['mb']:6.1f} MB err x{row['err_ratio']:.2f} "
              f"small {row['small_us']:6.1f} mma {row['mma_us']:6.1f} bnb {row.get('bnb_us', 0):6.1f} us", flush=True)
if len(sys.argv) > 1:
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
