"""The eager host fast path of ``fastnf4.linear`` (ops/matmul/eager.py) on the GPU.

The oracle is the full path through the registered op ``torch.ops.fastnf4.linear`` (checks, dispatch, plan,
launch worked out on every call): the fast path must give bitwise the same output, on fresh data, with the
output poisoned first where the API allows it, and must notice every change that makes a cached launch stale.
"""
import pytest
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import eager, gemv_mma

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _needs_build():
    x = torch.zeros(1, 32, device="cuda", dtype=torch.bfloat16)
    if not gemv_mma.supports(x, torch.zeros(16, dtype=torch.uint8, device="cuda"), 64, 1, 32):
        pytest.skip("gemv_mma not built here (no nvcc or FASTNF4_CUDA=0)")


def _full(x, q, bias=None):
    return torch.ops.fastnf4.linear(x, *linear_args(q, bias))


def _prepared(q):
    return [e[2] for e in eager._PLANS.get(q, {}).values() if e[2] is not None]


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bitwise_equal_to_full_path(nested, dtype):
    torch.manual_seed(1)
    n, k = 4096, 2112
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, double_quant=nested)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    for m in (1, 2, 3, 8, 13, 16, 32, 33, 160):
        for b in (None, bias):
            for lead in ((m,), (1, m)):
                x = torch.randn(*lead, k, device="cuda", dtype=dtype)
                y = fastnf4.linear(x, q, b)
                assert y.shape == (*lead, n)
                assert torch.equal(y, _full(x, q, b)), (m, b is not None, lead)
    assert _prepared(q), "the fast path was never taken"


def test_fast_path_follows_the_dispatcher_over_the_wide_m_buckets():
    """M 257-512, where the path changes with M (no wgmma at 257-384, from 353 on low-bandwidth GPUs; 8a776b8,
    459e62d): a weight the M 385-512 rule takes (N = 8192, 21M elements), calls in alternating buckets. Each is
    bitwise equal to the full op path, and its cached launch is of the kind the dispatcher picks for that M (bits
    alone cannot tell: the wgmma kernel's exact decode and cuBLAS on the dequantized weight can give the same sums
    here), so a launch cached for another bucket would show."""
    from fastnf4.ops.matmul import dispatch

    torch.manual_seed(2)
    n, k = 8192, 2560
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
    a = linear_args(q)
    kinds = {"wgmma": "Prepared", "dequant+matmul": "DequantMatmul"}
    seen = set()
    for m in (300, 450, 352, 353, 384, 385, 512, 257, 400):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(fastnf4.linear(x, q), _full(x, q)), m
        path = dispatch.pick_path(x, a[0], a[3], n, k, a[6] is not None, a[9])
        entry = eager._PLANS[q][(x.dtype, eager.m_key(m), x.get_device())]
        assert type(entry[2]).__name__ == kinds[path], (m, path, entry[2])
        seen.add(path)
    assert seen == set(kinds)  # both paths met (on the H200 and on low-bandwidth GPUs alike)


def test_one_entry_per_decode_size_and_one_per_prefill_bucket():
    # prefill M share an entry within a wgmma bucket (eager.m_key: <= 64 / 128 / 256 / 352 / 384 / 512, above); this is
    # a weight too small for the wgmma kernel, so every bucket holds dequantize + cuBLAS
    q = fastnf4.quantize(torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16))
    for m in (1, 1, 2, 64, 40, 100, 2048, 1000):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(fastnf4.linear(x, q), _full(x, q))
    kinds = sorted(type(p).__name__ for p in _prepared(q))
    assert kinds == ["DequantMatmul"] * 3 + ["Prepared", "Prepared"], kinds
    # the prefill entries launch through the compiled kernel's runner once it was checked against a normal launch
    from fastnf4.ops.dequantize import kernel as dq_kernel
    assert dq_kernel._RUNNER_CHECKED == [True]
    assert all(p.dq.runner is not None for p in _prepared(q) if type(p).__name__ == "DequantMatmul")


def test_stale_launches_are_never_used():
    torch.manual_seed(2)
    n, k = 2048, 1024
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    q = fastnf4.quantize(w, double_quant=False)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    y0 = fastnf4.linear(x, q)
    # a reassigned field: the absmax doubled gives exactly twice the output
    q.absmax = q.absmax * 2
    assert not _prepared(q)
    y1 = fastnf4.linear(x, q)
    assert torch.equal(y1, _full(x, q)) and not torch.equal(y1, y0)
    # a storage swap behind the same tensor objects (.data): the launch is rebuilt
    other = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, double_quant=False)
    fastnf4.linear(x, q)
    q.packed.data = other.packed.data
    q.absmax.data = other.absmax.data
    y2 = fastnf4.linear(x, q)
    assert torch.equal(y2, _full(x, other)) and torch.equal(y2, _full(x, q))
    # a new bias object
    b1, b2 = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.randn(n, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(fastnf4.linear(x, q, b1), _full(x, q, b1))
    assert torch.equal(fastnf4.linear(x, q, b2), _full(x, q, b2))
    assert torch.equal(fastnf4.linear(x, q), _full(x, q))


def test_unaligned_or_strided_x_and_bad_input():
    torch.manual_seed(3)
    n, k = 2048, 1024
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
    buf = torch.randn(k + 1, device="cuda", dtype=torch.bfloat16)
    x = buf[1:].view(1, k)  # 2 bytes off 16-byte alignment: the full path (which does not take the CUDA kernel)
    assert torch.equal(fastnf4.linear(x, q), _full(x, q))
    assert not _prepared(q)
    xt = torch.randn(k, 2, device="cuda", dtype=torch.bfloat16).T  # not contiguous
    assert torch.equal(fastnf4.linear(xt, q), _full(xt, q))
    fastnf4.linear(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), q)
    with pytest.raises(ValueError, match="K=1024"):
        fastnf4.linear(torch.randn(1, k - 32, device="cuda", dtype=torch.bfloat16), q)
    with pytest.raises(TypeError, match="bias dtype"):
        fastnf4.linear(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), q,
                       torch.randn(n, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="bias must have shape"):
        fastnf4.linear(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), q,
                       torch.randn(n + 1, device="cuda", dtype=torch.bfloat16))


def test_graph_capture_replays_the_fast_path():
    torch.manual_seed(4)
    n, k = 8192, 4096
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    fastnf4.linear(x, q)  # prepared outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fastnf4.linear(x, q)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fastnf4.linear(x, q)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, _full(x, q))


@pytest.mark.parametrize("nested", [False, True])
def test_dequantize_launches_kept_per_weight(nested):
    """Eager dequantize calls (fastnf4.dequantize, the backward of linear, the bitsandbytes patch) launch through a
    launch kept per weight, dtype and device (``dequantize.kernel.launch_cached``): bitwise the normal launch's output,
    one entry per weight and dtype, new bytes in the same tensors seen at once, a new weight at the old one's
    addresses right, an ``out`` off 16-byte alignment through the normal launch."""
    from fastnf4.ops.dequantize import kernel as dq_kernel

    def normal(q, dtype=torch.bfloat16):
        a = linear_args(q)
        out = torch.full((q.numel,), float("nan"), dtype=dtype, device="cuda")
        return dq_kernel.launch(a[0], a[1], a[2], out, a[3], q.numel, a[6], a[7], a[8], a[9]).view(q.shape)

    torch.manual_seed(3)
    q = fastnf4.quantize(torch.randn(3000, 1000, device="cuda", dtype=torch.bfloat16), double_quant=nested)
    before = len(dq_kernel._CACHED)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        assert torch.equal(fastnf4.dequantize(q, dtype=dtype), normal(q, dtype))
    assert len(dq_kernel._CACHED) == before + 2
    q.packed.copy_(torch.randint_like(q.packed, 0, 256))
    assert torch.equal(fastnf4.dequantize(q), normal(q))
    shape, ptr = q.shape, q.packed.data_ptr()
    del q
    q = fastnf4.quantize(torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3, double_quant=nested)
    assert torch.equal(fastnf4.dequantize(q), normal(q)), q.packed.data_ptr() == ptr
    buf = torch.full((q.numel + 1,), float("nan"), dtype=torch.bfloat16, device="cuda")
    fastnf4.dequantize(q, out=buf[1:].view(shape))
    assert torch.equal(buf[1:].view(shape), normal(q))


_COLD = r"""
import sys, torch, fastnf4
m = int(sys.argv[1])
torch.manual_seed(0)
q = fastnf4.quantize(torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16))  # nothing else has run here
x = torch.randn(max(m, 1), 2048, device="cuda", dtype=torch.bfloat16)
out = torch.empty(4096 * 2048, device="cuda", dtype=torch.bfloat16)
torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # cuBLAS's handle, as before any capture
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = fastnf4.linear(x, q) if m else fastnf4.dequantize(q, out=out)
out.fill_(float("nan"))
g.replay()
torch.cuda.synchronize()
if m:
    exact = x.double() @ fastnf4.dequantize(q).double().T
    rel = lambda t: ((t.double() - exact).norm() / exact.norm()).item()
    ref = fastnf4.linear(x, q)
    assert rel(y) <= 1.01 * rel(ref), (rel(y), rel(ref))
else:
    assert torch.equal(y.reshape(-1).view(torch.int16), fastnf4.dequantize(q).reshape(-1).view(torch.int16))
print("ok")
"""


@pytest.mark.parametrize("m", [0, 1, 2, 8])
def test_first_call_inside_a_graph_capture(m):
    """A weight's first fastnf4 call may be inside a CUDA graph capture (fresh process): its code table is on the
    GPU since the NF4Weight was built there (before 22a8dd2 every such call failed on the table's host-to-device
    copy). M = 0 is dequantize(out=). cuBLAS is warmed up first, as PyTorch needs before any capture of a matmul (its
    handle cannot be created inside one; 82c15ba:benchmarks/probe_cold_capture.py shows fastnf4 calls that reach
    cuBLAS failing there without it)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _COLD, str(m)], capture_output=True, text=True, timeout=600)
    errors = [ln for ln in r.stderr.splitlines() if "Error" in ln]
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), errors[:3]
