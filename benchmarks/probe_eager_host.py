"""Host cost of eager decode linears, and eager decode steps of cut models in alternating rounds.

1. Wall time per call without synchronising (the host cost, since the GPU keeps up) at M = 1 on a
   5120x5120 weight: fastnf4 Linear4bit (the cached launch of ops/matmul/eager.py), the full op path,
   bitsandbytes Linear4bit, bf16 nn.Linear; then a cProfile of the fastnf4 layer.
2. Eager decode steps (batch 1) and TTFT of MODEL cut to LAYERS for fastnf4, bitsandbytes and bf16, built once
   each and timed in ROUNDS alternating rounds, so that drift of the host shows up as spread, not as a ratio.
usage: python benchmarks/probe_eager_host.py MODEL LAYERS ROUNDS [JSON]"""
import cProfile
import json
import pstats
import sys

import torch

import fastnf4
from fastnf4 import _ops
from fastnf4.api import linear_args
from fastnf4.bench import e2e
from fastnf4.bench.harness import host_us_per_call


def host_costs() -> dict:
    from fastnf4.study.e2e import bnb_linear

    torch.manual_seed(0)
    w = torch.randn(5120, 5120, device="cuda", dtype=torch.bfloat16) * 0.02
    lin = torch.nn.Linear(5120, 5120, bias=False, device="cuda", dtype=torch.bfloat16)
    lin.weight.data.copy_(w)
    f4 = fastnf4.Linear4bit(fastnf4.quantize(w))
    b4 = bnb_linear(lin)
    x = torch.randn(1, 1, 5120, device="cuda", dtype=torch.bfloat16)
    args = linear_args(f4.weight_nf4)
    out = {}
    with torch.inference_mode():
        y_fast, y_full = f4(x), _ops.linear(x, *args)
        torch.cuda.synchronize()
        assert torch.equal(y_fast, y_full), "fast path differs from the full path"
        for name, fn in [("fastnf4 Linear4bit (cached launch)", lambda: f4(x)),
                         ("fastnf4 full op path", lambda: _ops.linear(x, *args)),
                         ("bitsandbytes Linear4bit", lambda: b4(x)),
                         ("bf16 nn.Linear", lambda: lin(x))]:
            out[name] = host_us_per_call(fn, 3000, 100)[0]
            print(f"{name:36s} host {out[name]:6.1f} us/call", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            f4(x)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
    return out


def rounds(name: str, layers: int, n: int) -> list:
    models = {v: e2e._make(name, layers, v) for v in ("fastnf4", "bnb", "bf16")}
    rows = []
    for r in range(n):
        for v, model in models.items():
            d = e2e.decode_speed(model, 1, 160, 24, graph=False, top=-1)
            rows.append(dict(round=r, variant=v, step_us=d["step_us"], ttft_us=d["ttft_us"]))
            print(f"round {r} {v:8s} eager step {d['step_us']:8.0f} us  ttft {d['ttft_us']:8.0f} us", flush=True)
    return rows


if __name__ == "__main__":
    name, layers, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    res = {"host_us_per_call": host_costs(), "rounds": rounds(name, layers, n), "model": name, "layers": layers}
    if len(sys.argv) > 4:
        json.dump(res, open(sys.argv[4], "w"), indent=1)
