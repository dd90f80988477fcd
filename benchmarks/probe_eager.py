"""Does a torch.profiler run change later eager decode speed? Eager step of a cut model (fastnf4 and bf16) timed
before and after one profiled replay. usage: python benchmarks/probe_eager.py MODEL LAYERS"""
import sys
import time

import torch

from fastnf4.bench import e2e

name, layers = sys.argv[1], int(sys.argv[2])
for variant in ("fastnf4", "bf16"):
    model = e2e._make(name, layers, variant)
    for label in ("before", "profiled", "after"):
        t0 = time.perf_counter()
        r = e2e.decode_speed(model, 1, 160, 16, graph=False, top=-1) if label != "profiled" else None
        if label == "profiled":
            e2e._profile(lambda: torch.cuda.synchronize(), 1, 0)
            continue
        print(f"{variant:8s} {label:7s} eager step {r['step_us']:9.0f} us (wall {time.perf_counter() - t0:.1f} s)", flush=True)
    del model
    torch.cuda.empty_cache()
