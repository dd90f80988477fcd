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


@pytest.mark.skipif(not fastnf4._triton.use_triton(torch.device("cpu")), reason="needs the Triton interpreter")
def test_kernel_launches_run_with_the_tensors_device_current(monkeypatch, rng):
    """Triton and the CUDA runtime launch on the current device, so every op body launches its kernels inside
    ``_ops.on_device(tensor)`` (a model split over GPUs calls layers on cuda:1 with cuda:0 current; the effect is
    checked on two GPUs in tests/gpu/test_multi_gpu.py). Here the launches are recorded with the context they ran
    in: each must run inside the context of a tensor of the call, and nothing outside it."""
    from fastnf4.ops.dequantize import kernel as dq_kernel
    from fastnf4.ops.matmul import dispatch
    from fastnf4.ops.quantize import kernel as q_kernel

    inside, launched = [], []

    class Guard:
        def __init__(self, t):
            self.t = t

        def __enter__(self):
            inside.append(self.t)

        def __exit__(self, *exc):
            inside.pop()

    monkeypatch.setattr(_ops, "on_device", Guard)
    for module, name in ((dq_kernel, "launch"), (q_kernel, "launch_4bit"), (q_kernel, "launch_8bit"),
                         (dispatch, "linear_triton")):
        def recorded(*args, _f=getattr(module, name), _name=name, **kwargs):
            launched.append((_name, inside[-1] if inside else None, args))
            return _f(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    q = fastnf4.quantize(random_weight(64 * 48, torch.bfloat16, rng).view(48, 64), double_quant=True)
    fastnf4.dequantize(q)
    fastnf4.linear(torch.randn(3, 64, dtype=torch.bfloat16, generator=rng), q)
    # (at this size linear takes dequantize + matmul: the dequantize launch runs inside linear_triton's)
    assert [n for n, _, _ in launched] == ["launch_4bit", "launch_8bit", "launch", "linear_triton", "launch"]
    for name, guard_of, args in launched:
        assert guard_of is not None, f"{name} launched outside _ops.on_device"
        assert all(a.device == guard_of.device for a in args if isinstance(a, torch.Tensor)), name
