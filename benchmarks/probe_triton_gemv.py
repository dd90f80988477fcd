"""The Triton GEMV (ops/matmul/kernel.py gemv_kernel) at M = 1 / 2: its plan (BLOCK_N rows per program, SPLIT_K, warps)
against variants, with the compiled kernel's registers and spills and the resident programs per SM they allow, on
weights of the models' shapes. Checks first (error within 2x cuBLAS's on the dequantized weight), then one interleaved
graph timing per (shape, M) with dequantize + cuBLAS. usage: python benchmarks/probe_triton_gemv.py [--json FILE]"""
import json
import sys

import torch
import triton

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.harness import environment, time_graphs
from fastnf4.ops.matmul import dispatch, kernel
from probe_weights import rotated

SHAPES = [(8192, 5120), (8192, 8192), (10240, 5120), (5120, 8192), (4096, 5376), (2048, 5376), (28672, 8192)]
VARIANTS = [(16, 1, 4), (16, 2, 4), (32, 1, 4), (8, 1, 4), (16, 1, 8), (32, 1, 8), (16, 1, 2)]  # (BLOCK_N, split, warps)
props = torch.cuda.get_device_properties(0)


def launch(x, q, block_n, split_k, warps):
    """kernel.launch_gemv with the plan given (NG as gemv_plan's); returns (y, compiled kernel)."""
    n, k = q.shape
    m = x.shape[0]
    ng = kernel.gemv_plan(m, n, k, q.blocksize, props.multi_processor_count)[1]  # (NG does not depend on BLOCK_N)
    y = torch.empty(split_k, m, n, dtype=torch.float32, device="cuda") if split_k > 1 else \
        torch.empty(m, n, dtype=x.dtype, device="cuda")
    ck = kernel.launch_gemv(x, *linear_args(q)[:-1], None, y, block_n, ng, split_k, num_warps=warps)
    return (kernel.add_parts(y, None, x.dtype) if split_k > 1 else y), ck


def resident(ck, warps):
    by_regs = props.regs_per_multiprocessor // max(1, ck.n_regs * 32 * warps)
    by_smem = props.shared_memory_per_multiprocessor // max(1, ck.metadata.shared) if ck.metadata.shared else 99
    return min(by_regs, by_smem, props.max_threads_per_multi_processor // (32 * warps), 32)


torch.manual_seed(0)
rows = []
for n, k in SHAPES:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=64, double_quant=True)
    wts, qs = rotated(w, q)
    wd = fastnf4.dequantize(q)
    plan = {m: kernel.gemv_plan(m, n, k, 64, props.multi_processor_count) for m in (1, 2)}
    for m in (1, 2):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = x.double() @ wd.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        yard = rel(x @ wd.T)
        info = {}
        for v in VARIANTS:
            y, ck = launch(x, q, *v)
            torch.cuda.synchronize()
            err = rel(y) / yard
            assert torch.isfinite(y).all() and err <= 2.0, (n, k, m, v, err)
            info[v] = dict(regs=ck.n_regs, spills=ck.n_spills, resident=resident(ck, v[2]), err=err,
                           programs=triton.cdiv(n, v[0]) * v[1])
        fns = {"dq": [lambda qq=qq: dispatch.linear_triton(x, *linear_args(qq), path="dequant+matmul") for qq in qs]}
        for v in VARIANTS:
            fns[str(v)] = [lambda qq=qq, v=v: launch(x, qq, *v)[0] for qq in qs]
        t = time_graphs(fns, per_graph=20, replays=10)
        for v in VARIANTS:
            info[v]["us"] = t[str(v)]["median_us"]
        rows.append(dict(N=n, K=k, M=m, plan=plan[m][::2], dq_us=t["dq"]["median_us"],
                         variants={str(v): d for v, d in info.items()}))
        print(f"{n}x{k} M{m} plan(bn,split)={plan[m][0]},{plan[m][2]} dq {t['dq']['median_us']:.1f} | " +
              " ".join(f"{v[0]}/{v[1]}/{v[2]}w: {d['us']:.1f}us r{d['regs']} s{d['spills']} x{d['resident']} "
                       f"p{d['programs']}" for v, d in info.items()), flush=True)
    wts = qs = wd = fns = ref = None
    torch.cuda.empty_cache()
if "--json" in sys.argv:
    json.dump({"env": environment(), "rows": rows}, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
