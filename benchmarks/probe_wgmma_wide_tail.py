"""Split plans for the weights with more row tiles than the 264 two-block slots (the gate_up projections: Llama 448
tiles, Qwen 400, Gemma 336) at M = 8 / 16 / 32, where wgmma.plan runs every tile whole (two waves, the second part
full): the first ``full`` tiles whole and the rest in ``s`` parts over K, against the production plan, the tail
model's pick (wgmma._cost with 264 slots) and bf16 cuBLAS. Each variant first checked on fresh data with a poisoned
output (error within 2x cuBLAS's), then interleaved graph timing (harness.time_graphs).
usage: python benchmarks/probe_wgmma_wide_tail.py [JSON]"""
import json
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, rotation_count, time_graphs
from fastnf4.ops.matmul import wgmma

WEIGHTS = (("llama gate_up", 57344, 8192), ("qwen gate_up", 51200, 5120), ("gemma gate_up", 43008, 5376))
SLOTS = 264


def model_best(tiles, steps, m):
    best = None
    for full in range(tiles):
        for want in range(2, 9):
            s, per = wgmma._split_steps(steps, want)
            if s < 2:
                continue
            c = wgmma._cost(1, tiles, full, s, per, steps, SLOTS, m)
            if best is None or c < best[0]:
                best = (c, full, s)
    return best[1], best[2]


def main():
    rows = []
    torch.manual_seed(0)
    for name, n, k in WEIGHTS:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w, blocksize=64, double_quant=True)
        qs = [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)]
        ws = [w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)]
        wd = fastnf4.dequantize(q)
        tiles, steps = -(-n // 128), k // 64
        for m in (8, 16, 32):
            fm, sm = model_best(tiles, steps, m)
            plans = {"prod": {}}
            for full in sorted({SLOTS, fm, tiles - SLOTS // 2}):
                for s in (2, 3, 4, 5, 6):
                    plans[f"f{full} s{s}"] = dict(splits=s, full_tiles=full)
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ref = x.double() @ wd.double().T
            rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
            base = rel(x @ wd.T)
            prov = {"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))]}
            errs = {}
            for pname, kw in plans.items():
                y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                wgmma.launch(x, *linear_args(q), y=y, **kw)
                errs[pname] = rel(y) / base
                assert torch.isfinite(y).all() and errs[pname] <= 2.0, (name, m, pname, errs[pname])
                prov[pname] = [lambda i=i, kw=kw: wgmma.launch(x, *linear_args(qs[i]), **kw) for i in range(len(qs))]
            t = time_graphs(prov, per_graph=20, replays=10)
            us = {p: r["median_us"] for p, r in t.items()}
            best = min((p for p in us if p != "cublas"), key=us.get)
            rows.append(dict(name=name, N=n, K=k, M=m, us=us, err=errs, model=f"f{fm} s{sm}", best=best))
            print(f"{name:14s} M {m:2d} cuBLAS {us['cublas']:6.1f} prod {us['prod']:6.1f} best {best} {us[best]:6.1f} "
                  f"(x{us['prod'] / us[best]:.3f}) model f{fm} s{sm}: {us.get(f'f{fm} s{sm}', float('nan')):.1f} | "
                  + " ".join(f"{p}:{v:.1f}" for p, v in sorted(us.items(), key=lambda kv: kv[1])[:5]), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    out = [a for a in sys.argv[1:] if a.endswith(".json")]
    if out:
        json.dump({"env": environment(), "rows": rows}, open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
