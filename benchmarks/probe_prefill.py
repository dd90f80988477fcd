"""Where prefill (TTFT) time goes at batch 1: per-linear host cost and GPU time at M = 160 / 1280 on a Qwen3-32B
gate_up-like weight (10240... here 5120 -> 25600) for fastnf4, bitsandbytes and bf16, then a cProfile of one
fastnf4 prefill of MODEL cut to LAYERS. usage: python benchmarks/probe_prefill.py MODEL LAYERS"""
import cProfile
import pstats
import statistics
import sys
import time

import torch

import fastnf4
from fastnf4.bench import e2e
from fastnf4.bench.harness import host_us_per_call
from fastnf4.study.e2e import bnb_linear


def gpu(fn, n=30):
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


torch.manual_seed(0)
with torch.inference_mode():
    for n, k in ((25600, 5120), (5120, 5120)):
        lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        f4 = fastnf4.Linear4bit(fastnf4.quantize(lin.weight.data))
        b4 = bnb_linear(lin)
        for m in (160, 1280):
            x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
            for name, mod in (("fastnf4", f4), ("bnb", b4), ("bf16", lin)):
                h, w = host_us_per_call(lambda: mod(x), 300, 20)
                print(f"{n}x{k} M={m:5d} {name:8s} host {h:7.1f} us/call  wall {w:7.1f}  gpu {gpu(lambda: mod(x)):7.1f} us",
                      flush=True)
        del lin, f4, b4
    name, layers = sys.argv[1], int(sys.argv[2])
    model = e2e._make(name, layers, "fastnf4")
    ids = torch.randint(0, model.config.vocab_size, (1, 160), device="cuda")
    pre = torch.arange(160, device="cuda")
    for i in range(3):
        cache = e2e._cache(model, 1, 200)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        if i == 2:
            pr.enable()
        model(input_ids=ids, past_key_values=cache, cache_position=pre, use_cache=True)
        pr.disable()
        torch.cuda.synchronize()
        print(f"prefill {i}: {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
