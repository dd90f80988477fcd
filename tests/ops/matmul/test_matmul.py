"""fastnf4.linear: every kernel path (GEMV, tensor-core GEMM, dequantize + matmul) against a float64
reference, with the error bound of the issue: at most 2x the error of a dense matmul on the dequantized
weight in the same dtype. On CPU the Triton kernels run in the interpreter, on small shapes."""
import shutil

import pytest
import torch

import fastnf4
from fastnf4 import _triton
from fastnf4.api import linear_args
from fastnf4.codebooks import kernel_code
from fastnf4.ops.matmul import dispatch, gemv_mma
from helpers import rel_err

PATHS = ["gemv", "gemm", "dequant+matmul"]


def run_path(x, q, bias, path):
    return dispatch.linear_triton(x, *linear_args(q, bias), path=path, manual_bf16=_triton.interpreter_enabled())


needs_triton = pytest.mark.skipif(not _triton.use_triton(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")


@needs_triton
@pytest.mark.parametrize("path, m", [(p, m) for p in PATHS for m in (1, 3, 17) if not (p == "gemv" and m > 4)])
@pytest.mark.parametrize("n, k, blocksize, nested", [
    (64, 256, 64, True), (72, 192, 64, False),  # N not a multiple of the tile, K not a multiple of 128
    (40, 128, 4096, True), (48, 96, 32, False),  # blocks spanning rows; odd group counts
])
def test_paths_match_reference(path, m, n, k, blocksize, nested, rng):
    w = torch.randn(n, k, generator=rng) * 0.05
    q = fastnf4.quantize(w.to(torch.bfloat16), blocksize=blocksize, double_quant=nested)
    x = torch.randn(m, k, generator=rng).to(torch.bfloat16)
    bias = (torch.randn(n, generator=rng) * 0.1).to(torch.bfloat16)
    wd = fastnf4.dequantize(q)  # bf16, exactly what cuBLAS would be given
    ref = x.double() @ wd.double().T + bias.double()
    yardstick = rel_err(torch.nn.functional.linear(x, wd, bias), ref)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    y.copy_(run_path(x, q, bias, path))
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) <= 2 * yardstick, (rel_err(y, ref), yardstick)


@needs_triton
@pytest.mark.parametrize("seed", range(3))
def test_random_shapes_every_path(seed):
    """Random small shapes (seeded; N and K any, also odd; blocksizes 32-4096; nested on / off; bf16 / fp16 / fp32;
    bias or none) through each Triton path the shape allows and ``fastnf4.linear``'s own pick: within 2x the error of
    a matmul on the dequantized weight, the output poisoned first. The GPU has its own, larger fuzz test
    (tests/gpu/ops/matmul/test_fuzz_linear.py)."""
    import random

    r = random.Random(77 + seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(4):
        n, k = r.randrange(1, 97), r.choice([r.randrange(1, 200), 32 * r.randrange(1, 13)])
        m = r.choice([1, 2, 3, 4, 5, 17, 33])
        blocksize, nested = r.choice([32, 64, 128, 256, 4096]), r.random() < 0.5
        dtype = r.choice([torch.bfloat16, torch.float16, torch.float32])
        w = torch.randn(n, k, generator=gen) * 0.05
        q = fastnf4.quantize(w.to(dtype), blocksize=blocksize, double_quant=nested)
        x = torch.randn(m, k, generator=gen).to(dtype)
        bias = (torch.randn(n, generator=gen) * 0.1).to(dtype) if r.random() < 0.5 else None
        wd = fastnf4.dequantize(q, dtype)
        ref = x.double() @ wd.double().T + (bias.double() if bias is not None else 0)
        yardstick = rel_err(torch.nn.functional.linear(x, wd, bias), ref)
        paths = [p for p in PATHS if not (p == "gemv" and m > 4)]
        for path in paths:
            try:
                out = run_path(x, q, bias, path)
            except ValueError:  # (a fused path the shape does not allow: no quantization group fits K)
                assert path != "dequant+matmul"
                continue
            y = torch.full((m, n), float("nan"), dtype=dtype)
            y.copy_(out)
            assert not torch.isnan(y).any(), (n, k, m, blocksize, nested, dtype, path)
            assert rel_err(y, ref) <= 2 * yardstick + 2.0 ** -20, (n, k, m, blocksize, nested, dtype, path)
        y = fastnf4.linear(x, q, bias)
        assert y.dtype == dtype and rel_err(y, ref) <= 2 * yardstick + 2.0 ** -20, (n, k, m, blocksize, nested, dtype)


def test_forced_triton_paths_refuse_shapes_they_cannot_take():
    """No power of two >= 16 divides both K and the blocksize (K = 100): the fused Triton paths, forced, raise a
    ValueError naming it (they divided by zero before); an unknown path name is refused too."""
    q = fastnf4.quantize(torch.randn(8, 100), blocksize=64, double_quant=False)
    x = torch.randn(1, 100)
    for path in ("gemv", "gemm"):
        with pytest.raises(ValueError, match="power of two >= 16 dividing both K"):
            dispatch.linear_triton(x, *linear_args(q), path=path)
    with pytest.raises(ValueError, match="unknown path"):
        dispatch.linear_triton(x, *linear_args(q), path="gemvv")


@needs_triton
def test_public_linear_shapes_dtypes_and_fallback(rng):
    w = torch.randn(40, 96, generator=rng) * 0.05
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q = fastnf4.quantize(w.to(dtype), double_quant=True)
        x = torch.randn(2, 3, 96, generator=rng).to(dtype)
        y = fastnf4.linear(x, q)
        assert y.shape == (2, 3, 40) and y.dtype == dtype
        ref = x.double() @ fastnf4.dequantize(q, dtype=torch.float32).double().T
        assert rel_err(y, ref) < (2e-5 if dtype == torch.float32 else 1e-2)
    # K = 100: no power-of-two group of 16 divides it -> dequantize + matmul
    q = fastnf4.quantize(torch.randn(8, 100, generator=rng), blocksize=64, double_quant=False)
    assert dispatch.choose_path(1, 8, 100, 64) == "dequant+matmul"
    x = torch.randn(1, 100, generator=rng)
    ref = x.double() @ fastnf4.dequantize(q).double().T
    assert rel_err(fastnf4.linear(x, q), ref) < 1e-5


def test_mma_rules_keep_the_smallest_weights_off_the_gemm_kernel():
    """M 3-8: the GEMM kernel of gemv_mma.cu only where it beat dequantize + cuBLAS on both GPUs measured (H200, H100:
    dispatch.py): Llama k+v (1024 x 8192) at M <= 4, Gemma k+v (2048 x 5376) at M <= 8, Qwen k+v (1024 x 5120)
    never; every size at M <= 2; above M = 8 the N rules."""
    assert all(dispatch.mma_wanted(m, 1024, 5120) for m in (1, 2))
    assert not any(dispatch.mma_wanted(m, 1024, 5120) for m in (3, 4, 8, 16))
    assert dispatch.mma_wanted(4, 1024, 8192) and not dispatch.mma_wanted(5, 1024, 8192)
    assert dispatch.mma_wanted(8, 2048, 5376) and not dispatch.mma_wanted(9, 2048, 5376)
    assert dispatch.mma_wanted(16, 4096, 1024) and not dispatch.mma_wanted(17, 4096, 8192)
    assert dispatch.mma_wanted(32, 8192, 64) and not dispatch.mma_wanted(33, 57344, 8192)


def test_dispatch_table():
    assert dispatch.choose_path(1, 8192, 8192, 64) == "gemv"
    assert dispatch.choose_path(1, 1024, 8192, 64) == "gemv"
    assert dispatch.choose_path(2, 5376, 4096, 64) == "gemv"
    assert dispatch.choose_path(2, 4096, 5376, 64) == "dequant+matmul"  # the Triton GEMV's M = 2 lost there
    assert dispatch.choose_path(4, 8192, 8192, 64) == "gemm"
    assert dispatch.choose_path(4, 5120, 8192, 64) == "dequant+matmul"
    assert dispatch.choose_path(16, 8192, 8192, 64) == "gemm"
    assert dispatch.choose_path(16, 5376, 21504, 64) == "dequant+matmul"
    assert dispatch.choose_path(32, 57344, 8192, 64) == "gemm"
    assert dispatch.choose_path(17, 28672, 8192, 64) == "gemm"
    assert dispatch.choose_path(32, 25600, 5120, 64) == "dequant+matmul"
    assert dispatch.choose_path(33, 57344, 8192, 64) == "dequant+matmul"
    # GPUs with less bandwidth per SM cycle than the H200: every M <= 32 where N >= 8192
    assert dispatch.choose_path(32, 8192, 8192, 64) == "dequant+matmul"
    assert dispatch.choose_path(32, 8192, 8192, 64, low_bw=True) == "gemm"
    assert dispatch.choose_path(17, 10240, 5120, 64, low_bw=True) == "gemm"
    assert dispatch.choose_path(32, 5120, 8192, 64, low_bw=True) == "dequant+matmul"
    assert dispatch.choose_path(33, 8192, 8192, 64, low_bw=True) == "dequant+matmul"
    assert dispatch.choose_path(32, 8192, 8192, 64, mma_ok=True, low_bw=True) == "mma"
    assert dispatch.choose_path(512, 8192, 8192, 64) == "dequant+matmul"
    assert dispatch.choose_path(64, 57344, 8192, 64) == "dequant+matmul"  # no wgmma build (CPU, Ampere, ...)


def test_wgmma_rules_on_low_bandwidth_gpus():
    # H200 rules at M 385-512: N = 8192 from 20M elements, N >= 40960 from 200M, none at M 257-384 (dequantize +
    # cuBLAS ahead at M = 288: benchmarks/results/h200-probe-wgmma-m257-512.json); low-bandwidth GPUs add N >= 8192
    # or K >= 16384 from 20M at M 353-512
    for n, k, h200, low in ((28672, 8192, False, True), (5120, 25600, False, True), (10240, 5120, False, True),
                            (5120, 8192, False, False), (5376, 4096, False, False), (4096, 5376, False, False),
                            (57344, 8192, True, True), (8192, 8192, True, True), (8192, 2048, False, False)):
        for m in (385, 448, 512):
            assert dispatch.wgmma_wanted(m, n, k) is h200, (m, n, k)
            assert dispatch.wgmma_wanted(m, n, k, low_bw=True) is low, (m, n, k)
        for m in (353, 384):
            assert not dispatch.wgmma_wanted(m, n, k) and dispatch.wgmma_wanted(m, n, k, low_bw=True) is low, (m, n, k)
        for m in (257, 288, 352):
            assert not dispatch.wgmma_wanted(m, n, k) and not dispatch.wgmma_wanted(m, n, k, low_bw=True), (m, n, k)
    assert dispatch.wgmma_wanted(256, 5376, 4096, low_bw=True)  # (M <= 256: every weight of >= 20M either way)
    assert not dispatch.wgmma_wanted(513, 28672, 8192, low_bw=True)
    assert dispatch.choose_path(512, 28672, 8192, 64, wgmma_ok=True) == "dequant+matmul"
    assert dispatch.choose_path(512, 28672, 8192, 64, wgmma_ok=True, low_bw=True) == "wgmma"


def test_low_bandwidth_from_device_properties(monkeypatch):
    from types import SimpleNamespace

    # kHz / bits as torch reports them on the lent GPUs: H200 18.4 bytes per SM cycle, H100 SXM 12.8
    h200 = SimpleNamespace(memory_clock_rate=3_201_000, memory_bus_width=6016, clock_rate=1_980_000,
                           multi_processor_count=132)
    h100 = SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120, clock_rate=1_980_000,
                           multi_processor_count=132)
    old_torch = SimpleNamespace(multi_processor_count=132)  # a torch without the three properties
    for props, want in ((h200, False), (h100, True), (old_torch, False)):
        dispatch._bytes_per_sm_cycle.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, props=props: props)
        assert dispatch.low_bandwidth(torch.device("cuda", 0)) is want
    dispatch._bytes_per_sm_cycle.cache_clear()
    assert dispatch.low_bandwidth(torch.device("cpu")) is False


def test_wgmma_dispatch_on_model_shapes():
    """Where the Hopper kernel takes over from the GEMM kernel or dequantize + cuBLAS (H200,
    82c15ba:benchmarks/probe_wgmma.py, bench matmul): none at M <= 4 (M 3-4: the pair-column decode kernel), every
    weight of >= 20M elements at M 5-32, of >= 32M at M <= 64, of >= 20M at M <= 128, most at M <= 256, the largest
    at M <= 512, none above."""
    from fastnf4.bench.harness import model_shapes

    def path(m, n, k):
        return dispatch.choose_path(m, n, k, 64, mma_ok=dispatch.mma_wanted(m, n, k), wgmma_ok=True,
                                    pair_ok=gemv_mma.pair_wanted(m, n, k, 64))

    taken = {mm: sorted({(n, k) for _, _, n, k in model_shapes() if path(mm, n, k) == "wgmma"})
             for mm in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 256, 257, 384, 385, 512, 513, 2048)}
    assert taken[1] == taken[2] == [] and taken[513] == taken[2048] == []
    # M 3-4 (82c15ba:benchmarks/probe_pair_cols.py, benchmarks/results/h200-probe-pair-cols-local.json): every model
    # weight on gemv_mma.cu's pair-column decode kernel instead
    assert taken[3] == taken[4] == []
    assert all(path(mm, n, k) == "mma" for mm in (3, 4) for _, _, n, k in model_shapes())
    big = {(n, k) for _, _, n, k in model_shapes() if n * k >= 20 * 2**20}
    kv = {(1024, 8192), (1024, 5120), (2048, 5376)}  # the k+v projections (5-11M elements)
    assert kv == {(n, k) for _, _, n, k in model_shapes() if n * k < 20 * 2**20}
    # M 5-8 (82c15ba:benchmarks/probe_small_m_plans.py --all --m 4,8 and 82c15ba:benchmarks/probe_wgmma_wide_tail.py;
    # da7e8ed, 81d7b8c): every weight of >= 20M elements (Llama gate_up since the wide-weight tail plan); M 9-32
    # (82c15ba:benchmarks/probe_small_m_plans.py --all, fb45f71; at M 17-32 82c15ba:benchmarks/probe_wgmma.py --small
    # before, 4ab29c6) the same; and since 7c21521 (82c15ba:benchmarks/probe_wgmma.py --kv,
    # benchmarks/results/h200-probe-wgmma-kv.json) the k+v projections at M 3-32 too, Llama's and Qwen's (N = 1024) at
    # M 33-64, Llama's and Gemma's at M 65-128
    assert set(taken[5]) == set(taken[8]) == big | kv
    assert set(taken[9]) == set(taken[16]) == set(taken[17]) == set(taken[32]) == big | kv
    # M 33-256 (82c15ba:benchmarks/probe_wgmma.py --ms 64,256,512, benchmarks/results/h200-probe-wgmma-dispatch.json):
    # every weight from 20M elements (Gemma q / o at M = 64 and the qkv projections of N = 10240 at M = 256 since
    # 7a524c1)
    assert set(taken[33]) == set(taken[64]) == big | {(1024, 8192), (1024, 5120)}
    assert set(taken[65]) == set(taken[128]) == big | {(1024, 8192), (2048, 5376)}
    assert set(taken[256]) == big
    # M 385-512 (the same probe): the N = 8192 weights from 20M elements and the gate_up projections (N >= 40960);
    # M 257-384 none (82c15ba:benchmarks/probe_wgmma.py --ms 288,384,512,
    # benchmarks/results/h200-probe-wgmma-m257-512.json: dequantize + cuBLAS ahead at M = 288 on all 17; 8a776b8)
    assert taken[257] == taken[384] == []
    assert taken[385] == taken[512]
    assert set(taken[512]) == {(8192, 8192), (8192, 28672), (8192, 5120), (8192, 5376), (57344, 8192), (51200, 5120),
                               (43008, 5376)}


def test_eager_plan_key_follows_the_wgmma_buckets():
    """One eager plan serves all M with the same ``m_key``: the dispatcher must then take the same path for all."""
    from fastnf4.ops.matmul import eager

    assert eager.MAX_M == dispatch.MMA_MAX_M and eager.wgmma.MAX_M == dispatch.WGMMA_RULES[-1][0]
    tops = {top for top, _ in dispatch.WGMMA_RULES if top > eager.wgmma.BLOCK_M[-1]} | set(dispatch.WGMMA_LOW_BW_M)
    assert eager.wgmma.WIDE_M_BUCKETS == tuple(sorted(tops))
    shapes = [(57344, 8192), (8192, 28672), (5120, 25600), (10240, 8192), (5120, 8192), (4096, 5376), (25600, 5120)]
    by_key = {}
    for m in range(1, 700):
        for n, k in shapes:
            for low_bw in (False, True):
                by_key.setdefault((eager.m_key(m), n, k, low_bw), set()).add(dispatch.wgmma_wanted(m, n, k, low_bw))
    assert all(len(v) == 1 for v in by_key.values())


def test_wide_rows_on_model_shapes():
    """The 192-row wgmma blocks (M 65-128): every model weight of N >= 10240 (5ff2512,
    benchmarks/results/h200-probe-wgmma-rows.json) and Llama down (N = 8192, K = 28672; 8a776b8), none of the other
    narrow ones (82c15ba:benchmarks/probe_wgmma_rows_plans.py, benchmarks/results/h200-probe-wgmma-rows-plans.json:
    slower there)."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import wgmma

    wide = {(n, k) for _, _, n, k in model_shapes() if wgmma.wide_wanted(n, k)}
    assert wide == {(n, k) for _, _, n, k in model_shapes() if n >= 10240} | {(8192, 28672)}
    assert not wgmma.wide_wanted(8192, 16383) and wgmma.wide_wanted(8192, 16384) and not wgmma.wide_wanted(8191, 16384)


@pytest.mark.parametrize("m", [1, 9, 16, 17, 32, 33, 64, 100, 128, 200, 256, 1000])
@pytest.mark.parametrize("n, k", [(57344, 8192), (21504, 5376), (10240, 8192), (4096, 5376), (200, 192), (8192, 64)])
@pytest.mark.parametrize("rows", [128, 192])
def test_wgmma_plan_covers_k(m, n, k, rows):
    """``rows``: weight rows per block (ROWS, or ROWS_WIDE, which only the BM 128 build has)."""
    from fastnf4.ops.matmul import wgmma

    bm = wgmma.block_m(m)
    assert bm in wgmma.BLOCK_M and (bm >= m or bm == 256) and (bm == wgmma.BLOCK_M[0] or bm // 2 < m)
    if rows != wgmma.ROWS and (rows != wgmma.ROWS_WIDE or bm != wgmma.WIDE_BM):
        pytest.skip("no such build")
    blocks = 2 if bm <= 64 else 1
    slots = 132 * blocks
    s, per, full = wgmma.plan(m, n, k, slots, bm, blocks, rows)
    steps = k // wgmma.STEP
    assert s >= 1 and s * per >= steps and (s - 1) * per < steps  # every split has work, all of K is covered
    m_tiles, n_tiles = -(-m // bm), -(-n // rows)
    tiles = m_tiles * n_tiles
    assert 0 <= full <= n_tiles and (s == 1) == (full == n_tiles)
    assert s == 1 or per >= 8
    one = wgmma._one_wave(tiles, steps, slots)
    one_plan = (*one, 0 if one[0] > 1 else n_tiles)
    if (s, per, full) == one_plan:  # the one-wave plan: every tile split alike, in one wave
        assert s == 1 or (tiles < slots and s * tiles <= slots + slots // 16)
    elif blocks == 2 and tiles > slots:  # more tiles than slots (< twice): one wave whole, the rest in 2-3 parts
        assert tiles < 2 * slots and one_plan[0] == 1 and bm <= wgmma.TWO_BLOCK_TAIL_MAX_BM
        assert full == slots and s in (2, wgmma.WIDE_TAIL_PARTS) and s * (n_tiles - full) <= 2 * slots
    elif blocks == 2:  # two blocks per SM, tiles filling 50-70% of the slots: a tail in 3 parts (the last quarter) or
        # 2 (exactly one wave), within one wave
        assert slots // 2 < tiles <= wgmma.TWO_BLOCK_TAIL_MAX_FILL * slots and one_plan[0] == 1
        assert bm <= wgmma.TWO_BLOCK_TAIL_MAX_BM
        assert (s == 3 and n_tiles - full == n_tiles // 4) or (s == 2 and full + 2 * (n_tiles - full) == slots)
        assert full + s * (n_tiles - full) <= slots
    else:  # a tail plan with one block per SM: only where the model saves >= 8%
        base = wgmma._cost(m_tiles, n_tiles, one_plan[2], *one, steps, slots, m, rows)
        assert wgmma._cost(m_tiles, n_tiles, full, s, per, steps, slots, m, rows) < wgmma.TAIL_GAIN * base


def test_wgmma_tail_plan_fills_the_last_wave():
    """Gemma gate+up (168 row tiles) at M = 128, one block per SM: two waves of whole tiles, or one wave and the
    last 36 tiles in parts (the model's choice: 3 parts of 28 steps, 108 blocks in the second wave)."""
    from fastnf4.ops.matmul import wgmma

    assert wgmma._makespan([(264, 10)], 132) == 20 and wgmma._makespan([(132, 10), (100, 3)], 132) == 13
    assert wgmma._makespan([(133, 10)], 132) == 20
    assert wgmma.plan(128, 21504, 5376, 132, 128, 1) == (3, 28, 132)
    # two blocks per SM (BM <= 64): 168 tiles fill 64% of the 264 slots: 126 whole, 42 in 3 parts (252 blocks;
    # 47ee704, benchmarks/results/h200-probe-small-m-plans-gemma.json: 40.9 vs 42.8 us for 72 whole and 96 in 2 parts
    # at M = 16); 200 tiles (76%) and 132 or fewer (the one-wave plan splits them all) stay as they were
    assert wgmma.plan(16, 21504, 5376, 264, 16, 2) == (3, 28, 126)
    assert wgmma.plan(8, 21504, 5376, 264, 8, 2) == (3, 28, 126)
    assert wgmma.plan(32, 25600, 5120, 264, 32, 2) == (1, 80, 200)
    assert wgmma.plan(16, 8192, 5120, 264, 16, 2) == (4, 20, 0)
    assert wgmma.plan(64, 21504, 5376, 264, 64, 2) == (1, 84, 168)  # BM 64: not measured, the one-wave plan


def test_wgmma_not_supported_off_hopper():
    from fastnf4.ops.matmul import wgmma

    x = torch.zeros(64, 128, dtype=torch.bfloat16)
    assert not wgmma.supports(x, torch.zeros(64 * 64, dtype=torch.uint8), 64, 128, 128)


def test_wgmma_stats_fit_asks_for_the_arrays_end_on_a_copy_boundary():
    """wgmma.cu copies statistics as whole aligned words (4 bytes of 8-bit codes, 16 of float absmax), so it runs
    only where the array ends on such a boundary; compute-sanitizer reported the others' last word as a read past
    the allocation (tools/sanitize.py)."""
    from fastnf4.ops.matmul import wgmma

    base = torch.zeros(8192, dtype=torch.uint8)
    assert base.data_ptr() % 16 == 0
    codes = lambda start, n: base[start:start + n]  # noqa: E731
    floats = lambda start, n: base[4 * start:4 * (start + n)].view(torch.float32)  # noqa: E731
    assert wgmma.stats_fit(codes(0, 4952), nested=True)
    assert not wgmma.stats_fit(codes(0, 4950), nested=True)   # 300 x 2112 / 128: the sanitizer's case
    assert wgmma.stats_fit(codes(1, 4951), nested=True)       # a view off alignment that ends on a word
    assert not wgmma.stats_fit(codes(1, 4952), nested=True)
    assert wgmma.stats_fit(floats(0, 52), nested=False)
    assert not wgmma.stats_fit(floats(0, 51), nested=False)   # 17 x 192 / 64
    assert not wgmma.stats_fit(floats(1, 52), nested=False)
    assert wgmma.stats_fit(floats(1, 51), nested=False)


def test_burst_words_fit_asks_for_whole_words_at_both_ends():
    """gemv_mma.cu's burst kernel reads a row's statistics as aligned 4-byte words: it takes only arrays that start
    and end on word boundaries (an odd count of 8-bit codes, e.g. 17 x 256 / 128 = 34, is refused)."""
    base = torch.zeros(256, dtype=torch.uint8)
    assert base.data_ptr() % 16 == 0
    assert gemv_mma.words_fit(base[:36]) and gemv_mma.words_fit(base[4:40])
    assert not gemv_mma.words_fit(base[:34])     # ends inside a word
    assert not gemv_mma.words_fit(base[1:37])    # starts inside one
    assert gemv_mma.words_fit(base[:204].view(torch.float32))  # float absmax: whole words whenever aligned


def test_wgmma_wrappers_are_the_generated_ones():
    """The long wgmma operand lists in wgmma.cu are fastnf4/ops/matmul/gen_wgmma.py's output, verbatim."""
    import pathlib

    from fastnf4.ops.matmul import gen_wgmma, wgmma

    assert gen_wgmma.wrappers() in pathlib.Path(wgmma.SOURCE).read_text()


def test_linear_errors():
    q = fastnf4.quantize(torch.randn(8, 64))
    with pytest.raises(ValueError, match="K=64"):
        fastnf4.linear(torch.randn(2, 32), q)
    with pytest.raises(TypeError, match="bias dtype"):
        fastnf4.linear(torch.randn(2, 64), q, torch.zeros(8, dtype=torch.float16))
    with pytest.raises(ValueError, match="2-D weight"):
        fastnf4.linear(torch.randn(2, 64), fastnf4.quantize(torch.randn(512)))
    with pytest.raises(TypeError, match="x must be"):
        fastnf4.linear(torch.randn(2, 64).to(torch.int32), q)


def test_linear_op_contract_and_compile(rng):
    from fastnf4 import _ops

    q = fastnf4.quantize(torch.randn(24, 64, generator=rng).to(torch.bfloat16), double_quant=True)
    x = torch.randn(3, 64, generator=rng).to(torch.bfloat16)
    args = (x, q.packed_u8, q.absmax, kernel_code("nf4", x.device), 64, 24, 64, q.nested_code, q.nested_absmax,
            q.offset, 256, None)
    torch.library.opcheck(_ops.linear_op, args)
    f = torch.compile(lambda x, q: fastnf4.linear(x, q) * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x, q), fastnf4.linear(x, q) * 2)


# ------------------------------------------------------------------ CUDA decode kernel (host-side parts)
@pytest.mark.parametrize("n, k", [(1024, 8192), (57344, 8192), (17, 96), (5376, 21504)])
@pytest.mark.parametrize("warps", [64, 132 * 16, 132 * 8])
def test_gemv_mma_plan_covers_k(n, k, warps):
    from fastnf4.ops.matmul import gemv_mma

    s, per = gemv_mma.plan(1, n, k, warps)
    slices = -(-k // gemv_mma.SLICE)
    assert 1 <= s <= 16 and s * per >= slices and (s - 1) * per < slices  # every split has work
    assert s == 1 or per >= 4
    assert gemv_mma.plan(1, n, k, warps, allow_split=False) == (1, slices)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gemv_mma_source_compiles(arch, tmp_path):
    import ctypes

    from fastnf4 import _cuda
    from fastnf4.ops.matmul import gemv_mma

    lib = _cuda.compile_source(gemv_mma.SOURCE, arch, out_dir=str(tmp_path))
    dll = ctypes.CDLL(lib)  # loads without a GPU; the C entry points are exported
    dll.fastnf4_gemv_mma_params_size.restype = ctypes.c_int
    assert dll.fastnf4_gemv_mma_params_size() == ctypes.sizeof(gemv_mma.Params)


def test_cuda_cache_key_covers_local_headers(tmp_path):
    """A CUDA source's build is keyed by its text and that of the headers it includes with quotes from its folder
    (transitively), so editing such a header rebuilds; other includes and missing headers do not count."""
    from fastnf4 import _cuda

    (tmp_path / "a.cu").write_text('#include <cuda.h>\n#include "h.cuh"\n#include "missing.cuh"\nint a;\n')
    (tmp_path / "h.cuh").write_text('#pragma once\n  #  include "g.cuh"\nint h;\n')
    (tmp_path / "g.cuh").write_text('#include "h.cuh"\nint g;\n')  # a cycle: read once
    (tmp_path / "plain.cu").write_text("int p;\n")
    key = _cuda._source_bytes(str(tmp_path / "a.cu"))
    assert key.count(b"int h;") == 1 and key.count(b"int g;") == 1 and key.startswith(b"#include <cuda.h>")
    (tmp_path / "g.cuh").write_text('#include "h.cuh"\nint g2;\n')
    assert _cuda._source_bytes(str(tmp_path / "a.cu")) != key
    assert _cuda._source_bytes(str(tmp_path / "plain.cu")) == b"int p;\n"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_wgmma_source_compiles(tmp_path):
    import ctypes

    from fastnf4 import _cuda
    from fastnf4.ops.matmul import wgmma

    dll = ctypes.CDLL(_cuda.compile_source(wgmma.SOURCE, "sm_90a", out_dir=str(tmp_path)))
    dll.fastnf4_wgmma_params_size.restype = ctypes.c_int
    assert dll.fastnf4_wgmma_params_size() == ctypes.sizeof(wgmma.Params)


def _cuobjdump():
    import os

    import triton

    found = shutil.which("cuobjdump")
    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return found or (bundled if os.path.exists(bundled) else None)


def _in_flight_fragment_writes(sass: str) -> tuple[int, list[str]]:
    """(wgmma groups seen, instructions that write an A-fragment register of an issued HGMMA group before a
    WARPGROUP.DEPBAR that waits for it): wgmma reads its register A operand asynchronously and ptxas does not
    guard it (22a8dd2:NOTES.md "Hopper wgmma kernel" and "where the wgmma kernel's time goes": both times the next
    step's decode was given the in-flight registers). Groups in flight are tracked in issue order: ``DEPBAR.LE gsb0,
    N`` leaves the newest N of them in flight, so a kernel that waits for all but the newest group (the two-row-group
    build, 6212a90) is checked up to the wait that really retires each group. A linear scan of each function's SASS."""
    import re

    groups, bad = 0, []
    for func in re.split(r"\n\s*Function : ", sass)[1:]:
        in_flight: list[set[int]] = []
        pending: set[int] = set()
        for ln in func.splitlines():
            ln = re.sub(r"/\*[0-9a-f]*\*/", "", ln)
            if "HGMMA" in ln:
                m = re.search(r"HGMMA\.\S+ R\d+, R(\d+),", ln)
                if m:
                    pending |= set(range(int(m.group(1)), int(m.group(1)) + 4))
                if "gsb0" in ln:  # the group's last HGMMA sets the scoreboard
                    in_flight.append(pending)
                    pending = set()
                    groups += 1
                continue
            m = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", ln)
            if m:
                keep = int(m.group(1), 16)
                in_flight = in_flight[max(0, len(in_flight) - keep):] if keep else []
                continue
            m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s+R(\d+)\b", ln)
            if (m and any(int(m.group(3)) in regs for regs in in_flight)
                    and not m.group(2).startswith(("ST", "BAR", "BRA", "RED", "ATOM"))):
                bad.append(ln.strip())
    return groups, bad


def test_wgmma_wide_weights_split_their_second_wave():
    from fastnf4.ops.matmul import wgmma

    # H200 (82c15ba:benchmarks/probe_wgmma_wide_tail.py, benchmarks/results/h200-probe-wgmma-wide-tail.json; 81d7b8c):
    # one wave of whole tiles, the rest in 2 / 3 parts
    for m in (4, 8, 16, 32):
        bm = wgmma.block_m(m)
        assert wgmma.plan(m, 57344, 8192, 264, bm, 2) == (2, 64, 264)  # Llama gate_up: 184 tiles left
        assert wgmma.plan(m, 51200, 5120, 264, bm, 2) == (3, 28, 264)  # Qwen gate_up: 136
        assert wgmma.plan(m, 43008, 5376, 264, bm, 2) == (3, 28, 264)  # Gemma gate_up: 72
    assert wgmma.plan(16, 28672, 8192, 264, 16, 2) == (1, 128, 224)  # Llama gate+up (224 tiles): still whole
    assert wgmma.plan(16, 140000, 8192, 264, 16, 2)[0] == 1  # twice the slots or more: whole tiles
    assert wgmma.plan(64, 57344, 8192, 264, 64, 2)[0] == 1  # BM 64: not measured


def test_decode_plan_prices_split_k_as_measured():
    from fastnf4.ops.matmul import gemv_mma

    cost = gemv_mma.DECODE_SPLIT_COST
    # H200, f5796dc (82c15ba:benchmarks/probe_decode.py, every split count): Llama gate+up 52.5 us whole against 59.5
    # in 7 splits, Qwen gate_up 61.8 in 3 splits against 63.0 in 5; the other weights keep their (fastest) plans
    assert gemv_mma.plan(1, 28672, 8192, 132 * 16, split_cost=cost) == (1, 64)
    assert gemv_mma.plan(1, 51200, 5120, 132 * 16, split_cost=cost)[0] == 3
    for n, k, warps in ((57344, 8192, 132 * 16), (8192, 28672, 132 * 16), (21504, 5376, 132 * 16),
                        (8192, 8192, 132 * 20)):
        assert gemv_mma.plan(1, n, k, warps, split_cost=cost) == gemv_mma.plan(1, n, k, warps)
    assert gemv_mma.plan(1, 28672, 8192, 132 * 16)[0] > 1  # the default cost (other kernels, M > 2) splits it
    # M = 2 (7cd7d29, FASTNF4_PROBE_M=2): the same price; Qwen o 6 splits (17.3 us) instead of 13 (19.0)
    assert gemv_mma.plan(2, 5120, 8192, 132 * 16, split_cost=cost)[0] == 6


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_wgmma_fragments_are_not_overwritten_in_flight(tmp_path):
    """The SASS of every wgmma variant: no instruction between an HGMMA group and its wait writes the group's A
    registers. (The statistics-ahead attempt, reverted in ccc932a, had 12 such kernels of 12; this check finds
    them.)"""
    import subprocess

    from fastnf4 import _cuda
    from fastnf4.ops.matmul import wgmma

    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    lib = _cuda.compile_source(wgmma.SOURCE, "sm_90a", out_dir=str(tmp_path))
    sass = subprocess.run([tool, "-sass", lib], capture_output=True, text=True, check=True).stdout
    groups, bad = _in_flight_fragment_writes(sass)
    assert groups >= 20  # every variant issues wgmma (the check cannot pass on an empty dump)
    assert bad == []


def test_small_weight_kernels_take_the_kv_projections():
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma

    kv = [(n, k) for _, layer, n, k in model_shapes() if layer == "k+v"]
    assert len(kv) == 3
    for n, k in kv:  # every k/v projection of the three models at M = 1 (H200: 1.6-2.2x bitsandbytes)
        assert gemv_mma.choose(1, n, k, 2) == gemv_mma.SPLIT
    for model, layer, n, k in model_shapes():
        # nothing larger: not Gemma q / o (11 MB; since 7c50fa8 faster on the decode kernels: Gemma o 10.1 vs 11.4
        # us on the H200, benchmarks/results/h200-probe-decode-small-m1.txt) nor Qwen q (21 MB: 17.0 vs 14.9 us)
        if layer != "k+v":
            assert gemv_mma.choose(1, n, k, 2) not in (gemv_mma.SPLIT, gemv_mma.SMALL)
    # M = 2: the split kernel's two-row build on Llama / Qwen k+v (H200, 0da5430,
    # benchmarks/results/h200-probe-decode-split-m2.txt: 7.0 / 5.5 us against 10.9 / 8.1 for the one-warp-per-row
    # kernel); Gemma k+v (11M elements) was slower there than the tensor-core kernels
    assert gemv_mma.choose(2, 1024, 8192, 2) == gemv_mma.choose(2, 1024, 5120, 2) == gemv_mma.SPLIT
    assert gemv_mma.choose(2, 2048, 5376, 2) in (gemv_mma.variant(2), gemv_mma.DECODE_WIDE)
    assert gemv_mma.choose(2, 512, 8192 + 32, 2) != gemv_mma.SPLIT  # two rows of x must fit its 32 KiB
    assert gemv_mma.choose(3, 1024, 5120, 2) == gemv_mma.variant(3)
    assert not gemv_mma.small_fits(1, 32768, 2)  # x must fit its 32 KiB shared-memory staging
    assert gemv_mma.choose(1, 64, 32768, 2) != gemv_mma.SPLIT


def test_wide_decode_kernel_takes_the_mid_weights_at_m1():
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma

    picks = {(model, layer): gemv_mma.choose(1, n, k, 2) for model, layer, n, k in model_shapes()}
    # measured faster with 20 warps x 4 stages (H200, 5b2d3af): q / o / qkv of all three models
    for layer in ("q+o", "qkv"):
        assert picks[("llama-3.3-70b", layer)] == gemv_mma.DECODE_WIDE
    for model, layer in (("qwen3-32b", "q"), ("qwen3-32b", "o"), ("qwen3-32b", "qkv"), ("gemma-3-27b", "qkv")):
        assert picks[(model, layer)] == gemv_mma.DECODE_WIDE  # (Gemma q / o: the split small-weight kernel)
    # Llama gate_up and Qwen gate+up measured slower with it (5b2d3af): by size, the 16-warp kernel
    assert picks[("llama-3.3-70b", "gate_up")] == gemv_mma.variant(1)
    assert picks[("qwen3-32b", "gate+up")] == gemv_mma.variant(1)
    # at M = 2 as at M = 1 (120fef6)
    assert gemv_mma.choose(2, 8192, 5120, 2) == gemv_mma.DECODE_WIDE


def test_large_decode_weights_without_a_block_local_plan_take_the_wide_kernel():
    """Above WIDE_MAX_ELEMS the 20-warp kernel takes the weights whose 16-warp plan has no block-local split-K
    (H200, 132 SMs x 16 warps, 120fef6: measured faster on four of the six, 1.8-1.9% slower on Gemma gate+up /
    down), except where that plan stages x split-major (Gemma down, cac0742: 26.85 vs 28.0 us at M = 2,
    benchmarks/results/h200-probe-decode-regx.txt); the ones with a block-local plan keep 16 warps."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma

    wide = {m: {(model, layer) for model, layer, n, k in model_shapes() if gemv_mma.wide_above_max(m, n, k, 132, 16)}
            for m in (1, 2)}
    assert wide[2] == {("qwen3-32b", "down"), ("qwen3-32b", "gate+up"), ("llama-3.3-70b", "gate+up"),
                       ("gemma-3-27b", "gate+up"), ("gemma-3-27b", "gate_up")}
    # (at M = 1 Qwen down's x fits split-major too; there ``decode_cost`` picks the kernel in the end)
    assert wide[1] == wide[2] - {("qwen3-32b", "down")}
    s, per = gemv_mma.plan(2, 5376, 21504, 132 * 16, split_cost=gemv_mma.DECODE_SPLIT_COST)
    assert gemv_mma.global_split_holes(2, 5376, 21504, 132 * 16, 16, s, per) > 0
    for model, layer, n, k in model_shapes():
        if n * k <= gemv_mma.WIDE_MAX_ELEMS:  # chosen by size (``choose``) instead
            assert not gemv_mma.wide_above_max(1, n, k, 132, 16) and not gemv_mma.wide_above_max(2, n, k, 132, 16)
        s, per = gemv_mma.plan(1, n, k, 132 * 16, split_cost=gemv_mma.DECODE_SPLIT_COST)
        local = gemv_mma.local_plan(n, k, 132, 16, s, per)
        assert local is None or (local[0] * local[2] <= 16 and local[1] >= 4 and local[3] == 1)  # whole tiles
        wider = gemv_mma.local_plan(n, k, 132, 16, s, per, {2: 66, 4: 32})  # clusters of 2 / 4 blocks besides
        assert wider is None or (local is not None and wider == local) or (wider[0] * wider[2] <= 16 * wider[3])
        if local is not None:
            assert wider == local  # among equal costs no cluster
    assert not gemv_mma.wide_above_max(3, 28672, 8192, 132, 16)  # the GEMM kernel's M
    # below it, at M = 1 the split kernel takes the weights of <= SPLIT_MAX_ELEMS (16M): on the model weights the k/v
    # projections; Gemma q and o (22M) take the decode kernels, and ``decode_cost`` gives both 16 warps (H200, 7c50fa8,
    # benchmarks/results/h200-probe-decode-small-m1.txt: Gemma o 10.1 us on 16 warps, 10.7 on 20, 11.4 split)
    split = {(model, layer) for model, layer, n, k in model_shapes() if gemv_mma.choose(1, n, k, 2) == gemv_mma.SPLIT}
    assert split == {(model, "k+v") for model in ("llama-3.3-70b", "qwen3-32b", "gemma-3-27b")}
    for n, k in ((4096, 5376), (5376, 4096)):
        assert gemv_mma.choose(1, n, k, 2) == gemv_mma.DECODE_WIDE
        assert gemv_mma.decode_cost(1, n, k, 132, 16, {2: 66}) < gemv_mma.decode_cost(1, n, k, 132, 20, {2: 66})


def test_m1_decode_kernel_pick_follows_the_h200_measurements():
    """At M = 1 ``decode_cost`` picks between the 16- and 20-warp decode kernels (132 SMs, one block each, clusters of
    two): the faster one measured on the H200 (1ea5ac3; 82c15ba:benchmarks/probe_decode.py n w, staged x) on every
    model weight it applies to, but Qwen q (measured 20 warps 11.8 vs 12.2 us) and Llama down (equal within 0.1
    us)."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma

    faster16 = {("llama-3.3-70b", "q+o"), ("llama-3.3-70b", "gate_up"), ("gemma-3-27b", "q"),
                ("gemma-3-27b", "qkv"), ("gemma-3-27b", "gate+up"), ("gemma-3-27b", "down")}
    faster20 = {("llama-3.3-70b", "qkv"), ("llama-3.3-70b", "gate+up"), ("qwen3-32b", "o"), ("qwen3-32b", "gate+up"),
                ("qwen3-32b", "down"), ("qwen3-32b", "gate_up"), ("gemma-3-27b", "gate_up")}
    for model, layer, n, k in model_shapes():
        c16 = gemv_mma.decode_cost(1, n, k, 132, 16, {2: 66})
        c20 = gemv_mma.decode_cost(1, n, k, 132, 20, {2: 66})
        if (model, layer) in faster16:
            assert c16 <= c20, (model, layer)
        elif (model, layer) in faster20:
            assert c20 < c16, (model, layer)


def test_m2_decode_kernel_pick_follows_the_h200_measurements():
    """At M = 2 ``decode_cost`` picks between the 16- and 20-warp decode kernels for the weights ``choose`` gives the
    20-warp kernel by size (327fddb; 82c15ba:benchmarks/probe_decode.py 0 w n at M = 2,
    benchmarks/results/h200-probe-decode-m2-wn.txt): 16 warps on Gemma q / o / qkv / k+v (0.3-0.6 us faster
    measured), 20 on Qwen o (13.7 vs 15.6 us) and the qkv projections of N = 10240; the larger weights are not asked
    (``wide_above_max`` decides there)."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma

    faster16 = {("gemma-3-27b", "q"), ("gemma-3-27b", "o"), ("gemma-3-27b", "qkv"), ("gemma-3-27b", "k+v")}
    faster20 = {("qwen3-32b", "o"), ("llama-3.3-70b", "qkv"), ("qwen3-32b", "qkv")}
    asked = set()
    for model, layer, n, k in model_shapes():
        if not gemv_mma.picks_by_cost(2, n, k):
            assert n * k > gemv_mma.WIDE_MAX_ELEMS
            continue
        asked.add((model, layer))
        c16 = gemv_mma.decode_cost(2, n, k, 132, 16, {2: 66})
        c20 = gemv_mma.decode_cost(2, n, k, 132, 20, {2: 66})
        if (model, layer) in faster16:
            assert c16 <= c20, (model, layer)
        elif (model, layer) in faster20:
            assert c20 < c16, (model, layer)
    assert faster16 | faster20 <= asked
    assert gemv_mma.picks_by_cost(1, 57344, 8192) and not gemv_mma.picks_by_cost(3, 4096, 5376)


def test_split_major_plans_fit_their_staged_x():
    """The split-major cluster plans (x too large to stage whole, each block staging its splits' part of K) are offered
    only where x is not staged whole, with whole splits per block, and with the staged x and the partial-sum slots
    together inside the table's 256 holes; on the H200 (132 SMs, clusters of two) Llama and Qwen down take one at M = 1
    (Qwen down measured 30.2 -> 27.3 us, 0615452)."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma

    taken = set()
    for model, layer, n, k in model_shapes():
        for m in (1, 2):
            for warps in (16, 20):
                s, per = gemv_mma.plan(m, n, k, 132 * warps, split_cost=gemv_mma.DECODE_SPLIT_COST)
                stage = gemv_mma.split_stage_m(m, k)
                lp = gemv_mma.local_plan(n, k, 132, warps, s, per, {2: 66},
                                         holes=gemv_mma.LOCAL_HOLES - gemv_mma.x_holes(m, k), stage_m=stage)
                if lp is None or not lp[4]:
                    continue
                S, p, tpb, c, _ = lp
                assert gemv_mma.x_holes(m, k) == 0 and stage == m and k % 128 == 0
                assert c == 2 and tpb * S == c * warps and warps % tpb == 0
                rounds = -(-(-(-n // 16)) // (66 * tpb))
                assert rounds * warps + m * 2 * (warps // tpb) * p <= gemv_mma.LOCAL_HOLES
                taken.add((model, layer, m, warps))
    assert ("llama-3.3-70b", "down", 1, 16) in taken and ("qwen3-32b", "down", 1, 20) in taken


def test_pdl_decision_never_touches_a_gpu(monkeypatch):
    from fastnf4.ops.dequantize import kernel as dq_kernel

    assert not _triton.pdl(torch.device("cpu"))
    monkeypatch.setenv("FASTNF4_PDL", "0")
    assert not _triton.pdl(torch.device("cuda", 0))  # decided before any device query
    monkeypatch.delenv("FASTNF4_PDL")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _triton.pdl(torch.device("cuda", 0))
    if torch.cuda.is_available():
        return  # (Triton runs compiled in this process: the interpreter cannot be switched on for CPU tensors now)
    q = fastnf4.quantize(torch.randn(8, 64))
    prep = dq_kernel.Prepared(q.packed_u8, q.absmax, kernel_code("nf4", q.device), 64, q.numel)
    assert prep.constexprs["PDL"] is False


def test_is_kernel_code():
    from fastnf4 import codebooks

    t = kernel_code("nf4", torch.device("cpu"))
    assert codebooks.is_kernel_code(t) and codebooks.is_kernel_code(kernel_code("fp4", torch.device("cpu")))
    assert not codebooks.is_kernel_code(t.clone())
    assert not codebooks.is_kernel_code(codebooks.code_4bit("nf4"))  # a fresh copy, which a kernel may write


def test_wgmma_rounded_code_variants_match_the_source():
    """``wgmma.FAST_MAX_BM`` (the GPU tests' error budget per variant) is the kernel's ``kFastMaxBM``."""
    import re

    from fastnf4.ops.matmul import wgmma

    src = open(wgmma.SOURCE).read()
    assert len(re.findall(r"constexpr int kFastMaxBM\b", src)) == 1
    default = re.search(r"^constexpr int kFastMaxBM = (\d+);", src, re.MULTILINE)
    assert default is not None and int(default.group(1)) == wgmma.FAST_MAX_BM
    assert wgmma.FAST_MAX_BM in wgmma.BLOCK_M


def test_pair_build_pick_on_model_shapes():
    """M 3-4 (82c15ba:benchmarks/probe_pair_cols.py on the H200, benchmarks/results/h200-probe-pair-cols-local.json:
    132 SMs, one block per SM, 66 clusters of two): the 16- / 20-warp pick of the pair-column decode kernel takes the
    build that measured faster where the two differed by more than 3%: 20 warps on Qwen q (13.8 vs 15.3 us at M = 3),
    Llama q+o, Qwen gate+up and Gemma gate+up (block-local 20-warp plans), 16 on the k+v projections (20-warp plans
    unsplit) and on Gemma o / down (both builds settle globally); and every model weight at M 3-4 takes a pair build,
    none below 4M elements or with blocksize 32."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma as g

    def pick(m, n, k):
        costs = [g.decode_cost(m, n, k, 132, w, {2: 66}, pair=True) for w in (16, 20)]
        return g.pick_pair_build(costs[0], costs[1], g.settles_globally(m, n, k, 132, 20, {2: 66}, pair=True))

    for m in (3, 4):
        for n, k in ((8192, 5120), (8192, 8192), (25600, 5120), (21504, 5376)):
            assert pick(m, n, k) == g.PAIR_WIDE, (m, n, k)
        for n, k in ((1024, 8192), (1024, 5120), (2048, 5376), (5376, 4096), (5376, 21504)):
            assert pick(m, n, k) == g.PAIR, (m, n, k)
        assert all(g.pair_wanted(m, n, k, 64) for _, _, n, k in model_shapes())
    assert not g.pair_wanted(2, 8192, 8192, 64) and not g.pair_wanted(5, 8192, 8192, 64)
    assert not g.pair_wanted(4, 8192, 8192, 32) and not g.pair_wanted(4, 8192, 8160, 64)
    assert not g.pair_wanted(4, 1024, 2048, 64)  # 2M elements: below the measured sizes


def test_pair_kernel_only_where_it_runs():
    """Where the pair-column kernel cannot run (not resident, or no CUDA build), M 3-4 keeps the other rules: a weight
    of 5M elements (Qwen k+v) stays off the GEMM kernel (below MMA_RULES' 6M at M <= 4), a larger one takes it; with
    the pair kernel both take "mma"."""
    for n, k, mma_path in ((1024, 5120, False), (8192, 8192, True)):
        for m in (3, 4):
            mma_ok = dispatch.mma_wanted(m, n, k)
            assert mma_ok == mma_path
            assert (dispatch.choose_path(m, n, k, 64, mma_ok=mma_ok, pair_ok=False) == "mma") == mma_path
            assert dispatch.choose_path(m, n, k, 64, mma_ok=mma_ok, wgmma_ok=True, pair_ok=True) == "mma"


def test_burst_kernel_rule_on_model_shapes():
    """M <= 2 (82c15ba:benchmarks/probe_burst.py on the H200, benchmarks/results/h200-probe-burst-m1.json / -m2.json):
    the burst decode kernel takes exactly the model weights where it measured faster than the decode kernels at M = 1
    and 2, Gemma q, o and k+v (11-22M elements, N >= 2048), and none where it measured slower (the N = 1024 k+v
    projections, 42M elements and up); never at M >= 3, blocksize 32, K % 256 != 0 or an x longer than the table's
    holes (M K > 16384)."""
    from fastnf4.bench.harness import model_shapes
    from fastnf4.ops.matmul import gemv_mma as g

    for m in (1, 2):
        taken = {(model, layer) for model, layer, n, k in model_shapes() if g.burst_wanted(m, n, k, 64)}
        assert taken == {("gemma-3-27b", "q"), ("gemma-3-27b", "o"), ("gemma-3-27b", "k+v")}, (m, taken)
    assert not g.burst_wanted(3, 5376, 4096, 64) and not g.burst_wanted(1, 5376, 4096, 32)
    assert not g.burst_wanted(1, 4096, 5120 + 128, 64)  # K % 256 != 0
    assert not g.burst_wanted(2, 2048, 8448, 64)  # M K > 16384
    assert not g.burst_wanted(1, 1024, 8192, 64)  # N < 2048 (Llama k+v)
    assert not g.burst_wanted(1, 8192, 5120, 64)  # 42M elements (Qwen q)
