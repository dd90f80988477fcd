"""Sweep GEMV (M<=4) and GEMM (M>4) configurations on a few shapes; prints % of the NF4 byte floor and time
against bf16 cuBLAS. usage: python tools/tune_matmul.py [OUT.json]"""
import itertools
import json
import sys

import torch

import fastnf4
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import copy_bandwidth, rotation_count, time_graph
from fastnf4.codebooks import kernel_code
from fastnf4.ops.matmul import kernel

SHAPES = [(57344, 8192), (8192, 8192), (1024, 8192)]


def main(out=None):
    copy = copy_bandwidth()["GBps"]
    print(f"copy {copy:.0f} GB/s", flush=True)
    res = []
    for n, k in SHAPES:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w, double_quant=True)
        reps = rotation_count(q.nbytes())
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        code = kernel_code("nf4", q.device)
        wd = fastnf4.dequantize(q)
        for m in (1, 4, 16, 128):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ref = (x.double() @ wd.double().T)
            floor = (q.nbytes() + 2 * m * (n + k)) / copy / 1e3
            t_cublas = time_graph([lambda: x @ w.T])["median_us"]
            line = []

            def args(i):
                c = qs[i]
                return (c.packed_u8, c.absmax, code, c.blocksize, n, k, c.nested_code, c.nested_absmax, c.offset, 256, None)

            if m <= 4:
                cfgs = [(bn, bw, sk, wp) for bn, bw, sk, wp in itertools.product((8, 16, 32), (16, 32, 64), (1, 4), (4,))
                        if not (sk > 1 and n >= 8192) and bn * bw <= 1024]
                for bn, ng, sk, wp in cfgs:
                    def call(i, bn=bn, ng=ng, sk=sk, wp=wp):
                        y = torch.empty(sk, m, n, dtype=torch.float32, device="cuda") if sk > 1 else torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                        kernel.launch_gemv(x, *args(i), y, bn, ng, sk, num_warps=wp)
                        return kernel.add_parts(y, None, torch.bfloat16) if sk > 1 else y
                    y = call(0)
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    t = time_graph([lambda i=i: call(i) for i in range(reps)])["median_us"]
                    res.append(dict(N=n, K=k, M=m, kind="gemv", cfg=[bn, ng, sk, wp], us=t, floor_us=floor, cublas_us=t_cublas, err=err))
                    line.append((t, f"bn{bn} ng{ng} sk{sk} w{wp}"))
            else:
                if m <= 16:
                    cfgs = [(16, bn, bk, 4, st, sk) for bn in (64, 128) for bk in (64, 128) for st in (1, 3) for sk in (1, 4)]
                else:
                    cfgs = [(bm, bn, 64, wp, st, 1) for bm in (64, 128) for bn in (64, 128) for wp in (4, 8) for st in (1, 3)]
                for bm, bn, bk, wp, st, sk in cfgs:
                    def call(i, c=(bm, bn, bk, wp, st), sk=sk):
                        y = torch.empty(sk, m, n, dtype=torch.float32, device="cuda") if sk > 1 else torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                        kernel.launch_gemm(x, *args(i), y, c, sk)
                        return kernel.add_parts(y, None, torch.bfloat16) if sk > 1 else y
                    try:
                        y = call(0)
                    except Exception as e:  # noqa: BLE001 - out of shared memory etc.: skip the config
                        print("skip", (bm, bn, bk, wp, st, sk), type(e).__name__)
                        continue
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    t = time_graph([lambda i=i: call(i) for i in range(reps)], replays=8)["median_us"]
                    res.append(dict(N=n, K=k, M=m, kind="gemm", cfg=[bm, bn, bk, wp, st, sk], us=t, floor_us=floor, cublas_us=t_cublas, err=err))
                    line.append((t, f"{bm}x{bn}x{bk} w{wp} s{st} sk{sk}"))
            line.sort()
            best = line[0]
            print(f"{n}x{k} M={m}: floor {floor:.1f} cublas {t_cublas:.1f} | best {best[0]:.1f} us ({100 * floor / best[0]:.0f}% floor) {best[1]} | next: "
                  + "; ".join(f"{t:.1f} {c}" for t, c in line[1:4]), flush=True)
        del qs
        torch.cuda.empty_cache()
    if out:
        json.dump({"copy_GBps": copy, "rows": res}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
