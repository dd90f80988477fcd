"""``fastnf4.linear`` on random shapes (fixed seeds): the dispatcher's every path meets whatever the shape throws at
it, not only the shapes the kernel tests were written for.

Each case draws N, K (any, also odd and prime), M (1 to ~700, also as a 3-D x), blocksize (32 to 4096), double quant,
dtype (bf16 / fp16, sometimes fp32), a bias or none, x contiguous or a strided view, and checks:
- the output is finite, of the right shape and dtype, and within the issue's error budget: a relative Frobenius error
  against a float64 product with the dequantized weight of at most 2x that of cuBLAS on the same weight (plus a
  floor of 2^-12 for products near exact cancellation);
- the eager fast path (cached launches) and the registered op's full path give the same bits, twice (the cache
  entry reused, x fresh).
"""
import random

import pytest
import torch

import fastnf4
from fastnf4.api import linear_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCKSIZES = [32, 64, 64, 64, 128, 256, 1024, 4096]


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _case(rng: random.Random):
    k = rng.choice([rng.randrange(1, 129), rng.randrange(64, 6000), 64 * rng.randrange(1, 90),
                    128 * rng.randrange(1, 40)])
    n = rng.choice([rng.randrange(1, 40), rng.randrange(40, 3000), 16 * rng.randrange(1, 200)])
    n = max(1, min(n, (6 << 20) // k))  # (at most ~6M weight elements per case)
    m = rng.choice([1, 1, 2, 3, 4, rng.randrange(5, 33), rng.randrange(33, 300), rng.randrange(300, 700)])
    dtype = rng.choice([torch.bfloat16, torch.bfloat16, torch.float16, torch.float32] if m <= 64 else
                       [torch.bfloat16, torch.float16])
    return n, k, m, rng.choice(BLOCKSIZES), rng.random() < 0.6, dtype, rng.random() < 0.5, rng.random() < 0.2


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes(seed):
    rng = random.Random(1000 + seed)
    torch.manual_seed(seed)
    for _ in range(25):
        n, k, m, blocksize, nested, dtype, bias_on, strided = _case(rng)
        what = (n, k, m, blocksize, nested, dtype, bias_on, strided)
        q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                             double_quant=nested)
        wd = fastnf4.dequantize(q, dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if bias_on else None
        if strided:  # every other row of a larger buffer (not contiguous)
            x = torch.randn(2 * m, k, device="cuda", dtype=dtype)[::2]
        elif m % 3 == 0:
            x = torch.randn(3, m // 3, k, device="cuda", dtype=dtype)
        else:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
        x2 = x.reshape(m, k)
        ref = x2.double() @ wd.double().T + (bias.double() if bias is not None else 0)
        yardstick = _rel(torch.nn.functional.linear(x2, wd, bias), ref)
        y = fastnf4.linear(x, q, bias)
        assert y.shape == (*x.shape[:-1], n) and y.dtype == dtype, what
        y2 = y.reshape(m, n)
        assert torch.isfinite(y2).all(), what
        assert _rel(y2, ref) <= 2 * yardstick + 2.0 ** -12, (what, _rel(y2, ref), yardstick)
        full = torch.ops.fastnf4.linear(x2.contiguous(), *linear_args(q, bias))
        assert torch.equal(y2, full), what
        x.copy_(torch.randn_like(x))  # the cached launch again, on fresh x
        x2 = x.reshape(m, k)
        assert torch.equal(fastnf4.linear(x, q, bias).reshape(m, n),
                           torch.ops.fastnf4.linear(x2.contiguous(), *linear_args(q, bias))), what
