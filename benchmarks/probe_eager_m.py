"""Host cost of eager fastnf4 Linear4bit calls per weight and M (decode batch sizes): wall microseconds per call
without synchronising (host) and with (host + GPU), for every linear shape of the named models; the path the
dispatcher takes is printed beside. Looks for calls whose host cost exceeds their GPU time in eager decoding.
usage: python benchmarks/probe_eager_m.py MODEL [MODEL ...]"""
import sys

import torch

import fastnf4
from fastnf4.bench.harness import host_us_per_call, model_shapes
from fastnf4.ops.matmul import dispatch

torch.manual_seed(0)
with torch.inference_mode():
    for model, layer, n, k in model_shapes():
        if model not in sys.argv[1:]:
            continue
        f4 = fastnf4.Linear4bit(fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02))
        line = f"{model[:6]} {layer:8s} {n:6d}x{k:6d}"
        for m in (1, 8, 32):
            x = torch.randn(m, 1, k, device="cuda", dtype=torch.bfloat16)
            q = f4.weight_nf4
            path = dispatch.pick_path(x.view(m, k), q.packed_u8, q.blocksize, n, k, q.nested_code is not None,
                                      q.nested_blocksize)
            host, total = host_us_per_call(lambda: f4(x), n=300, warmup=20)
            line += f" | M{m} {path[:6]:6s} host {host:6.1f} all {total:6.1f}"
        print(line, flush=True)
        del f4
