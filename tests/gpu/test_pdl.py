"""Programmatic dependent launch (sm_90+): fastnf4's kernels may be put on the GPU while the previous kernel
drains, and must then wait for it before touching memory. Checked with chains where each kernel reads what
the one before wrote (read after write) or overwrites what the one before read (write after read), eagerly
and inside a CUDA graph, bitwise against the same chain with PDL off; and the launch really uses PDL.
"""
import pytest
import torch

import fastnf4
from fastnf4 import _triton
from fastnf4.api import linear_args
from fastnf4.ops.dequantize import kernel as dq_kernel
from fastnf4.ops.matmul import eager, gemv_mma

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                       reason="PDL needs sm_90+"),
]


@pytest.fixture
def weights():
    torch.manual_seed(0)
    k = 4096
    q1 = fastnf4.quantize(torch.randn(512, k, device="cuda", dtype=torch.bfloat16))
    q2 = fastnf4.quantize(torch.randn(3072, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    q3 = fastnf4.quantize(torch.randn(2048, 3072, device="cuda", dtype=torch.bfloat16) * 0.02)
    return q1, q2, q3


def _run(q1, q2, q3, rounds=6):
    bufs = [torch.full(q1.shape, float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    outs = []
    for r in range(rounds):
        d = bufs[r % 2]
        fastnf4.dequantize(q1, out=d)          # write after read: the matmul two rounds back read d
        y = fastnf4.linear(d[:4], q2)          # read after write: x is what the dequantize just wrote
        outs.append(fastnf4.linear(y, q3))     # read after write again, kernel to kernel
    return outs


def test_pdl_is_used_on_this_gpu(monkeypatch):
    assert _triton.pdl(torch.device("cuda"))
    x = torch.zeros(1, 4096, device="cuda", dtype=torch.bfloat16)
    q = fastnf4.quantize(torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16))
    assert dq_kernel.Prepared(q.packed_u8, q.absmax, fastnf4.codebooks.kernel_code("nf4", q.device), q.blocksize,
                              q.numel).constexprs["PDL"]
    if gemv_mma.supports(x, q.packed_u8, q.blocksize, 256, 4096, q.nested_code is not None):
        assert gemv_mma.Prepared(x, *linear_args(q)).pdl == 0  # opt-in for the CUDA kernels
        monkeypatch.setenv("FASTNF4_PDL_MMA", "1")
        assert gemv_mma.Prepared(x, *linear_args(q)).pdl == 1


@pytest.mark.parametrize("graph", [False, True])
def test_chains_bitwise_equal_with_and_without_pdl(weights, graph, monkeypatch):
    q1, q2, q3 = weights
    monkeypatch.setenv("FASTNF4_PDL_MMA", "1")  # the CUDA kernels' opt-in too
    monkeypatch.setenv("FASTNF4_PDL", "0")
    expect = [y.clone() for y in _run(q1, q2, q3)]
    monkeypatch.delenv("FASTNF4_PDL")
    for q in (q1, q2, q3):
        eager.forget(q)  # prepared launches read the switch when they are made
    for _ in range(3):
        if graph:
            _run(q1, q2, q3)  # warm-up outside the capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs = _run(q1, q2, q3)
            for y in outs:
                y.fill_(float("nan"))
            g.replay()
        else:
            outs = _run(q1, q2, q3)
        torch.cuda.synchronize()
        for y, e in zip(outs, expect):
            assert torch.equal(y.view(torch.int16), e.view(torch.int16))
