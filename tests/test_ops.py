"""The torch.library contract: opcheck on every op, torch.compile(fullgraph=True) without graph breaks."""
import pytest
import torch

import fastnf4
from fastnf4 import _ops
from fastnf4.codebooks import dynamic_map, kernel_code
from helpers import bits, random_packed, random_weight


def dequant_args(nested, rng, numel=1000, blocksize=64):
    packed, absmax, ncode, nabs, off = random_packed(numel, blocksize, nested, rng)
    return (packed, absmax, kernel_code("nf4", torch.device("cpu")), blocksize, numel, torch.bfloat16, ncode, nabs, off, 256)


@pytest.mark.parametrize("nested", [False, True])
def test_opcheck_dequantize(nested, rng):
    args = dequant_args(nested, rng)
    torch.library.opcheck(_ops.dequantize_4bit, args)
    out = torch.empty(args[4], dtype=torch.float16)
    torch.library.opcheck(_ops.dequantize_4bit_out, (*args[:5], *args[6:], out))


def test_opcheck_quantize(rng):
    w = random_weight(777, torch.bfloat16, rng)
    torch.library.opcheck(_ops.quantize_4bit, (w, 64, "nf4"))
    x = torch.rand(300, generator=rng)
    torch.library.opcheck(_ops.quantize_8bit, (x, x.mean(), dynamic_map(), 256))


@pytest.mark.parametrize("nested", [False, True])
def test_compile_fullgraph(nested, rng):
    q = fastnf4.quantize(random_weight(64 * 48, torch.bfloat16, rng).view(48, 64), double_quant=nested)
    fastnf4.dequantize(q)  # first use on a device caches the code table outside the traced region

    def f(q, x):
        return x @ fastnf4.dequantize(q).t()

    x = torch.randn(3, 64, dtype=torch.bfloat16, generator=rng)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(bits(compiled(q, x)), bits(f(q, x)))
    qc = torch.compile(lambda w: fastnf4.quantize(w, double_quant=nested).absmax, fullgraph=True, backend="aot_eager")
    w = random_weight(64 * 8, torch.float16, rng)
    assert torch.equal(qc(w), fastnf4.quantize(w, double_quant=nested).absmax)


def test_dispatch_modes_see_the_ops(rng):
    """Plain eager calls of fastnf4.dequantize / fastnf4.linear run the ops' bodies directly (host time); under a
    dispatch mode (profilers, FlopCounter, fake tensors) the ops themselves must be what is seen."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    q = fastnf4.quantize(torch.randn(16, 64, generator=rng))
    x = torch.randn(2, 64, generator=rng)
    plain = (fastnf4.dequantize(q), fastnf4.linear(x, q))
    with Record() as rec:
        seen = (fastnf4.dequantize(q), fastnf4.linear(x, q))
    assert any(n.startswith("fastnf4.dequantize_4bit") for n in rec.names), rec.names
    assert any(n.startswith("fastnf4.linear") for n in rec.names), rec.names
    assert all(torch.equal(a, b) for a, b in zip(plain, seen))
