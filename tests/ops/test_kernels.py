"""The Triton kernels (through Triton's CPU interpreter when there is no GPU) against the reference.

Outputs are poisoned before each launch, sizes are awkward (odd, one past a tile, not a multiple of the
blocksize). Under the interpreter the quantize kernel divides (it cannot run PTX's rcp.approx), so it is
compared with the reference using the same IEEE reciprocal; on a GPU both use the hardware reciprocal
and the kernels are compared with bitsandbytes itself (tests/gpu).
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fastnf4 import _triton
from fastnf4.codebooks import BLOCKSIZES, dynamic_map, kernel_code
from fastnf4.ops.dequantize import naive as dq
from fastnf4.ops.quantize import naive as qn
from helpers import FLOATS, bits, poisoned, random_packed, random_weight

pytestmark = pytest.mark.skipif(not _triton.use_triton(torch.device("cpu")), reason="needs TRITON_INTERPRET=1 and triton")
RECIPROCAL = qn.ieee_reciprocal_ftz


def run_dequant(packed, absmax, code, blocksize, numel, dtype, ncode, nabs, off, **kw):
    from fastnf4.ops.dequantize import kernel

    out = poisoned((numel,), dtype)
    kernel.launch(packed, absmax, code, out, blocksize, numel, ncode, nabs, off, manual_bf16=True, **kw)
    return out


@given(numel=st.integers(1, 5000), blocksize=st.sampled_from(BLOCKSIZES), dtype=st.sampled_from(FLOATS),
       nested=st.booleans(), quant_type=st.sampled_from(["nf4", "fp4"]), seed=st.integers(0, 2**31 - 1))
def test_dequantize_kernel_matches_reference(numel, blocksize, dtype, nested, quant_type, seed):
    gen = torch.Generator().manual_seed(seed)
    packed, absmax, ncode, nabs, off = random_packed(numel, blocksize, nested, gen)
    code = kernel_code(quant_type, torch.device("cpu"))
    want = dq.dequantize(packed, absmax, code, blocksize, numel, dtype, ncode, nabs, off)
    got = run_dequant(packed, absmax, code, blocksize, numel, dtype, ncode, nabs, off)
    assert torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("tile_bytes", [16, 64, 2048])
@pytest.mark.parametrize("numel", [2 * 2048 + 2, 2 * 2048 - 1, 4096 * 2 + 64 + 1])
def test_dequantize_tiles_and_tails(tile_bytes, numel, rng):
    # tile sizes smaller than, equal to and larger than a quantization block; tails one past a tile
    for blocksize in (32, 4096):
        packed, absmax, *_ = random_packed(numel, blocksize, False, rng)
        code = kernel_code("nf4", torch.device("cpu"))
        want = dq.dequantize(packed, absmax, code, blocksize, numel, torch.bfloat16)
        got = run_dequant(packed, absmax, code, blocksize, numel, torch.bfloat16, None, None, None, tile_bytes=tile_bytes)
        assert torch.equal(bits(got), bits(want))


def test_manual_bf16_rounding_is_nearest_even():
    # float32 values exactly halfway between two bf16 numbers (both parities), plus NaN and infinities:
    # the kernel's integer rounding path must agree with PyTorch's round-to-nearest-even cast.
    base = torch.tensor([1.0, 1.0078125, 3.0, -1.0, 65504.0, 1e-30], dtype=torch.float32)
    halfway = (bits(base.to(torch.bfloat16).float()).long() + 0x8000).to(torch.int32).view(torch.float32)
    vals = torch.cat([base, halfway, torch.tensor([float("nan"), float("inf"), -float("inf")])])
    # one block of 32 per value: absmax = value, bytes 0xF7 = codes (15 -> 1.0, 7 -> 0.0)
    packed = torch.full((16 * vals.numel(),), 0xF7, dtype=torch.uint8)
    code = kernel_code("nf4", torch.device("cpu"))
    got = run_dequant(packed, vals, code, 32, 32 * vals.numel(), torch.bfloat16, None, None, None)[0::32]
    want = vals.to(torch.bfloat16)
    assert torch.equal(torch.isnan(got), torch.isnan(want))  # NaN payloads are not compared
    finite = ~torch.isnan(want)
    assert torch.equal(bits(got[finite]), bits(want[finite]))


@given(numel=st.integers(1, 4000), blocksize=st.sampled_from(BLOCKSIZES), dtype=st.sampled_from(FLOATS),
       quant_type=st.sampled_from(["nf4", "fp4"]), special=st.booleans(), seed=st.integers(0, 2**31 - 1),
       tree=st.booleans(), large_tile=st.booleans())
def test_quantize_kernel_matches_reference(numel, blocksize, dtype, quant_type, special, seed, tree, large_tile):
    from fastnf4.ops.quantize import kernel

    w = random_weight(numel, dtype, torch.Generator().manual_seed(seed), special=special)
    want_p, want_a = qn.quantize_4bit(w, blocksize, quant_type, reciprocal=RECIPROCAL)
    p, a = poisoned(want_p.shape, torch.uint8), poisoned(want_a.shape, torch.float32)
    # NF4 by the threshold count or the tree; the tile of the large weights or of the small ones
    tile = dict(elems_per_prog=kernel.QUANT_TILE_LARGE[0], num_warps=kernel.QUANT_TILE_LARGE[1]) if large_tile else {}
    kernel.launch_4bit(w, p, a, blocksize, quant_type, tree=tree, **tile)
    assert torch.equal(p, want_p) and torch.equal(bits(a), bits(want_a))


@given(numel=st.integers(1, 3000), blocksize=st.sampled_from([64, 256, 4096]), seed=st.integers(0, 2**31 - 1),
       select2=st.booleans(), elems_per_prog=st.sampled_from([None, 256, 2048]))
def test_quantize_8bit_kernel_matches_reference(numel, blocksize, seed, select2, elems_per_prog):
    from fastnf4.ops.quantize import kernel

    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(numel, generator=gen) * 3
    x[::97] = 0.0
    offset = x.mean()
    want_q, want_a = qn.quantize_8bit(x, offset, dynamic_map(), blocksize, reciprocal=RECIPROCAL)
    q, a = poisoned(want_q.shape, torch.uint8), poisoned(want_a.shape, torch.float32)
    kernel.launch_8bit(x, offset, dynamic_map(), q, a, blocksize, select2=select2, elems_per_prog=elems_per_prog)
    assert torch.equal(q, want_q) and torch.equal(bits(a), bits(want_a))
