"""The Hopper prefill kernel (ops/matmul/wgmma.cu) on the GPU.

For M > 32 (x rows per block >= 64) it multiplies by exactly the dequantized weight (float32 code x float32 absmax,
one rounding to the input dtype, as ``dequantize``), so against a float64 product of x and the dequantized weight
its error must match that of cuBLAS on the same weight (accumulation order and output rounding only): ratio within
1.1. The M <= 32 variants (16 / 32 rows per block) multiply by the codes rounded to the input dtype and apply the
absmax to each K step's product in float32 (as gemv_mma.cu's kernels): the issue's budget, within 2x cuBLAS's error
(measured up to 1.7x). Fresh random data, outputs poisoned with NaN first. The shapes cover odd M (partial x tiles, M from 9), N off the 128-row tile,
K = 64 and K = 64 x odd, every x-rows-per-block variant, forced split-K, both dtypes, double quant on and off,
blocksizes 64 to 4096, bias.
"""
import pytest
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import dispatch, wgmma

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _needs_build():
    x = torch.zeros(64, 64, device="cuda", dtype=torch.bfloat16)
    if not wgmma.supports(x, torch.zeros(64, dtype=torch.uint8, device="cuda"), 64, 128, 64):
        pytest.skip("wgmma kernel not available here (needs sm_90 and nvcc)")


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def _budget(m, bm=None):
    """Error allowed relative to cuBLAS on the dequantized weight: exact decode 1.1, rounded codes (BM <= 32) 2."""
    return 2.0 if (bm or wgmma.block_m(m)) <= wgmma.FAST_MAX_BM else 1.1


def _args(q, bias=None):
    """``linear_args(q, bias)`` with the statistics moved, where needed, to a copy whose array ends on a whole copy
    word (``wgmma.stats_fit``, which the dispatcher asks for): the odd shapes still run the kernel, with the
    statistics starting off alignment (the kernel's per-element statistics path)."""
    args = list(linear_args(q, bias))
    absmax, nested = args[1], q.nested_absmax is not None
    if not wgmma.stats_fit(absmax, nested):
        pad = (-absmax.numel() * absmax.element_size()) % (4 if nested else 16) // absmax.element_size()
        buf = torch.empty(absmax.numel() + pad, dtype=absmax.dtype, device=absmax.device)
        buf[pad:] = absmax
        args[1] = buf[pad:]
        assert wgmma.stats_fit(args[1], nested)
    return args


def _check(q, m, dtype, bias, **force):
    n, k = q.shape
    wd = fastnf4.dequantize(q, dtype)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    ref = x.double() @ wd.double().T + (bias.double() if bias is not None else 0)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    wgmma.launch(x, *_args(q, bias), y=y, **force)
    assert torch.isfinite(y).all()
    cublas = torch.nn.functional.linear(x, wd, bias)
    assert _rel(y, ref) <= _budget(m, force.get("bm")) * _rel(cublas, ref)


@pytest.mark.parametrize("n, k", [(200, 64), (1000, 576), (4096, 2048)])
@pytest.mark.parametrize("blocksize", [64, 256, 4096])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_cublas_on_the_dequantized_weight(n, k, blocksize, nested, dtype):
    torch.manual_seed(n + k + blocksize)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                         double_quant=nested)
    for m in (9, 16, 31, 33, 64, 100, 129, 256, 300):
        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
        _check(q, m, dtype, bias)


@pytest.mark.parametrize("bm", wgmma.BLOCK_M)
@pytest.mark.parametrize("splits, full_tiles", [(1, None), (3, None), (3, 1), (2, 2)])
def test_every_variant_and_split_k(bm, splits, full_tiles):
    """Every tile split, or the first full_tiles of the 3 row tiles whole and the others (the tail) split; N = 300
    ends inside the last tile."""
    torch.manual_seed(bm + splits)
    q = fastnf4.quantize(torch.randn(300, 1536, device="cuda", dtype=torch.bfloat16) * 0.05)
    for m in (40, 64, 130, 257):
        _check(q, m, torch.bfloat16, torch.randn(300, device="cuda", dtype=torch.bfloat16), bm=bm, splits=splits,
               full_tiles=full_tiles)


@pytest.mark.parametrize("n, k", [(700, 64 * 66), (2000, 1536), (10240, 1024)])
@pytest.mark.parametrize("blocksize, nested", [(64, True), (64, False), (256, True), (4096, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wide_build(n, k, blocksize, nested, dtype):
    """The BM 128 build of 192 weight rows per block (three warpgroups): within the error budget, forced or split
    (N ending inside a 192-row tile, K without statistics quads, blocksizes 64-4096, nested on / off, bias), and
    with K unsplit the same bits as the 128-row build (each output is the same chain of wgmma steps)."""
    torch.manual_seed(n + k + blocksize)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                         double_quant=nested)
    args = _args(q)  # (kept alive: a Prepared holds addresses only)
    prepared = wgmma.Prepared(*args)
    if prepared.lib.ready[(wgmma._DTYPES[dtype], wgmma.WIDE_BM, int(nested), wgmma.ROWS_WIDE)] == 0:
        pytest.skip("the wide build cannot run on this GPU")
    for m in (65, 100, 128):
        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
        for splits, full in ((None, None), (1, None), (3, None), (3, 1)):
            _check(q, m, dtype, bias, rows=wgmma.ROWS_WIDE, splits=splits, full_tiles=full)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        ys = []
        for rows in (wgmma.ROWS, wgmma.ROWS_WIDE):
            y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            prepared(x, bias, y=y, splits=1, rows=rows)
            ys.append(y)
        assert torch.isfinite(ys[0]).all() and torch.equal(ys[0], ys[1])
    # the default takes it by N at BM 128 only; forcing it elsewhere is an error
    assert prepared.launch_plan(128, dtype)[5] == (wgmma.ROWS_WIDE if wgmma.wide_wanted(n, k) else wgmma.ROWS)
    assert prepared.launch_plan(200, dtype)[5] == wgmma.ROWS  # BM 256
    with pytest.raises(ValueError, match="rows"):
        prepared(torch.randn(64, k, device="cuda", dtype=dtype), rows=wgmma.ROWS_WIDE)  # BM 64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tail_plan_matches_and_replays_equal(dtype):
    """Gemma gate+up at M = 128 takes the tail plan on an H100 / H200 (132 SMs: 132 tiles whole, 36 in 3 parts)."""
    torch.manual_seed(3)
    n, k, m = 21504, 5376, 128
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.02)
    args = _args(q)  # (kept alive: a Prepared holds addresses only)
    prepared = wgmma.Prepared(*args)
    s, per, full = wgmma.plan(m, n, k, prepared.lib.sms, 128, 1)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert (s, per, full) == (3, 28, 132)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    _check(q, m, dtype, bias)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    y1 = prepared(x, bias)
    y2 = prepared(x, bias, splits=1)  # no split: differs only in the tail's summation order
    assert torch.equal(y1[:, : full * 128], y2[:, : full * 128])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = prepared(x, bias)
    g.replay()
    assert torch.equal(yg, y1)


@pytest.mark.parametrize("cluster", [False, True])
def test_split_sums_back_to_back_in_a_graph(cluster):
    """The split-K sum kernel is the wgmma grid's programmatic dependent (scheduled early, waits for the grid in
    splitk_sum): back to back in one graph, where consecutive calls reuse the partial-sum workspace, every call's
    sum must see its own grid's partials (and with the cluster sum, every cluster its own parts). Fresh x per call,
    outputs poisoned, each equal to the same call made alone."""
    torch.manual_seed(5)
    n, k, m = 1000, 2048, 32
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
    args = _args(q)  # (kept alive: a Prepared holds addresses only)
    prepared = wgmma.Prepared(*args)
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(6)]
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    alone = [prepared(x, bias, splits=4, cluster=cluster) for x in xs]
    ys = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in xs]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for x, y in zip(xs, ys):
            prepared(x, bias, y=y, splits=4, cluster=cluster)
    g.replay()
    torch.cuda.synchronize()
    for y, a in zip(ys, alone):
        assert torch.equal(y, a)
    _check(q, m, torch.bfloat16, bias, splits=4, cluster=cluster)


@pytest.mark.parametrize("bm", [b for b in wgmma.BLOCK_M if b <= wgmma.CLUSTER_MAX_BM])
@pytest.mark.parametrize("splits", [2, 3, 7, 8])
@pytest.mark.parametrize("nested, dtype", [(True, torch.bfloat16), (False, torch.float16)])
def test_cluster_split_sum_equals_the_sum_kernel(bm, splits, nested, dtype):
    """Split-K summed by thread block clusters (each part leaves its float32 tile in its shared memory; each block
    of the cluster adds a share of the tile over all parts, in split order) gives the same bits as the second
    kernel's sum of the float32 partials in global memory. K = 66 steps (no statistics quads), N = 300 ends inside
    the last row tile, M inside one x tile and over two (a cluster per (x tile, weight tile)), bias or none; fresh
    data, outputs poisoned; and the error against float64 within the budget."""
    torch.manual_seed(bm * 10 + splits)
    n, k = 300, 64 * 66
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, double_quant=nested)
    args = _args(q)  # (kept alive: a Prepared holds addresses only)
    prepared = wgmma.Prepared(*args)
    for m in (max(1, bm - 3), bm + 5):
        assert prepared.launch_plan(m, dtype, bm=bm, splits=splits, cluster=True)[1:] == (splits, -(-66 // splits),
                                                                                         0, True, wgmma.ROWS)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
        ys = []
        for cluster in (True, False):
            y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            prepared(x, bias, y=y, bm=bm, splits=splits, cluster=cluster)
            ys.append(y)
        assert torch.isfinite(ys[0]).all() and torch.equal(ys[0], ys[1])
        _check(q, m, dtype, bias, bm=bm, splits=splits, cluster=True)


def test_cluster_sum_only_where_it_applies():
    """The cluster sum needs every tile split in 2..8 parts at BM <= 64: forcing it elsewhere (no split, whole tiles
    first, BM 128) is an error, not a wrong result; the default takes it only where all the clusters are resident at
    once."""
    q = fastnf4.quantize(torch.randn(300, 1536, device="cuda", dtype=torch.bfloat16) * 0.05)
    args = _args(q)  # (kept alive: a Prepared holds addresses only)
    prepared = wgmma.Prepared(*args)
    x = torch.randn(40, 1536, device="cuda", dtype=torch.bfloat16)
    for force in (dict(splits=1), dict(splits=3, full_tiles=1), dict(bm=128, splits=3)):
        with pytest.raises(ValueError, match="cluster"):
            prepared(x, cluster=True, **force)
    for m in (8, 16, 32, 64):
        bm, s, per, full, cluster, _ = prepared.launch_plan(m, torch.bfloat16)
        clusters = prepared.lib.clusters.get((0, bm, int(prepared.nested), s), 0)
        assert cluster == (full == 0 and 2 <= s <= 8 and bm <= 64 and -(-m // bm) * 3 <= clusters)


def test_dispatch_takes_it_and_graph_replays_equal():
    torch.manual_seed(1)
    q = fastnf4.quantize(torch.randn(8192, 5120, device="cuda", dtype=torch.bfloat16) * 0.02)
    x = torch.randn(64, 5120, device="cuda", dtype=torch.bfloat16)
    assert dispatch.pick_path(x, q.packed_u8, 64, 8192, 5120, True, 256) == "wgmma"
    y = fastnf4.linear(x, q)
    ref = x.double() @ fastnf4.dequantize(q).double().T
    assert _rel(y, ref) <= 1.1 * _rel(x @ fastnf4.dequantize(q).T, ref)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = fastnf4.linear(x, q)
    x.copy_(torch.randn_like(x))
    g.replay()
    assert torch.equal(yg, fastnf4.linear(x, q))  # split-K partials are added in a fixed order: bitwise repeatable


def test_unsupported_shapes_fall_back():
    x = torch.zeros(64, 96, device="cuda", dtype=torch.bfloat16)
    packed = torch.zeros(64 * 48, dtype=torch.uint8, device="cuda")
    assert not wgmma.supports(x, packed, 64, 64, 96)  # K not a multiple of 64
    x = torch.zeros(64, 128, device="cuda", dtype=torch.bfloat16)
    assert not wgmma.supports(x, packed, 32, 64, 128)  # blocksize 32
    assert not wgmma.supports(x.float(), packed, 64, 64, 128)  # fp32 x
    q = fastnf4.quantize(torch.randn(4096, 96, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ fastnf4.dequantize(q).double().T
    assert _rel(fastnf4.linear(x, q), ref) < 1e-2
    # statistics that do not end on a whole copy word (300 x 2112 / 128 = 4950 codes; 17 x 192 / 64 = 51 floats):
    # refused (the kernel would read the last word past the array), so the other paths run, and correctly
    for n, k, blocksize, nested in ((300, 2112, 128, True), (17, 192, 64, False)):
        q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), blocksize=blocksize,
                             double_quant=nested)
        x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        assert not wgmma.stats_fit(q.absmax, nested)
        assert not wgmma.supports(x, q.packed_u8, blocksize, n, k, nested)
        assert not wgmma.supports(x, q.packed_u8, blocksize, n, k, nested, 256, q.absmax)
        assert dispatch.pick_path(x, q.packed_u8, blocksize, n, k, nested, 256, absmax=q.absmax) != "wgmma"
        with pytest.raises(ValueError, match="statistics array"):
            wgmma.launch(x, *linear_args(q))
        ref = x.double() @ fastnf4.dequantize(q).double().T
        assert _rel(fastnf4.linear(x, q), ref) < 1e-2
