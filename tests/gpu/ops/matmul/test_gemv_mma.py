"""The CUDA tensor-core decode kernel (ops/matmul/gemv_mma.cu) on the GPU.

Two references, both computed here in float64 from the quantized weight:
* the dequantized weight (what the issue's error budget is stated against): relative Frobenius error at most
  2x that of cuBLAS on the same dequantized weight, on shapes with enough outputs for the ratio to be stable;
* the kernels' own arithmetic model, for every shape including tiny ones: for the tensor-core kernels codes
  rounded to the input dtype (the table), multiplied by x exactly, scaled by the float32 absmax of their block;
  for the small-weight kernel the same with the float32 codes.
  Agreement to float32 accumulation error proves the fragment layouts, the chunk/block bookkeeping, the
  tails and split-K.
"""
import pytest
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.codebooks import kernel_code
from fastnf4.ops.dequantize.naive import decode_absmax, unpack_nibbles
from fastnf4.ops.matmul import dispatch, gemv_mma

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _repeatable_under_graphs(x, q):
    """fastnf4.linear(x, q): the same bits on a second call and from a captured graph's replay (its output poisoned
    with NaN first); returns the first call's output."""
    y = fastnf4.linear(x, q)
    assert torch.equal(y, fastnf4.linear(x, q))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = fastnf4.linear(x, q)
    yg.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y)
    return y


def _model(q, x, bias):
    """float64 y of the kernels' arithmetic: dtype-rounded code values times float32 absmax."""
    n, k = q.shape
    codes = unpack_nibbles(q.packed_u8.flatten(), n * k)
    table = kernel_code(q.quant_type, q.device).to(x.dtype).double()
    absmax = decode_absmax(q.absmax, q.nested_code, q.nested_absmax, q.offset, q.nested_blocksize).double()
    w = table[codes] * absmax.repeat_interleave(q.blocksize)[: n * k]
    y = x.double() @ w.view(n, k).T
    return y + bias.double() if bias is not None else y


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.fixture(autouse=True)
def _needs_build():
    x = torch.zeros(1, 32, device="cuda", dtype=torch.bfloat16)
    if not gemv_mma.supports(x, torch.zeros(16, dtype=torch.uint8, device="cuda"), 64, 1, 32):
        pytest.skip("gemv_mma not built here (no nvcc or FASTNF4_CUDA=0)")


# (17, 192): K % 64 == 0 (statistics copied a phase ahead) and a statistics array that ends inside a 4-byte word
@pytest.mark.parametrize("n, k", [(17, 96), (17, 192), (40, 32), (1000, 4128), (3000, 5376)])
@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matches_arithmetic_model(n, k, blocksize, nested, dtype):
    torch.manual_seed(n + k + blocksize)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                         double_quant=nested)
    slices = -(-k // 128)
    for m in (1, 3, 5, 8, 16, 21, 32):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
        ref = _model(q, x, bias)
        kernels = [gemv_mma.variant(m)] + ([gemv_mma.DECODE_WIDE] if m <= 2 else [])
        if m <= 4 and blocksize >= 64 and k % 64 == 0:  # the pair-column decode kernels
            kernels += [gemv_mma.PAIR, gemv_mma.PAIR_WIDE]
        for kernel in kernels:
            for splits in (None, (1, slices), (3, -(-slices // 3)), (11, -(-slices // 11))):  # 11: sums of > 8 partials
                y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                gemv_mma.launch(x, *linear_args(q, bias), y=y, splits=splits, kernel=kernel)
                # float32 accumulation then one rounding to the output dtype
                tol = (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10) * ref.abs() + 1e-4 * ref.abs().max()
                assert torch.isfinite(y).all()
                assert ((y.double() - ref).abs() <= tol).all(), (m, splits, kernel)


@pytest.mark.parametrize("n, k", [(1000, 4128), (3000, 5376), (4096, 4096)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 12, 16, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_error_budget_against_cublas(n, k, m, dtype):
    torch.manual_seed(n * m)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.02, blocksize=64, double_quant=True)
    wd = fastnf4.dequantize(q)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    ref = x.double() @ wd.double().T
    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    gemv_mma.launch(x, *linear_args(q), y=y)
    assert _rel(y, ref) <= 2 * _rel(x @ wd.T, ref)


def test_dispatch_graph_capture_and_split_k_determinism():
    q = fastnf4.quantize(torch.randn(1024, 8192, device="cuda", dtype=torch.bfloat16) * 0.02)
    x = torch.randn(1, 8192, device="cuda", dtype=torch.bfloat16)
    n, k = q.shape
    assert gemv_mma.plan(1, n, k, 132 * 16)[0] > 1  # this shape takes split-K
    y = _repeatable_under_graphs(x, q)  # fixed-order split-K sums: bitwise repeatable
    ref = x.double() @ fastnf4.dequantize(q).double().T
    assert _rel(y, ref) < 1e-2


def test_dispatcher_uses_it_for_decode_sizes():
    q = fastnf4.quantize(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16))
    for m in range(1, dispatch.MMA_MAX_M + 1):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        assert gemv_mma.supports(x, q.packed_u8, q.blocksize, *q.shape)


@pytest.mark.parametrize("blocksize", [64, 128, 1024])
@pytest.mark.parametrize("nested", [False, True])
def test_many_items_per_worker_and_short_phases(blocksize, nested):
    # 2500 row tiles x up to 12 splits: every warp (decode kernel) or block (GEMM kernel) runs many work items,
    # so split-K partial sums are settled for many items at the kernel's end, and statistics phases of 1-6
    # slices hand over from one item to the next (the copies of the next phase land 1..kStages steps later)
    torch.manual_seed(blocksize + nested)
    n, k = 40000, 1536
    dtype = torch.bfloat16
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                         double_quant=nested)
    for m in (1, 8):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        ref = _model(q, x, None)
        tol = 2.0 ** -7 * ref.abs() + 1e-4 * ref.abs().max()
        # (M = 1 takes the 20-warp decode kernel for this size; the 16-warp one is asked for explicitly)
        for kernel in (None, gemv_mma.variant(m)) if m == 1 else (None,):
            for splits in (None, (12, 1), (4, 3), (3, 5), (2, 6)):
                y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                gemv_mma.launch(x, *linear_args(q), y=y, splits=splits, kernel=kernel)
                assert ((y.double() - ref).abs() <= tol).all(), (m, splits, kernel)
                # the split-K counters were all reset: the same launch again gives the same bits
                y2 = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                gemv_mma.launch(x, *linear_args(q), y=y2, splits=splits, kernel=kernel)
                assert torch.equal(y, y2), (m, splits, kernel)


@pytest.mark.parametrize("n, k", [(1000, 4128), (3000, 5376), (40000, 1536)])
@pytest.mark.parametrize("nested, dtype", [(True, torch.bfloat16), (False, torch.float16)])
def test_block_local_split_k_equals_the_global_settle(n, k, nested, dtype):
    """The decode kernel's block-local split-K (a tile's S parts on S warps of one block, or of a cluster of 2 or 3
    blocks that read each other's partials over distributed shared memory, added after a block / cluster barrier)
    gives the bits of the global settle (float32 partials in global memory, summed by the last arrival) for the same
    plan: both add the parts in split order. S that divide the block's warps and S that do not, parts on two blocks
    of a cluster (S = 24 > 20 warps), many rounds per warp (40000 rows), M = 1 and 2, both decode kernels (16 and 20
    warps), bias or none; the pair-column decode kernels (two holes per item) at M 1-4 where K % 64 == 0; fresh data,
    outputs poisoned; and the arithmetic model holds, also for the default plan and in a graph."""
    torch.manual_seed(n + k)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=64, double_quant=nested)
    slices = -(-k // 128)
    pair = (gemv_mma.PAIR, gemv_mma.PAIR_WIDE) if k % 64 == 0 else ()
    for m in (1, 2, 3, 4):
        kernels = ((gemv_mma.DECODE, gemv_mma.DECODE_WIDE) if m <= 2 else ()) + pair
        if not kernels:
            continue
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
        ref = _model(q, x, bias)
        tol = (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10) * ref.abs() + 1e-4 * ref.abs().max()
        for kernel in kernels:
            for s, lc in ((2, 1), (3, 1), (5, 1), (8, 1), (3, 2), (12, 2), (24, 2), (3, 3), (6, 3), (24, 3)):
                per = -(-slices // s)
                if -(-slices // per) != s or per < 1:
                    continue
                ys = []
                for local in (True, False):
                    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                    try:
                        gemv_mma.launch(x, *linear_args(q, bias), y=y, splits=(s, per), kernel=kernel, local=local,
                                        local_cluster=lc if local else None)
                    except ValueError as e:  # too many rounds for the partial-sum slots (40000 rows, few parts)
                        assert local and "block-local" in str(e)
                        break
                    ys.append(y)
                if len(ys) < 2:
                    continue
                assert torch.isfinite(ys[0]).all() and torch.equal(ys[0], ys[1]), (m, kernel, s, lc)
                assert ((ys[0].double() - ref).abs() <= tol).all(), (m, kernel, s, lc)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        gemv_mma.launch(x, *linear_args(q, bias), y=y, kernel=kernels[0])
        assert ((y.double() - ref).abs() <= tol).all()
        prepared = gemv_mma.Prepared(x, *linear_args(q, bias), splits=(2, -(-slices // 2)), kernel=kernels[0],
                                     local=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = prepared(x)
        yg.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg, prepared(x)) and ((yg.double() - ref).abs() <= tol).all()


@pytest.mark.parametrize("n, k", [(17, 128), (17, 96), (1000, 4096), (1000, 4128), (3000, 5376), (700, 8192),
                                  (300, 11392)])
def test_staged_x_gives_the_bits_of_x_in_registers(n, k):
    """The decode kernels' staged x (x copied once per block into the table's top holes, gemv_mma.x_holes) gives
    the bits of the register path (x loaded one slice ahead, ``stage_x=False``) for the same plan: M = 1 and 2, both
    decode kernels, block-local and global split-K and none; K not a multiple of the slice (96, 4128) and x too large
    to stage whole (M = 2 at K = 8192, M = 1 at K = 11392) take the register path, or, with a global split-K of one
    item per warp, x staged split-major (its own test below). Fresh data, outputs poisoned, and the arithmetic model
    holds."""
    torch.manual_seed(n + k)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, blocksize=64)
    slices = -(-k // 128)
    for m in (1, 2):
        staged = gemv_mma.x_holes(m, k)
        assert (staged > 0) == (k % 128 == 0 and 2 * m * slices <= gemv_mma.X_HOLES_MAX)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = _model(q, x, None)
        tol = 2.0 ** -7 * ref.abs() + 1e-4 * ref.abs().max()
        for kernel in (gemv_mma.DECODE, gemv_mma.DECODE_WIDE):
            for splits, local in ((None, None), ((1, slices), None), ((3, -(-slices // 3)), False),
                                  ((3, -(-slices // 3)), True)):
                if splits and -(-slices // splits[1]) != splits[0]:
                    continue
                ys = []
                for xs in (True, False):
                    p = gemv_mma.Prepared(x, *linear_args(q), splits=splits, kernel=kernel, local=local, stage_x=xs)
                    if xs and p.params.gsplit:  # (x too large to stage whole, staged split-major instead)
                        assert staged == 0 and p.params.xs > 0
                    else:
                        assert p.params.gsplit == 0 and p.params.xs == (staged if xs else 0)
                    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    ys.append(p(x, y))
                assert torch.isfinite(ys[0]).all() and torch.equal(ys[0], ys[1]), (m, kernel, splits, local)
                assert ((ys[0].double() - ref).abs() <= tol).all(), (m, kernel, splits, local)


@pytest.mark.parametrize("n, k", [(1000, 16384), (700, 12288)])
def test_split_major_clusters_stage_their_part_of_x(n, k):
    """Split-major cluster plans (each block of a cluster of two or three holds whole splits and stages only their
    part of x, for x too large to stage whole) give the bits of the global settle for the same plan, at M = 1 and 2,
    both decode kernels (clusters of 2: 16 warps S = 4 / 8, 20 warps S = 4 / 8 / 10; of 3: 16 warps S = 6 / 12, 20
    warps S = 6 / 12 / 15); each decode kernel's default plan of such a weight is checked against the arithmetic
    model. Fresh data, outputs poisoned."""
    torch.manual_seed(n + k)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, blocksize=64, double_quant=True)
    slices = k // 128
    tried = 0  # plans run with staged x
    for m in (1, 2):
        assert gemv_mma.x_holes(m, k) == 0 and gemv_mma.split_stage_m(m, k) == m  # not staged whole
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = _model(q, x, None)
        tol = 2.0 ** -7 * ref.abs() + 1e-4 * ref.abs().max()
        for kernel, warps in ((gemv_mma.DECODE, 16), (gemv_mma.DECODE_WIDE, 20)):
            for lc, s in ((2, 4), (2, 8), (2, 10), (3, 6), (3, 12), (3, 15)):
                per = -(-slices // s)
                tpb = lc * warps // s
                if -(-slices // per) != s or tpb * s != lc * warps or warps % tpb:
                    continue
                p = gemv_mma.Prepared(x, *linear_args(q), splits=(s, per), kernel=kernel, local=True, local_cluster=lc,
                                      local_split=True)
                staged = p.params.xs
                assert p.params.lsplit == 1 and (staged == 0 or staged == m * 2 * (warps // tpb) * per)
                y = p(x, torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16))
                yg = gemv_mma.launch(x, *linear_args(q), y=torch.full((m, n), float("nan"), device="cuda",
                                                                       dtype=torch.bfloat16),
                                     splits=(s, per), kernel=kernel, local=False)
                assert torch.isfinite(y).all() and torch.equal(y, yg), (m, kernel, lc, s)
                assert ((y.double() - ref).abs() <= tol).all(), (m, kernel, lc, s)
                tried += staged > 0
        for kernel in (gemv_mma.DECODE, gemv_mma.DECODE_WIDE):  # each decode kernel's own plan (by size these take gemv_split)
            y = gemv_mma.launch(x, *linear_args(q), y=torch.full((m, n), float("nan"), device="cuda",
                                                                   dtype=torch.bfloat16), kernel=kernel)
            assert ((y.double() - ref).abs() <= tol).all(), (m, kernel)
    assert tried >= 10  # (M = 1 fits on both shapes; M = 2 at K = 16384 does not)


@pytest.mark.parametrize("n, k", [(1000, 16384), (700, 12288), (100, 16384)])
def test_split_major_global_plans_stage_their_part_of_x(n, k):
    """Global split-K plans of one item per warp for x too large to stage whole take the items split-major
    (gemv_mma.cu Params.gsplit), each block staging only the splits its warps take (two, or more where the tiles
    are fewer than a block's warps: 100 rows): the bits of the same plan with x in registers (``stage_x=False``), at
    M = 1 and 2, both decode kernels; fresh data, outputs poisoned, and the arithmetic model holds."""
    torch.manual_seed(n + k)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, blocksize=64, double_quant=True)
    slices, tiles = k // 128, -(-n // 16)
    tried = 0
    for m in (1, 2):
        assert gemv_mma.x_holes(m, k) == 0
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = _model(q, x, None)
        tol = 2.0 ** -7 * ref.abs() + 1e-4 * ref.abs().max()
        for kernel, warps in ((gemv_mma.DECODE, 16), (gemv_mma.DECODE_WIDE, 20)):
            for s in (2, 4, 8, 12):
                per = -(-slices // s)
                if -(-slices // per) != s:
                    continue
                ys = []
                for gs in (True, False):
                    p = gemv_mma.Prepared(x, *linear_args(q), splits=(s, per), kernel=kernel, local=False, stage_x=gs)
                    span = min(s, 1 + -(-(warps - 1) // tiles))
                    want = gs and m * 2 * span * per <= gemv_mma.LOCAL_HOLES
                    assert p.params.gsplit == int(want) and p.params.xs == (m * 2 * span * per if want else 0)
                    ys.append(p(x, torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)))
                    tried += want
                assert torch.isfinite(ys[0]).all() and torch.equal(ys[0], ys[1]), (m, kernel, s)
                assert ((ys[0].double() - ref).abs() <= tol).all(), (m, kernel, s)
    assert tried >= 6


def test_block_local_split_k_refuses_what_it_cannot_do():
    """Forcing the block-local split-K where it does not apply is an error that names it, not a wrong result: the
    GEMM kernel (M > 2), more parts than the block has warps, more rounds than its partial-sum slots."""
    q = fastnf4.quantize(torch.randn(40000, 1536, device="cuda", dtype=torch.bfloat16) * 0.05)
    for m, splits in ((4, (2, 6)), (1, (24, 1))):
        x = torch.randn(m, 1536, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="block-local"):
            gemv_mma.launch(x, *linear_args(q), splits=splits, kernel=gemv_mma.variant(m) if m > 2 else gemv_mma.DECODE,
                            local=True)
    big = fastnf4.quantize(torch.randn(524288, 256, device="cuda", dtype=torch.bfloat16) * 0.05)
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="block-local"):  # 32768 tiles: > 16 rounds of 8 per block below 256 SMs
        gemv_mma.launch(x, *linear_args(big), splits=(2, 1), kernel=gemv_mma.DECODE, local=True)


def test_forced_kernels_refuse_what_they_do_not_cover():
    """A forced kernel variant never leaves rows of y unwritten or mixes blocks into one absmax: the decode kernels
    take M <= 2, the pair-column ones M <= 4 with blocksize >= 64 and K % 64 == 0, the GEMM kernels M <= 8 / 16 / 32;
    anything else is an error that says so, and y keeps its poison."""
    q = fastnf4.quantize(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) * 0.05)
    for m, kernel in ((3, gemv_mma.DECODE), (3, gemv_mma.DECODE_WIDE), (9, "gemm_m8"), (17, "gemm_m16"),
                      (5, gemv_mma.PAIR), (5, gemv_mma.PAIR_WIDE)):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        y = torch.full((m, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
        with pytest.raises((RuntimeError, ValueError), match="gemv_mma"):
            gemv_mma.launch(x, *linear_args(q), y=y, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.isnan(y).all(), (m, kernel)
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    for bad in (fastnf4.quantize(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), blocksize=32),
                fastnf4.quantize(torch.randn(256, 480, device="cuda", dtype=torch.bfloat16))):
        xb = x[:, : bad.shape[1]].contiguous()
        with pytest.raises(ValueError, match="pair-column"):
            gemv_mma.launch(xb, *linear_args(bad), kernel=gemv_mma.PAIR)
        assert not gemv_mma.pair_wanted(4, bad.shape[0], bad.shape[1], bad.blocksize)


@pytest.mark.parametrize("nested, shift", [(True, 1), (True, 4), (True, 8), (False, 4), (False, 8)])
def test_unaligned_statistics(nested, shift):
    # absmax (8-bit codes, or float32 without double quant) at an address that is not 16-byte aligned (a view into a
    # larger buffer): the kernel must not copy them with 16-byte cp.async (it stages them synchronously instead) and
    # must give the same result
    torch.manual_seed(3 + shift + nested)
    n, k = 3000, 4096
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, double_quant=nested)
    args = list(linear_args(q))
    absmax = args[1]
    assert absmax.dtype == (torch.uint8 if nested else torch.float32)
    step = absmax.element_size()
    buf = torch.empty(absmax.numel() + shift // step, dtype=absmax.dtype, device="cuda")
    buf[shift // step:] = absmax
    args[1] = buf[shift // step:]
    assert args[1].data_ptr() % 16 == shift
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    for kernel in (gemv_mma.DECODE, gemv_mma.DECODE_WIDE):  # (the decode kernels, named: the dispatcher's pick here is the burst one)
        y = gemv_mma.launch(x, *linear_args(q), kernel=kernel)
        yu = gemv_mma.launch(x, *args, kernel=kernel)
        assert torch.equal(y, yu), kernel
    # the burst kernel reads a row's absmax codes as aligned words: off 4-byte alignment the dispatcher keeps the
    # decode kernel, and a forced burst launch is refused
    assert gemv_mma.Prepared(x, *linear_args(q)).v == gemv_mma.BURST
    assert (gemv_mma.Prepared(x, *args).v == gemv_mma.BURST) == (args[1].data_ptr() % 4 == 0)
    if args[1].data_ptr() % 4:
        with pytest.raises(ValueError, match="burst"):
            gemv_mma.launch(x, *args, kernel=gemv_mma.BURST)


def _model_exact(q, x, bias):
    """float64 y with the float32 code values (not rounded to the input dtype): the small-weight kernel's model."""
    n, k = q.shape
    codes = unpack_nibbles(q.packed_u8.flatten(), n * k)
    table = kernel_code(q.quant_type, q.device).double()
    absmax = decode_absmax(q.absmax, q.nested_code, q.nested_absmax, q.offset, q.nested_blocksize).double()
    w = table[codes] * absmax.repeat_interleave(q.blocksize)[: n * k]
    y = x.double() @ w.view(n, k).T
    return y + bias.double() if bias is not None else y


@pytest.mark.parametrize("n, k", [(17, 96), (40, 32), (1000, 4128), (3000, 5376), (300, 16384)])
@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", [gemv_mma.SMALL, gemv_mma.SPLIT])
def test_small_weight_kernel_matches_model(n, k, blocksize, nested, dtype, kernel):
    torch.manual_seed(n + k + blocksize + 1)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                         double_quant=nested)
    for m in (1, 2, 3):
        if m == 3:  # (both take M <= 2 only)
            with pytest.raises(ValueError, match="small-weight kernel"):
                gemv_mma.launch(torch.randn(m, k, device="cuda", dtype=dtype), *linear_args(q), kernel=kernel)
            continue
        if not gemv_mma.small_fits(m, k, 2):
            with pytest.raises(ValueError, match="small-weight kernel"):
                gemv_mma.launch(torch.randn(m, k, device="cuda", dtype=dtype), *linear_args(q), kernel=kernel)
            continue
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if (m + n) % 2 else None
        ref = _model_exact(q, x, bias)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        gemv_mma.launch(x, *linear_args(q, bias), y=y, kernel=kernel)
        tol = (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10) * ref.abs() + 1e-4 * ref.abs().max()
        assert torch.isfinite(y).all()
        assert ((y.double() - ref).abs() <= tol).all(), m


@pytest.mark.parametrize("n, k", [(1000, 4128), (3000, 5376), (4096, 4096), (1024, 8192)])
@pytest.mark.parametrize("m, kernel", [(1, gemv_mma.SMALL), (2, gemv_mma.SMALL), (1, gemv_mma.SPLIT),
                                      (2, gemv_mma.SPLIT)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_small_weight_kernel_error_budget(n, k, m, kernel, dtype):
    torch.manual_seed(n * m + 7)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.02, blocksize=64, double_quant=True)
    wd = fastnf4.dequantize(q)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    ref = x.double() @ wd.double().T
    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    gemv_mma.launch(x, *linear_args(q), y=y, kernel=kernel)
    assert _rel(y, ref) <= 2 * _rel(x @ wd.T, ref)


# the burst decode kernel: K % 256 == 0, blocksize >= 64, M <= 2, M K <= 16384
@pytest.mark.parametrize("n, k", [(17, 256), (40, 1280), (1000, 4096), (3000, 5376), (2048, 8192)])
@pytest.mark.parametrize("blocksize", [64, 128, 256, 4096])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_burst_kernel_matches_arithmetic_model(n, k, blocksize, nested, dtype):
    torch.manual_seed(n + k + blocksize + nested)
    q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) * 0.05, blocksize=blocksize,
                         double_quant=nested)
    absmax = q.absmax
    if not gemv_mma.words_fit(absmax):
        # an odd count of 8-bit codes (17 x 256 / 128, 3000 x 5376 / 4096, ...): the kernel reads whole words, so the
        # last would lie partly past the array (compute-sanitizer: tools/sanitize.py). Refused, and never the
        # dispatcher's pick; the kernel is checked with the codes padded to whole words (the padding is never used)
        assert nested
        x = torch.randn(1, k, device="cuda", dtype=dtype)
        with pytest.raises(ValueError, match="burst"):
            gemv_mma.launch(x, *linear_args(q), kernel=gemv_mma.BURST)
        assert gemv_mma.Prepared(x, *linear_args(q)).v != gemv_mma.BURST
        absmax = torch.cat([absmax, absmax.new_zeros(-absmax.numel() % 4)])
    for m in (1, 2):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if m == 1 else None
        ref = _model(q, x, bias)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        args = list(linear_args(q, bias))
        args[1] = absmax
        gemv_mma.launch(x, *args, y=y, kernel=gemv_mma.BURST)
        tol = (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10) * ref.abs() + 1e-4 * ref.abs().max()
        assert torch.isfinite(y).all()
        assert ((y.double() - ref).abs() <= tol).all(), m


def test_burst_kernel_many_tiles_per_block_and_the_dispatch():
    """2500 row tiles on the resident blocks: every block takes many tiles in turn (rounds loaded two ahead cross tile
    boundaries, the row-sum buffers alternate); and the dispatcher's pick for a Gemma-o-size weight at M = 1 and 2, its
    bits repeatable and the same under CUDA-graph capture, within the error budget."""
    torch.manual_seed(28)
    q = fastnf4.quantize(torch.randn(40000, 1024, device="cuda", dtype=torch.bfloat16) * 0.05)
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    ref = _model(q, x, None)
    y = torch.full((2, 40000), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemv_mma.launch(x, *linear_args(q), y=y, kernel=gemv_mma.BURST)
    assert ((y.double() - ref).abs() <= 2.0 ** -7 * ref.abs() + 1e-4 * ref.abs().max()).all()

    q = fastnf4.quantize(torch.randn(5376, 4096, device="cuda", dtype=torch.bfloat16) * 0.02)
    wd = fastnf4.dequantize(q)
    for m in (1, 2):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        assert gemv_mma.burst_wanted(m, 5376, 4096, q.blocksize)
        assert gemv_mma.Prepared(x, *linear_args(q)).v == gemv_mma.BURST
        y = _repeatable_under_graphs(x, q)
        ref = x.double() @ wd.double().T
        assert _rel(y, ref) <= 2 * _rel(x @ wd.T, ref)


def test_burst_kernel_refuses_what_it_does_not_cover():
    """Forced where its layout does not hold (K % 256 != 0, blocksize 32, M > 2, x too long for the holes): an error
    that names it, y untouched."""
    cases = ((1, 384, 64), (1, 512, 32), (3, 512, 64), (2, 16384, 64))
    for m, k, bs in cases:
        q = fastnf4.quantize(torch.randn(64, k, device="cuda", dtype=torch.bfloat16) * 0.05, blocksize=bs)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.full((m, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="burst"):
            gemv_mma.launch(x, *linear_args(q), y=y, kernel=gemv_mma.BURST)
        torch.cuda.synchronize()
        assert torch.isnan(y).all(), (m, k, bs)
