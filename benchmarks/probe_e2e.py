"""Where a graph-captured decode step spends GPU time: top kernels per variant (bf16 / fastnf4 / bnb) for a
cut of a model. usage: python benchmarks/probe_e2e.py MODEL LAYERS BATCH [OUT.json]"""
import json
import sys

import torch

from fastnf4.bench import e2e
from fastnf4.bench.harness import bnb_version

name, layers, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for variant in ["bf16", "fastnf4"] + (["bnb"] if bnb_version() else []):
    model = e2e._make(name, layers, variant)
    r = e2e.decode_speed(model, batch, 160, 16, graph=True, top=14)
    rows.append(dict(variant=variant, **r))
    print(f"== {variant}: step {r['step_us']:.0f} us, kernels {r['gpu_us_per_step']:.0f} us/step, "
          f"4-bit share {r['share_4bit']:.2f}")
    for k, c, t in r["top_kernels"]:
        print(f"   {t:8.1f} us  x{c:5.1f}  {k}")
    del model
    torch.cuda.empty_cache()
if len(sys.argv) > 4:
    json.dump(rows, open(sys.argv[4], "w"), indent=1)
