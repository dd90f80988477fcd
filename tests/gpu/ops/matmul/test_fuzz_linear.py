"""``fastnf4.linear`` on random shapes (fixed seeds): the dispatcher's every path meets whatever the shape throws at
it, not only the shapes the kernel tests were written for.

Each case draws N, K (any, also odd and prime), M (1 to ~700, also as a 3-D x), blocksize (32 to 4096), double quant,
dtype (bf16 / fp16, sometimes fp32), a bias or none, x contiguous or a strided view, and checks:
- the output is finite, of the right shape and dtype, and within the issue's error budget: a relative Frobenius error
  against a float64 product with the dequantized weight of at most 2x that of cuBLAS on the same weight (plus a
  floor of 2^-12 for products near exact cancellation), both measured over at least MIN_OUTPUTS outputs (repeated
  calls on fresh x where the shape has fewer: the error of two outputs is chance, 742191c);
- the eager fast path (cached launches) and the registered op's full path give the same bits, twice (the cache
  entry reused, x fresh).
"""
import dataclasses
import random

import pytest
import torch

import fastnf4
from fastnf4.api import linear_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCKSIZES = [32, 64, 64, 64, 128, 256, 1024, 4096]


MIN_OUTPUTS = 512  # outputs per error estimate: over a few (N = 2, M = 1) the relative error is a draw of chance


def _errors(call, x, wd, bias):
    """(relative Frobenius error of ``call(x)``, that of cuBLAS on the dequantized weight), both against float64,
    over enough calls with fresh values in x (written into x itself: its layout and the kernel stay as they are)
    that at least MIN_OUTPUTS outputs count."""
    n, k = wd.shape
    m = x.numel() // k
    err = yard = norm = 0.0
    for rep in range(min(128, -(-MIN_OUTPUTS // (m * n)))):
        if rep:
            x.copy_(torch.randn_like(x))
        x2 = x.reshape(m, k)
        ref = x2.double() @ wd.double().T + (bias.double() if bias is not None else 0)
        y = call(x).reshape(m, n)
        assert torch.isfinite(y).all()
        err += (y.double() - ref).square().sum().item()
        yard += (torch.nn.functional.linear(x2, wd, bias).double() - ref).square().sum().item()
        norm += ref.square().sum().item()
    norm = max(norm, 1e-300)
    return (err / norm) ** 0.5, (yard / norm) ** 0.5


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
        y = fastnf4.linear(x, q, bias)
        assert y.shape == (*x.shape[:-1], n) and y.dtype == dtype, what
        err, yardstick = _errors(lambda x: fastnf4.linear(x, q, bias), x, wd, bias)
        assert err <= 2 * yardstick + 2.0 ** -12, (what, err, yardstick)
        x2 = x.reshape(m, k)
        y2 = fastnf4.linear(x, q, bias).reshape(m, n)
        full = torch.ops.fastnf4.linear(x2.contiguous(), *linear_args(q, bias))
        assert torch.equal(y2, full), what
        x.copy_(torch.randn_like(x))  # the cached launch again, on fresh x
        x2 = x.reshape(m, k)
        assert torch.equal(fastnf4.linear(x, q, bias).reshape(m, n),
                           torch.ops.fastnf4.linear(x2.contiguous(), *linear_args(q, bias))), what


def _rehome(t: torch.Tensor, rng: random.Random, max_offset: int) -> torch.Tensor:
    """The same values, as a view that starts ``0..max_offset`` elements into a larger buffer (and may end before its
    end): the kernels must read a tensor where it is, aligned or not (a shard of a fused weight, a slice of a
    stacked statistics array), or leave the call to a path that can."""
    off = rng.randrange(0, max_offset + 1)
    buf = torch.full((off + t.numel() + rng.randrange(0, 3),), 0x55 if not t.dtype.is_floating_point else float("nan"),
                     dtype=t.dtype, device=t.device)
    view = buf[off:off + t.numel()].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("seed", range(4))
def test_random_offsets_of_every_tensor(seed):
    """As test_random_shapes, with the packed bytes, the statistics (absmax, nested absmax, offset), x and the bias
    each a view at a random element offset into a larger, NaN-filled buffer: within the error budget, finite, the
    fast path's bits those of the full path, the dequantize's those of the aligned weight. (The matmul's bits are not
    compared with the aligned call's: an unaligned view may take another kernel.)"""
    rng = random.Random(3000 + seed)
    torch.manual_seed(100 + seed)
    for _ in range(25):
        n, k, m, blocksize, nested, dtype, bias_on, _ = _case(rng)
        what = (n, k, m, blocksize, nested, dtype, bias_on)
        q0 = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                              double_quant=nested)
        wd = fastnf4.dequantize(q0, dtype)
        q = dataclasses.replace(
            q0, packed=_rehome(q0.packed, rng, 40), absmax=_rehome(q0.absmax, rng, 9),
            nested_absmax=_rehome(q0.nested_absmax, rng, 5) if nested else None,
            offset=_rehome(q0.offset, rng, 3) if nested else None)
        x = _rehome(torch.randn(m, k, device="cuda", dtype=dtype), rng, 11)
        bias = _rehome(torch.randn(n, device="cuda", dtype=dtype), rng, 7) if bias_on else None
        y = fastnf4.linear(x, q, bias)
        assert y.shape == (m, n) and y.dtype == dtype, what
        err, yardstick = _errors(lambda x: fastnf4.linear(x, q, bias), x, wd, bias)
        assert err <= 2 * yardstick + 2.0 ** -12, (what, err, yardstick)
        assert torch.equal(fastnf4.linear(x, q, bias), torch.ops.fastnf4.linear(x, *linear_args(q, bias))), what
        assert torch.equal(fastnf4.dequantize(q, dtype), wd), what  # (the dequantize kernel on the views too)


@pytest.mark.parametrize("seed", range(4))
def test_random_chains_in_one_cuda_graph(seed):
    """Random chains of 2-5 layers (each layer's input the previous layer's output, as in a model; any shapes and
    blocksizes, M 1-300, bias or none, one dtype per chain) captured in one CUDA graph after an eager run: every
    replay on fresh x gives the eager chain's bits on the same x. Launches of one graph share the split-K counters,
    partial sums and prepared plans of every weight in it; a wrong reuse shows as a difference here."""
    rng = random.Random(4000 + seed)
    torch.manual_seed(200 + seed)
    for _ in range(6):
        dtype = rng.choice([torch.bfloat16, torch.bfloat16, torch.float16])
        m = rng.choice([1, 1, 2, 3, 4, rng.randrange(5, 33), rng.randrange(33, 300)])
        dims = [rng.choice([rng.randrange(16, 3000), 64 * rng.randrange(1, 80)]) for _ in range(rng.randrange(3, 7))]
        layers = []
        for k, n in zip(dims, dims[1:]):
            q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * k ** -0.5,
                                 blocksize=rng.choice(BLOCKSIZES), double_quant=rng.random() < 0.6)
            layers.append((q, torch.randn(n, device="cuda", dtype=dtype) if rng.random() < 0.5 else None))
        what = (dtype, m, dims, [(q.blocksize, q.nested, b is not None) for q, b in layers])

        def chain(x):
            for q, bias in layers:
                x = fastnf4.linear(x, q, bias)
            return x

        x = torch.randn(m, dims[0], device="cuda", dtype=dtype)
        chain(x)  # eager first (the plans and split-K state are prepared outside the capture)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            chain(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = chain(x)
        for _ in range(3):
            x.copy_(torch.randn_like(x))
            y.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            expect = chain(x)
            assert torch.isfinite(expect).all(), what
            assert torch.equal(y, expect), what
        del g
