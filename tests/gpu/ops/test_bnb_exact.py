"""Bit-exactness against bitsandbytes' CUDA kernels, on the GPU (skipped without CUDA or bitsandbytes).

Every linear shape of the three models x every blocksize x fp16/bf16/fp32, double quantization on and
off: packed bytes, absmax, nested statistics and offset identical; dequantized outputs identical bit for bit.
"""
from __future__ import annotations

import pytest
import torch

import fastnf4
from fastnf4.bench.harness import model_shapes
from fastnf4.codebooks import BLOCKSIZES

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
F = pytest.importorskip("bitsandbytes.functional")

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SHAPES = sorted({(n, k) for _, _, n, k in model_shapes()})


def bits(t):
    return t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_quantization(q, packed, qs, what):
    assert torch.equal(q.packed_u8, packed.reshape(-1)), f"{what}: packed bytes differ at {(q.packed_u8 != packed.reshape(-1)).sum().item()} bytes"
    assert torch.equal(bits(q.absmax), bits(qs.absmax)), f"{what}: absmax differs"
    if qs.nested:
        assert torch.equal(bits(q.nested_absmax), bits(qs.state2.absmax)), f"{what}: nested absmax differs"
        assert torch.equal(bits(q.offset), bits(qs.offset)), f"{what}: offset differs"


def check_dequant(q, packed, qs, what):
    for dt in DTYPES:
        qs.dtype = dt
        expect = F.dequantize_4bit(packed, qs)
        out = torch.full(q.shape, float("nan"), dtype=dt, device="cuda")
        got = fastnf4.dequantize(q, dtype=dt, out=out)
        diff = (bits(got) != bits(expect)).sum().item()
        assert diff == 0, f"{what} -> {dt}: {diff} elements differ"


@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_model_shapes_exact(shape, blocksize):
    for i, dt in enumerate(DTYPES):
        g = torch.Generator(device="cuda").manual_seed(hash((shape, blocksize, i)) % 2**31)
        w = torch.randn(shape, dtype=dt, device="cuda", generator=g) * (0.02 + i)
        for nested in (False, True):
            what = f"{shape} bs={blocksize} {dt} nested={nested}"
            packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=nested, quant_type="nf4")
            q = fastnf4.quantize(w, blocksize=blocksize, double_quant=nested)
            assert_same_quantization(q, packed, qs, what)
            check_dequant(fastnf4.NF4Weight.from_bnb(packed, qs), packed, qs, what)


def _awkward(n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, dtype=torch.float32, device="cuda", generator=g)
    if n > 600:
        w[:64] = 0  # an all-zero block
        w[70] = float("nan")
        w[130] = float("inf")
        w[200] = -float("inf")
        w[256:320] = float("nan")  # an all-NaN block
        w[400:464] *= 1e-39  # subnormal territory (bf16/fp32)
        w[500:564] *= 1e30
    return w.to(dtype)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("n", [1, 2, 3, 63, 65, 1001, 4097, 77777, 1_000_003])
def test_awkward_sizes_and_values(n, quant_type):
    for dt in DTYPES:
        w = _awkward(n, dt, n)
        for blocksize in (32, 64, 256, 4096):
            for nested in (False, True):
                what = f"n={n} {dt} bs={blocksize} nested={nested} {quant_type}"
                packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=nested, quant_type=quant_type)
                q = fastnf4.quantize(w, blocksize=blocksize, double_quant=nested, quant_type=quant_type)
                assert_same_quantization(q, packed, qs, what)
                check_dequant(fastnf4.NF4Weight.from_bnb(packed, qs), packed, qs, what)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_reference_on_gpu_matches_bnb(quant_type):
    """The pure-PyTorch reference (with the shipped rcp.approx table) gives bitsandbytes' CUDA bytes too."""
    from fastnf4.ops.quantize import naive

    for n in (4097, 1_000_003, 8192 * 1024):
        for dt in DTYPES:
            w = _awkward(n, dt, n + 1)
            for blocksize in (32, 64, 4096):
                packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=False, quant_type=quant_type)
                p, a = naive.quantize_4bit(w.reshape(-1), blocksize, quant_type)
                diff = (p != packed.reshape(-1)).sum().item()
                assert diff == 0 and torch.equal(bits(a), bits(qs.absmax)), f"reference n={n} {dt} bs={blocksize}: {diff} bytes"


def test_int64_indexing_dequant():
    """A tensor over 2**31 elements: the last elements must be right (64-bit offsets)."""
    n = 2**31 + 2**20 + 6
    packed = torch.randint(0, 256, ((n + 1) // 2,), dtype=torch.uint8, device="cuda")
    absmax = torch.rand(-(-n // 4096), device="cuda") + 0.5
    q = fastnf4.NF4Weight(packed=packed, absmax=absmax, code=fastnf4.codebooks.code_4bit("nf4", "cuda"),
                          blocksize=4096, shape=(n,), dtype=torch.bfloat16)
    out = fastnf4.dequantize(q)
    from fastnf4.ops.dequantize import naive
    from fastnf4.ops.quantize import naive as qn

    s = (n - 3 * 2**20) // 4096 * 4096  # a block boundary a few MB before the end
    ref = naive.dequantize(packed[s // 2:], absmax[s // 4096:], q.code, 4096, n - s, torch.bfloat16)
    assert torch.equal(bits(out[s:]), bits(ref))
    del out, ref
    w = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    qq = fastnf4.quantize(w, blocksize=4096, double_quant=False)
    p, a = qn.quantize_4bit(w[s:], 4096)
    assert torch.equal(qq.packed_u8[s // 2:], p) and torch.equal(qq.absmax[s // 4096:], a)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_huge_finite_values(quant_type):
    """Finite values near the float32 limit, as bitsandbytes' CUDA kernels treat them: blocks whose absmax is at or
    above 2^126 (where the kernel's reciprocal of the absmax flushes to zero), one at FLT_MAX, and, with double
    quantization, absmax values whose mean overflows (offset Inf). The package and the pure-PyTorch reference must
    give bitsandbytes' bytes and statistics, and the same decoded bits."""
    from fastnf4.ops.quantize import naive

    g = torch.Generator(device="cuda").manual_seed(126)
    big = torch.finfo(torch.float32).max
    for dt in (torch.float32, torch.bfloat16):
        for overflow in (False, True):
            w = torch.randn(64 * 48, device="cuda", generator=g)
            w[0:64] *= 2.0**125  # absmax ~2^126-2^127: the reciprocal's edge
            w[64:128] *= 3e37
            w[128:192] = torch.linspace(-1.0, 1.0, 64, device="cuda") * 3.0e38
            w[192] = big if dt == torch.float32 else 3.3e38  # (FLT_MAX rounds to Inf in bf16)
            if overflow:  # 12 blocks of absmax ~3e38: their sum overflows float32
                w[256:1024] = w[256:1024].clamp(-3.0, 3.0) * 1e38
            w = w.to(dt)
            assert torch.isfinite(w).all()
            for blocksize in (64, 256):
                for nested in (False, True):
                    what = f"{dt} overflow={overflow} bs={blocksize} nested={nested} {quant_type}"
                    packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=nested,
                                                 quant_type=quant_type)
                    q = fastnf4.quantize(w, blocksize=blocksize, double_quant=nested, quant_type=quant_type)
                    assert_same_quantization(q, packed, qs, what)
                    check_dequant(fastnf4.NF4Weight.from_bnb(packed, qs), packed, qs, what)
                    if not nested:
                        p, a = naive.quantize_4bit(w.reshape(-1), blocksize, quant_type)
                        assert torch.equal(p, packed.reshape(-1)) and torch.equal(bits(a), bits(qs.absmax)), what
