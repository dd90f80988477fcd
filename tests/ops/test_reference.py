"""The pure-PyTorch reference against bitsandbytes' CPU backend, plus properties that need no oracle."""
import pytest
import torch

from fastnf4.codebooks import BLOCKSIZES, code_4bit, dynamic_map, kernel_code
from fastnf4.ops.dequantize import naive as dq
from fastnf4.ops.quantize import naive as qn
from helpers import FLOATS, bits, random_packed, random_weight

F = pytest.importorskip("bitsandbytes.functional")


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("numel", [4096 * 3, 4096 * 3 + 1, 777])
def test_dequantize_matches_bnb_cpu(numel, dtype, blocksize, nested, rng):
    packed, absmax, ncode, nabs, off = random_packed(numel, blocksize, nested, rng)
    from bitsandbytes.functional import QuantState

    state2 = QuantState(absmax=nabs, code=ncode, blocksize=256, dtype=torch.float32) if nested else None
    qs = QuantState(absmax=absmax, shape=torch.Size([numel]), code=code_4bit("nf4"), blocksize=blocksize,
                    quant_type="nf4", dtype=dtype, offset=off, state2=state2)
    expect = F.dequantize_4bit(packed.view(-1, 1), qs)
    got = dq.dequantize(packed, absmax, code_4bit("nf4"), blocksize, numel, dtype, ncode, nabs, off)
    assert torch.equal(bits(got), bits(expect))


@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_quantize_matches_bnb_cpu(blocksize, dtype, rng):
    # bnb's CPU backend divides exactly where its CUDA kernel multiplies by an approximate reciprocal, so
    # the comparison uses the IEEE reciprocal; whole blocks only (its tail block uses a division). NF4 only:
    # for FP4 the CPU backend uses other thresholds (float32 midpoints) than the CUDA kernel; fastnf4
    # follows CUDA, checked against it on the GPU (tests/gpu).
    quant_type = "nf4"
    w = random_weight(4096 * 4, dtype, rng)
    packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=False, quant_type=quant_type)
    p, a = qn.quantize_4bit(w, blocksize, quant_type, reciprocal=qn.ieee_reciprocal_ftz)
    assert torch.equal(p, packed.reshape(-1)) and torch.equal(bits(a), bits(qs.absmax))


def test_nested_statistics_match_bnb_cpu(rng):
    w = random_weight(256 * 64 * 3 + 64 * 5, torch.bfloat16, rng)
    packed, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=True)
    _, a = qn.quantize_4bit(w, 64, reciprocal=qn.ieee_reciprocal_ftz)
    offset = a.mean()
    q8, a2 = qn.quantize_8bit(a, offset, dynamic_map(), 256, reciprocal=qn.ieee_reciprocal_ftz)
    assert torch.equal(bits(offset), bits(qs.offset))
    assert torch.equal(q8, qs.absmax) and torch.equal(bits(a2), bits(qs.state2.absmax))


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [32, 64, 4096])
def test_roundtrip_error_is_within_half_a_code_gap(blocksize, quant_type, rng):
    # |w - dequant(quant(w))| <= absmax * (largest gap between neighbouring codes) / 2, elementwise
    w = random_weight(10_000, torch.float32, rng)
    p, a = qn.quantize_4bit(w, blocksize, quant_type)
    code = kernel_code(quant_type, torch.device("cpu"))
    d = dq.dequantize(p, a, code, blocksize, w.numel(), torch.float32)
    gap = code.sort().values.diff().max().item()
    bound = a.repeat_interleave(blocksize)[: w.numel()] * gap / 2 * (1 + 1e-6)
    assert torch.all((w - d).abs() <= bound)


def test_quantize_picks_the_nearest_code(rng):
    # with an exact reciprocal, every element gets a code whose value is nearest to w / absmax
    w = random_weight(64 * 50, torch.float32, rng)
    p, a = qn.quantize_4bit(w, 64, "nf4", reciprocal=qn.ieee_reciprocal_ftz)
    codes = torch.stack((p >> 4, p & 15), 1).reshape(-1).long()
    x = (w.view(-1, 64) / a[:, None]).reshape(-1)
    dist = (x[:, None] - code_4bit("nf4")[None, :]).abs()
    assert torch.all(dist.gather(1, codes[:, None]).squeeze(1) <= dist.min(1).values + 1e-6)


def test_special_values_follow_bitsandbytes_cuda_rules():
    w = torch.tensor([0.0] * 64 + [float("nan")] + [1.0] * 63 + [float("inf"), 0.5] + [0.25] * 62)
    p, a = qn.quantize_4bit(w, 64)
    assert a[0] == 0 and p[0] == 0x00  # all-zero block: rcp(0) = inf, 0 * inf = NaN -> code 0
    assert a[1] == 1.0 and (p[32] >> 4) == 0 and (p[32] & 15) == 15  # NaN ignored by absmax, NaN -> code 0
    assert a[2] == float("inf") and p[64] == 0x07  # inf -> NaN -> 0; finite * 0 -> code 7
    all_nan = qn.quantize_4bit(torch.full((64,), float("nan")), 64)[1]
    assert all_nan[0] == -torch.finfo(torch.float32).max  # fmaxf seeded with -FLT_MAX


def test_emulated_rcp_differs_from_ieee_only_by_one_ulp():
    a = torch.rand(100_000) * 100 + 1e-3
    r, e = qn.rcp_approx_ftz(a), qn.ieee_reciprocal_ftz(a)
    assert (bits(r).long() - bits(e).long()).abs().max() <= 1
    assert qn.rcp_approx_ftz(torch.tensor([0.0]))[0] == float("inf")
    assert qn.rcp_approx_ftz(torch.tensor([1e-39]))[0] == float("inf")  # subnormal input flushed
