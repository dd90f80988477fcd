"""The Triton matmul paths compiled for the GPU (not the interpreter): the GEMV (M <= 4), the tensor-core GEMM and
dequantize + matmul, each forced, and ``fastnf4.linear`` with the CUDA kernels unavailable. These are what a GPU
without nvcc runs, and what M <= 2 takes where the CUDA decode kernels do not fit (their 200 KiB of shared memory
per block is more than an A100 or any consumer part has). The CPU suite covers the same kernels in the interpreter
on small shapes; here the shapes are model-like and odd, against a float64 product with the dequantized weight:
within 2x the error of cuBLAS on the same weight (the issue's budget), fresh random data.
"""
import pytest
import torch

import fastnf4
from fastnf4 import _triton
from fastnf4.api import linear_args
from fastnf4.ops.matmul import dispatch, gemv_mma, kernel, wgmma

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(torch.cuda.is_available() and not _triton.use_triton(torch.device("cuda")),
                                  reason="Triton not usable on this GPU")

SHAPES = [  # (N, K, blocksize, double quant)
    (4096, 4096, 64, True),     # split-K plans at small M
    (1000, 576, 64, False),     # N off every tile, K not a multiple of 128
    (2048, 5376, 128, True),    # a Gemma-like K
    (300, 192, 4096, True),     # quantization blocks spanning rows
    (48, 96, 32, False),        # the smallest blocksize, a group of 32
]


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def _case(n, k, blocksize, nested, m, dtype, bias):
    g = torch.Generator(device="cuda").manual_seed(n * 31 + k + m)
    w = torch.randn(n, k, device="cuda", generator=g).to(dtype) * 0.02
    q = fastnf4.quantize(w, blocksize=blocksize, double_quant=nested)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    b = (torch.randn(n, device="cuda", generator=g) * 0.1).to(dtype) if bias else None
    wd = fastnf4.dequantize(q, dtype)
    ref = x.double() @ wd.double().T + (b.double() if b is not None else 0)
    return q, x, b, ref, _rel(torch.nn.functional.linear(x, wd, b), ref)


@needs_triton
@pytest.mark.parametrize("path, m", [("gemv", 1), ("gemv", 2), ("gemv", 4), ("gemm", 3), ("gemm", 8), ("gemm", 17),
                                     ("gemm", 32), ("dequant+matmul", 1), ("dequant+matmul", 64)])
@pytest.mark.parametrize("n, k, blocksize, nested", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forced_triton_paths_match_reference(path, m, n, k, blocksize, nested, dtype):
    q, x, b, ref, yardstick = _case(n, k, blocksize, nested, m, dtype, bias=(m % 2 == 1))
    torch.cuda.synchronize()
    y = dispatch.linear_triton(x, *linear_args(q, b), path=path)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == dtype and torch.isfinite(y).all()
    assert _rel(y, ref) <= 2 * yardstick, (_rel(y, ref), yardstick)


@needs_triton
@pytest.mark.parametrize("m", [1, 2, 4, 16, 64, 300])
def test_linear_without_the_cuda_kernels(m, monkeypatch):
    """As on a GPU without nvcc: the dispatcher's picks among the Triton paths, through the public op."""
    monkeypatch.setattr(gemv_mma, "supports", lambda *a, **kw: False)
    monkeypatch.setattr(wgmma, "supports", lambda *a, **kw: False)
    for n, k, blocksize, nested in SHAPES[:3]:
        q, x, b, ref, yardstick = _case(n, k, blocksize, nested, m, torch.bfloat16, bias=True)
        path = dispatch.pick_path(x, q.packed_u8, blocksize, n, k, nested, q.nested_blocksize)
        assert path in ("gemv", "gemm", "dequant+matmul")
        y = fastnf4.linear(x, q, b)
        torch.cuda.synchronize()
        assert torch.isfinite(y).all() and _rel(y, ref) <= 2 * yardstick, (path, _rel(y, ref), yardstick)


@needs_triton
@pytest.mark.parametrize("path, m, n", [("gemv", 1, 48), ("gemv", 2, 1000), ("gemm", 8, 1000), ("gemm", 32, 300)])
def test_split_k_is_bitwise_repeatable(path, m, n):
    """Few row tiles and a long K: the plans split K (asserted), and the parts' float32 partial sums are added in a
    fixed order (``kernel.add_parts``), so every call gives the same bits (atomic adds did not: the fuzz test of
    fastnf4.linear caught an fp32 call whose fast and full paths differed)."""
    k = 8192
    q, x, b, ref, yardstick = _case(n, k, 64, True, m, torch.float32 if m == 1 else torch.bfloat16, bias=True)
    sms = kernel.num_sms(x.device)
    split = (kernel.gemv_plan(m, n, k, 64, sms)[2] if path == "gemv" else kernel.gemm_plan(m, n, k, 64, sms)[1])
    assert split > 1
    ys = [dispatch.linear_triton(x, *linear_args(q, b), path=path) for _ in range(20)]
    torch.cuda.synchronize()
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert _rel(ys[0], ref) <= 2 * yardstick + 2.0 ** -12
