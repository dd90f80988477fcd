"""Host cost of one decode-size fastnf4.linear call (eager): wall time per call without synchronising, for
fastnf4.linear, the decode kernel's launcher alone and bf16 F.linear; then a cProfile of fastnf4.linear."""
import cProfile
import pstats

import torch

import fastnf4
from fastnf4.bench.harness import host_us_per_call
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma

w = torch.randn(5120, 5120, device="cuda", dtype=torch.bfloat16) * 0.02
q = fastnf4.quantize(w)
x = torch.randn(1, 5120, device="cuda", dtype=torch.bfloat16)
a = linear_args(q, None)


with torch.inference_mode():
    for name, fn in [("fastnf4.linear", lambda: fastnf4.linear(x, q)), ("gemv_mma.launch", lambda: gemv_mma.launch(x, *a)),
                     ("torch.ops.fastnf4.linear", lambda: torch.ops.fastnf4.linear(x, *a)),
                     ("F.linear bf16", lambda: torch.nn.functional.linear(x, w))]:
        host, total = host_us_per_call(fn)
        print(f"{name:26s} host {host:7.1f} us/call, with GPU {total:7.1f} us/call", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        fastnf4.linear(x, q)
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
