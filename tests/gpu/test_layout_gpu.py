"""The fastnf4 layout on the GPU: ``dequantize`` and ``linear`` of a repacked weight give the bnb-layout weight's
results bit for bit (fresh random data, outputs poisoned), eager and in a CUDA graph, on every M the dispatcher
separates; the conversion is lossless on the device; a repacked Linear4bit keeps its bytes and its output."""
import pytest
import torch

import fastnf4
from fastnf4 import layouts
from fastnf4.bench.harness import capture

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _poisoned(fn, shape, dtype):
    t = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del t
    return fn()


@pytest.mark.parametrize("n,k", [(16, 64), (256, 4160), (1024, 4096)])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_repacked_weight_gives_the_same_bits(n, k, nested, dtype):
    g = torch.Generator(device="cuda").manual_seed(n + k + nested)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=g)
    q = fastnf4.quantize(w, blocksize=64, double_quant=nested)
    before = q.packed_u8.clone()
    r = fastnf4.repack(q, "fastnf4")
    assert r.layout == "fastnf4" and r.packed.is_cuda and r.packed.shape == (n // 16, k // 64, 512)
    assert torch.equal(layouts.to_bnb_order(r.packed).view(-1), before)
    want = fastnf4.dequantize(q)
    got = _poisoned(lambda: fastnf4.dequantize(r), (n, k), dtype)
    assert torch.equal(got, want)
    for m in (1, 2, 3, 8, 17, 40, 300):
        x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
        b = torch.randn(n, device="cuda", dtype=dtype, generator=g) if m % 2 else None
        want = fastnf4.linear(x, q, b)
        got = _poisoned(lambda: fastnf4.linear(x, r, b), (m, n), dtype)
        assert torch.isfinite(got).all() and torch.equal(got, want), m


def test_repacked_layer_in_a_cuda_graph():
    dense = torch.nn.Linear(1024, 2048, bias=True, device="cuda", dtype=torch.bfloat16)
    layer = fastnf4.nn.Linear4bit.from_linear(dense)
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = layer(x).clone()
        nbytes = layer.weight_nf4.nbytes()
        layer.repack("fastnf4")
        assert layer.layout == "fastnf4" and layer.weight_nf4.nbytes() == nbytes
        graph, y = capture([lambda: layer(x)], 1)  # (warmed up on a side stream, then captured)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(y, want)
