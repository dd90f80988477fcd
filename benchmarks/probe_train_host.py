"""Host cost of one training call (forward + backward to x) of a 4-bit linear, on a weight small enough that the
GPU keeps up (1024 x 1024, M = 64 rows of x, bf16): fastnf4.linear (custom op + autograd), a bitsandbytes Linear4bit
unpatched and patched, and a dense torch.nn.functional.linear for scale; FASTNF4_PROBE_PARTS=1 adds parts
(no-grad linear, dequantize through the op and without it, the matmul). Wall microseconds per call before the
final synchronisation (harness.host_us_per_call), best of three. usage: probe_train_host.py [JSON]"""
import json
import os
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
out = torch.empty(1024 * 1024, device="cuda", dtype=torch.bfloat16)
xs = x.detach()


def no_grad(f):
    def run():
        with torch.no_grad():
            f()
    return run


from fastnf4 import _ops  # noqa: E402
from fastnf4.codebooks import kernel_code  # noqa: E402

dq_args = (q.packed_u8, q.absmax, kernel_code("nf4", q.device), 64, q.numel, q.nested_code,
           q.nested_absmax, q.offset, q.nested_blocksize)
cases.update({  # the parts (FASTNF4_PROBE_PARTS=1)
    "fastnf4.linear, no grad": (no_grad(lambda: fastnf4.linear(xs, q)), False),
    "fastnf4.dequantize": (lambda: fastnf4.dequantize(q), False),
    "_ops._dequantize_into": (lambda: _ops._dequantize_into(out, *dq_args), False),
    "torch.matmul 64 x 1024 x 1024": (lambda: torch.matmul(xs, dense.weight.detach().T), False),
} if os.environ.get("FASTNF4_PROBE_PARTS") == "1" else {})
res = {"env": environment(), "us_per_call": {}}
for name, (fn, patched) in cases.items():
    (fastnf4.patch_bitsandbytes if patched else fastnf4.unpatch_bitsandbytes)()
    t = min(host_us_per_call(fn, n=500)[0] for _ in range(3))
    res["us_per_call"][name] = t
    print(f"{name:34s} {t:7.1f} us host per call", flush=True)
fastnf4.unpatch_bitsandbytes()
if len(sys.argv) > 1:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
