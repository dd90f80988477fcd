"""fp16 / bf16 double-quant statistics on the GPU: fastnf4 decodes them bit for bit as bitsandbytes' CUDA
``F.dequantize_4bit`` does (its ``dequantize_blockwise`` into ``state2.dtype``, the offset added in that dtype), and
``linear`` uses the same absmax. The float32 nested absmax keeps bitsandbytes' CUDA kernel on defined input (it reads
that tensor as float32)."""
import copy

import pytest
import torch

import fastnf4
from fastnf4 import NF4Weight
from helpers import FLOATS, bits, random_weight
from test_nested_dtypes import SHAPE, bnb_state

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
F = pytest.importorskip("bitsandbytes.functional")


def _cuda_state(packed, qs):
    qs = copy.deepcopy(qs)
    qs.state2.absmax = qs.state2.absmax.float()
    qs.to("cuda")
    return packed.cuda(), qs


@pytest.mark.parametrize("offset_dtype", [None, *FLOATS], ids=str)
@pytest.mark.parametrize("nested_dtype", FLOATS, ids=str)
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float16], ids=str)
def test_dequantize_matches_bitsandbytes_cuda(wdtype, nested_dtype, offset_dtype, rng):
    from fastnf4.integrations.bitsandbytes import unpatch_bitsandbytes

    unpatch_bitsandbytes()  # (the reference is bitsandbytes' own CUDA kernels)
    w = random_weight(SHAPE[0] * SHAPE[1], wdtype, rng).view(SHAPE)
    packed, qs = _cuda_state(*bnb_state(w, nested_dtype, offset_dtype))
    ref = F.dequantize_4bit(packed, qs)
    q = NF4Weight.from_bnb(packed, qs)
    got = fastnf4.dequantize(q)
    assert got.is_cuda and torch.equal(bits(got), bits(ref))
    x = torch.randn(3, SHAPE[1], device="cuda", dtype=wdtype)
    y = fastnf4.linear(x, q)
    expect = x.double() @ ref.double().T
    assert (y.double() - expect).norm() / expect.norm() < 1e-2
