"""Host cost of one training call (forward + backward to x) of a 4-bit linear, on a weight small enough that the
GPU keeps up (1024 x 1024, M = 64 rows of x, bf16): fastnf4.linear (custom op + autograd), a bitsandbytes Linear4bit
unpatched and patched, and a dense torch.nn.functional.linear for scale. Wall microseconds per call before the
final synchronisation (harness.host_us_per_call), best of three. usage: probe_train_host.py [JSON]"""
import json
import sys

import torch

import fastnf4
from fastnf4.bench.harness import environment, host_us_per_call
from fastnf4.study.e2e import bnb_linear

torch.manual_seed(0)
dense = torch.nn.Linear(1024, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
q = fastnf4.quantize(dense.weight.detach())
b4 = bnb_linear(dense)
x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)


def step(f):
    def run():
        f(x).backward(g)
        x.grad = None
    return run


cases = {
    "dense F.linear": (step(lambda t: torch.nn.functional.linear(t, dense.weight.detach())), False),
    "fastnf4.linear": (step(lambda t: fastnf4.linear(t, q)), False),
    "bitsandbytes Linear4bit": (step(b4), False),
    "bitsandbytes Linear4bit, patched": (step(b4), True),
}
res = {"env": environment(), "us_per_call": {}}
for name, (fn, patched) in cases.items():
    (fastnf4.patch_bitsandbytes if patched else fastnf4.unpatch_bitsandbytes)()
    t = min(host_us_per_call(fn, n=500)[0] for _ in range(3))
    res["us_per_call"][name] = t
    print(f"{name:34s} {t:7.1f} us host per forward + backward", flush=True)
fastnf4.unpatch_bitsandbytes()
if len(sys.argv) > 1:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
