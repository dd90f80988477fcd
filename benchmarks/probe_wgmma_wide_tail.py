"""Split plans for the weights with more row tiles than the 264 two-block slots (the gate_up projections: Llama 448
tiles, Qwen 400, Gemma 336) at M = 8 / 16 / 32 (before session 18 wgmma.plan ran every tile whole there: two waves,
the second part full): the first ``full`` tiles whole and the rest in ``s`` parts over K, against the production
plan ("prod"), the tail
model's pick (wgmma._cost with 264 slots) and bf16 cuBLAS. Each variant first checked on fresh data with a poisoned
output (error within 2x cuBLAS's), then interleaved graph timing (harness.time_graphs).
usage: python benchmarks/probe_wgmma_wide_tail.py [JSON]"""

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import wgmma
from probe_weights import check_and_time, rotated, write_rows

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
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        tiles, steps = -(-n // 128), k // 64
        for m in (8, 16, 32):
            fm, sm = model_best(tiles, steps, m)
            plans = {"prod": {}}
            for full in sorted({SLOTS, fm, tiles - SLOTS // 2}):
                for s in (2, 3, 4, 5, 6):
                    plans[f"f{full} s{s}"] = dict(splits=s, full_tiles=full)
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            runs = {p: (lambda x, q, y=None, kw=kw: wgmma.launch(x, *linear_args(q), y=y, **kw))
                    for p, kw in plans.items()}
            us, errs = check_and_time(x, wd, ws, qs, runs, name)
            best = min((p for p in us if p != "cublas"), key=us.get)
            rows.append(dict(name=name, N=n, K=k, M=m, us=us, err=errs, model=f"f{fm} s{sm}", best=best))
            print(f"{name:14s} M {m:2d} cuBLAS {us['cublas']:6.1f} prod {us['prod']:6.1f} best {best} {us[best]:6.1f} "
                  f"(x{us['prod'] / us[best]:.3f}) model f{fm} s{sm}: {us.get(f'f{fm} s{sm}', float('nan')):.1f} | "
                  + " ".join(f"{p}:{v:.1f}" for p, v in sorted(us.items(), key=lambda kv: kv[1])[:5]), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
