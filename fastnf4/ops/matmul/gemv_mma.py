"""Host side of ``gemv_mma.cu``: the decode-size (M <= 32) tensor-core matmuls, launched through ctypes.

``supports`` says whether a call can take this kernel; ``launch`` runs it on the current stream (no host
synchronisation; capturable in a CUDA graph once the library is loaded and the split-K counters exist).

The builds are named (``BUILDS``); their numbers exist only for gemv_mma.cu's ``pick`` (``BUILD_IDS``). The sizes
that choose among them are data: ``tuning/h200.json``.
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from ... import _cuda, _triton, codebooks
from .tuning import DEFAULT as _TUNING

SOURCE = os.path.join(os.path.dirname(__file__), "gemv_mma.cu")
MAX_M = 32
SLICE = 128
_DTYPES = {torch.bfloat16: 0, torch.float16: 1}
_COUNTERS = 1 << 16  # split-K semaphores per device: one per 16-row tile (N up to 1M rows)


class Params(ctypes.Structure):
    _fields_ = [
        ("packed", ctypes.c_void_p), ("absmax", ctypes.c_void_p), ("nested_code", ctypes.c_void_p),
        ("nested_absmax", ctypes.c_void_p), ("offset", ctypes.c_void_p), ("x", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("partial", ctypes.c_void_p), ("counters", ctypes.c_void_p),
        ("M", ctypes.c_longlong), ("N", ctypes.c_longlong), ("K", ctypes.c_longlong), ("blocksize", ctypes.c_longlong),
        ("splits", ctypes.c_longlong),
        ("slices_per_split", ctypes.c_longlong), ("code", ctypes.c_void_p), ("code_const", ctypes.c_longlong),
        ("local", ctypes.c_longlong), ("lcluster", ctypes.c_longlong), ("xs", ctypes.c_longlong),
        ("lsplit", ctypes.c_longlong), ("gsplit", ctypes.c_longlong),
    ]


class _Lib:
    def __init__(self, lib: ctypes.CDLL, index: int):
        self.lib = lib
        self.sms = torch.cuda.get_device_properties(index).multi_processor_count
        lib.fastnf4_gemv_mma.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.fastnf4_gemv_mma.restype = ctypes.c_int
        lib.fastnf4_gemv_mma_occupancy.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.fastnf4_gemv_mma_occupancy.restype = ctypes.c_int
        lib.fastnf4_gemv_mma_params_size.restype = ctypes.c_int
        lib.fastnf4_gemv_mma_warps.argtypes = [ctypes.c_int]
        lib.fastnf4_gemv_mma_warps.restype = ctypes.c_int
        lib.fastnf4_gemv_mma_rows.argtypes = [ctypes.c_int]
        lib.fastnf4_gemv_mma_rows.restype = ctypes.c_int
        self.warps = {v: lib.fastnf4_gemv_mma_warps(i) for v, i in BUILD_IDS.items()}  # per block
        self.rows = {v: lib.fastnf4_gemv_mma_rows(i) for v, i in BUILD_IDS.items()}  # weight rows per work item
        if lib.fastnf4_gemv_mma_params_size() != ctypes.sizeof(Params):
            raise RuntimeError("gemv_mma.cu Params layout differs from the ctypes mirror")
        # Ask every kernel's occupancy now: it loads the module, so later launches (maybe inside a CUDA-graph
        # capture) never trigger lazy loading.
        self.occupancy = {(d, v, nested): lib.fastnf4_gemv_mma_occupancy(d, i, nested)
                          for d in (0, 1) for v, i in BUILD_IDS.items() for nested in (0, 1)}
        lib.fastnf4_gemv_mma_clusters.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.fastnf4_gemv_mma_clusters.restype = ctypes.c_int
        # clusters of the decode kernels' block-local build resident at once (for local_plan), asked now
        self.clusters = {(d, v, nested, c): lib.fastnf4_gemv_mma_clusters(d, BUILD_IDS[v], nested, c)
                         for d in (0, 1) for v in DECODES for nested in (0, 1) for c in CLUSTER_SIZES}


@functools.cache
def _lib_for(index: int) -> _Lib | None:
    lib = _cuda.load(SOURCE, torch.device("cuda", index))  # prebuilt, else nvcc (_cuda.py); None: Triton
    if lib is None:
        return None
    with torch.cuda.device(index):  # kernel attributes and occupancy are set and read per device: the current one
        return _Lib(lib, index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_counters: dict[int, torch.Tensor] = {}


def _counters_for(index: int) -> torch.Tensor | None:
    buf = _counters.get(index)
    if buf is None:
        if torch.cuda.is_current_stream_capturing():
            return None  # never allocate persistent state inside a capture; run without split-K instead
        buf = torch.zeros(_COUNTERS, dtype=torch.int32, device=torch.device("cuda", index))
        _counters[index] = buf
    return buf


def supports(x2d: torch.Tensor, packed: torch.Tensor, blocksize: int, n: int, k: int, nested: bool = False,
             nested_blocksize: int = 256) -> bool:
    """Shapes and layouts the kernel handles; everything else goes to the Triton paths."""
    m = x2d.shape[0]
    return (x2d.is_cuda and x2d.dtype in _DTYPES and 1 <= m <= MAX_M and k % 32 == 0 and k < 2**31 and blocksize >= 32
            and (not nested or nested_blocksize == 256)  # the kernel indexes nested statistics with b >> 8
            and packed.data_ptr() % 16 == 0 and x2d.data_ptr() % 16 == 0 and x2d.is_contiguous()
            and _resident(x2d, m, nested))


def pair_resident(x2d: torch.Tensor, nested: bool) -> bool:
    """Whether a pair-column decode kernel fits on this GPU (else ``Prepared`` falls back to ``build(m)``, so the
    dispatcher keeps its other rules)."""
    lib = _lib_for(_index(x2d.device))
    dt = _DTYPES[x2d.dtype]
    return lib is not None and max(lib.occupancy[(dt, v, int(nested))] for v in (PAIR, PAIR_WIDE)) > 0


def _resident(x2d: torch.Tensor, m: int, nested: bool) -> bool:
    # built here, and the kernel for this M fits on this GPU (the kernels ask for 150-200 KiB of shared memory
    # per block: Hopper and A100 class; smaller parts take the Triton paths)
    lib = _lib_for(_index(x2d.device))
    return lib is not None and lib.occupancy[(_DTYPES[x2d.dtype], build(m), int(nested))] > 0


# The kernel builds of gemv_mma.cu, by name; the number is its ``pick`` case (the ctypes boundary only).
# | name               | kernel                                                                  | M      |
# | decode             | tensor-core decode, 16 warps x 6 ring stages per block                  | <= 2   |
# | decode_wide        | the same with 20 warps x 4 stages                                       | <= 2   |
# | decode_pair(_wide) | the decode kernels with pair columns (x in registers; kPair)            | 3-4    |
# | decode_burst       | small persistent blocks, one tile over all of K, loads into registers   | <= 2   |
# | split              | CUDA-core small-weight kernel, rows split over warp pairs (gemv_split)  | <= 2   |
# | small              | CUDA-core small-weight kernel, one warp per row (gemv_small; forced only)| <= 2   |
# | gemm_m8/16/32      | tensor-core GEMM of 8 / 16 / 32 x rows per block                        | 3-32   |
BUILD_IDS = {"decode": 0, "gemm_m8": 1, "gemm_m16": 2, "gemm_m32": 3, "small": 4, "decode_wide": 5, "split": 6,
             "decode_pair": 7, "decode_pair_wide": 8, "decode_burst": 9}
BUILDS = tuple(BUILD_IDS)
DECODE, SMALL, DECODE_WIDE, SPLIT = "decode", "small", "decode_wide", "split"
PAIR, PAIR_WIDE, BURST = "decode_pair", "decode_pair_wide", "decode_burst"
DECODES = (DECODE, DECODE_WIDE, PAIR, PAIR_WIDE)
PAIR_ITEM_HOLES = 2  # holes a block-local work item's partial sums take in the pair builds (gemv_mma.cu slot_at)
SMALL_X_BYTES = 32 * 1024  # the small-weight kernels' x staging: M * K * 2 bytes must fit (small::kXBytes)
# Note: sizes (N * K elements) by build, fitted on the H200; each entry's why and results are in tuning/h200.json.
# M <= 2: ``split`` at M = 1 up to SPLIT_MAX_ELEMS and M = 2 up to SMALL_MAX_ELEMS, ``decode_wide`` up to
# WIDE_MAX_ELEMS (above: ``wide_above_max``), ``decode_burst`` from BURST_MIN_ELEMS to BURST_MAX_ELEMS where
# N >= BURST_MIN_N; M 3-4: the pair builds from PAIR_MIN_ELEMS, 16 or 20 warps by cost (PAIR_WIDE_FACTOR).
SPLIT_MAX_ELEMS = _TUNING["split_max_elems"]
SMALL_MAX_ELEMS = _TUNING["small_max_elems"]
WIDE_MAX_ELEMS = _TUNING["wide_max_elems"]
PAIR_MIN_ELEMS = _TUNING["pair_min_elems"]
PAIR_WIDE_FACTOR = _TUNING["pair_wide_factor"]
BURST_MIN_ELEMS = _TUNING["burst"]["min_elems"]
BURST_MAX_ELEMS = _TUNING["burst"]["max_elems"]
BURST_MIN_N = _TUNING["burst"]["min_n"]


def build(m: int) -> str:
    """The build for M rows by M alone: ``decode`` (M <= 2), else the GEMM of the smallest x tile covering M;
    ``choose`` and ``Prepared`` refine it by size."""
    return DECODE if m <= 2 else "gemm_m8" if m <= 8 else "gemm_m16" if m <= 16 else "gemm_m32"


variant = build  # (the name tests and tools use)


def small_fits(m: int, k: int, elem_bytes: int) -> bool:
    return m <= 2 and m * k * elem_bytes <= SMALL_X_BYTES


def choose(m: int, n: int, k: int, elem_bytes: int) -> str:
    """The build a call takes by its size: ``split`` for small weights at M = 1 and the smallest at M = 2,
    ``decode_wide`` for mid-size weights at M <= 2, else ``build(m)`` (``Prepared`` may still move a large weight at
    M <= 2 to ``decode_wide``: ``wide_above_max``, and picks 16 or 20 warps by ``decode_cost`` where
    ``picks_by_cost``). ``small`` is never chosen by size (``split`` beats it); it stays for forced calls."""
    if m == 1 and n * k <= SPLIT_MAX_ELEMS and small_fits(m, k, elem_bytes):
        return SPLIT
    if m == 2 and n * k <= SMALL_MAX_ELEMS and small_fits(m, k, elem_bytes):
        return SPLIT
    if m <= 2 and n * k <= WIDE_MAX_ELEMS:
        return DECODE_WIDE
    return build(m)


def pick_pair_build(cost16: float, cost20: float, global20: bool) -> str:
    """PAIR or PAIR_WIDE from the two builds' ``decode_cost`` and whether the 20-warp plan settles globally: the
    20-warp cost is scaled by PAIR_WIDE_FACTOR unless it settles globally (there the 16-warp build was faster: Gemma
    o 12.8 vs 13.0 us at M = 3; results/h200-probe-pair-cols-local.json)."""
    return PAIR_WIDE if cost20 * (1.0 if global20 else PAIR_WIDE_FACTOR) <= cost16 else PAIR


def pair_wanted(m: int, n: int, k: int, blocksize: int) -> bool:
    """Whether a call at M 3-4 takes a pair-column decode build: a 64-code chunk pair must lie in one quantization
    block (blocksize >= 64, K % 64 == 0), and N * K >= PAIR_MIN_ELEMS."""
    return 3 <= m <= 4 and blocksize >= 64 and k % 64 == 0 and n * k >= PAIR_MIN_ELEMS


def words_fit(absmax: torch.Tensor) -> bool:
    """Whether the burst kernel's reads of whole aligned 4-byte statistics words stay inside ``absmax``: the array
    starts and ends on 4-byte boundaries (compute-sanitizer reports the last word of an odd count of 8-bit codes,
    17 x 256 / 128, as a read past the allocation: tools/sanitize.py)."""
    start = absmax.data_ptr()
    return start % 4 == 0 and (start + absmax.numel() * absmax.element_size()) % 4 == 0


def burst_wanted(m: int, n: int, k: int, blocksize: int) -> bool:
    """Whether a call at M <= 2 takes ``decode_burst``: its layout (K % 256 == 0, blocksize >= 64, M K <= 16384)
    and BURST_MIN_ELEMS <= N * K <= BURST_MAX_ELEMS, N >= BURST_MIN_N (one tile per block over all of K: no split-K
    to balance the last wave of larger weights)."""
    return (m <= 2 and blocksize >= 64 and k % 256 == 0 and m * k <= 16384 and n >= BURST_MIN_N and
            BURST_MIN_ELEMS <= n * k <= BURST_MAX_ELEMS)


def picks_by_cost(m: int, n: int, k: int) -> bool:
    """Whether ``Prepared`` lets ``decode_cost`` pick between ``decode`` and ``decode_wide``: at M = 1 everywhere, at
    M = 2 on the weights ``choose`` gives ``decode_wide`` by size (<= WIDE_MAX_ELEMS); the cost model names the
    faster build there within 0.5 us (Gemma k+v 7.0 vs 7.5 us on 16 warps, Qwen o 13.7 vs 15.6 on 20;
    results/h200-probe-decode-m2-wn.txt). Larger weights at M = 2 keep ``wide_above_max``."""
    return m == 1 or (m == 2 and n * k <= WIDE_MAX_ELEMS)


def wide_above_max(m: int, n: int, k: int, blocks: int, block_warps: int) -> bool:
    """Whether a weight of more than WIDE_MAX_ELEMS elements at M <= 2 takes ``decode_wide``: where the 16-warp
    plan (``blocks`` resident blocks of ``block_warps`` warps) has no block-local split-K, so pays the global settle
    or runs unsplit. H200, us at M = 1, 16 -> 20 warps: Qwen gate+up 35.2 -> 33.4, Llama gate+up 52.6 -> 51.1 (Gemma
    gate+up 30.1 -> 30.6 the exception); where the 16-warp plan is block-local 16 warps stayed ahead (Llama gate_up
    89.9 vs 92.8; commit 5b2d3af)."""
    if m > 2 or n * k <= WIDE_MAX_ELEMS:
        return False
    s, per = plan(m, n, k, blocks * block_warps, split_cost=DECODE_SPLIT_COST)
    # (not where the 16-warp global plan stages x split-major: Gemma down at M = 2 26.85 us against 28.0 on 20 warps,
    # results/h200-probe-decode-regx.txt)
    return (local_plan(n, k, blocks, block_warps, s, per, holes=LOCAL_HOLES - x_holes(m, k)) is None
            and not global_split_holes(m, n, k, blocks * block_warps, block_warps, s, per))


def global_split_holes(m: int, n: int, k: int, warps: int, block_warps: int, s: int, per: int) -> int:
    """Holes of staged x for the global split-K plan (``s`` parts of ``per`` slices) on ``warps`` warps in blocks of
    ``block_warps``, taken split-major (gemv_mma.cu Params.gsplit): x too large to stage whole, every item on its own
    warp; each block stages the one or two splits its warps take (more where the tiles are fewer than its warps).
    0 where it does not apply."""
    slices, tiles = -(-k // SLICE), -(-n // 16)
    if m > 2 or k % SLICE or x_holes(m, k) or s < 2 or (s - 1) * per >= slices or tiles * s > warps:
        return 0
    h = m * 2 * min(s, 1 + -(-(block_warps - 1) // tiles)) * per
    return h if h <= LOCAL_HOLES else 0


# Note: at M = 1 (at M = 2: ``picks_by_cost``) ``decode`` and ``decode_wide`` are picked by ``decode_cost``: their
# plan's rounds x (slices per split + ITEM_COST) times the block's warps (slices per SM at a rate both share), times
# GLOBAL_SETTLE_COST where the plan settles split-K partials globally (fit: tuning/h200.json, commit 1ea5ac3).
GLOBAL_SETTLE_COST = _TUNING["global_settle_cost"]


def decode_cost(m: int, n: int, k: int, blocks: int, block_warps: int, clusters: dict[int, int] | None = None,
                pair: bool = False) -> float:
    """The model cost of the decode kernel of ``block_warps`` warps on ``blocks`` resident blocks for this weight (its
    default plan, block-local where ``local_plan`` takes it): see GLOBAL_SETTLE_COST. ``pair``: the pair-column build
    (two holes per block-local item, no staged x)."""
    return _decode_plan(m, n, k, blocks, block_warps, clusters, pair)[0]


def settles_globally(m: int, n: int, k: int, blocks: int, block_warps: int, clusters: dict[int, int] | None = None,
                     pair: bool = False) -> bool:
    """Whether that default plan splits K with the global settle (no block-local plan)."""
    return _decode_plan(m, n, k, blocks, block_warps, clusters, pair)[1]


def _decode_plan(m: int, n: int, k: int, blocks: int, block_warps: int, clusters: dict[int, int] | None,
                 pair: bool) -> tuple[float, bool]:
    s, per = plan(m, n, k, blocks * block_warps, split_cost=DECODE_SPLIT_COST)
    tiles = -(-n // 16)
    lp = local_plan(n, k, blocks, block_warps, s, per, clusters,
                    holes=LOCAL_HOLES // PAIR_ITEM_HOLES if pair else LOCAL_HOLES - x_holes(m, k),
                    stage_m=0 if pair else split_stage_m(m, k))
    if lp is not None:
        _, p, tpb, c, ls = lp
        rounds = -(-tiles // (local_groups(blocks, c, clusters or {}) * tpb))
        return rounds * (p + ITEM_COST) * block_warps * (STAGED_X_GAIN if ls else 1.0), False
    rounds = -(-tiles * s // (blocks * block_warps))
    gain = STAGED_X_GAIN if not pair and global_split_holes(m, n, k, blocks * block_warps, block_warps, s, per) else 1.0
    return rounds * (per + ITEM_COST) * block_warps * (GLOBAL_SETTLE_COST if s > 1 else 1.0) * gain, s > 1


# Note: what one more split-K part costs in ``plan``'s score (a share of the workers' balance): SPLIT_COST, and more
# for the decode kernels (float32 partials, the settle, a statistics phase per item): DECODE_SPLIT_COST
# (tuning/h200.json, commit f5796dc).
SPLIT_COST = _TUNING["split_cost"]
DECODE_SPLIT_COST = _TUNING["decode_split_cost"]


@functools.lru_cache(maxsize=4096)  # pure; called once per launch
def plan(m: int, n: int, k: int, warps: int, allow_split: bool = True, rows: int = 16,
         split_cost: float = SPLIT_COST) -> tuple[int, int]:
    """(splits, slices per split): enough work items (``rows`` weight rows x a K range each) that ``warps``
    persistent workers finish within ~5% of each other, each split beyond the first costing ``split_cost`` of that
    balance."""
    tiles = -(-n // rows)
    slices = -(-k // SLICE)
    best = (1, slices)
    if not allow_split:
        return best
    best_score = None
    for s in range(1, 17):
        per = -(-slices // s)
        if per < 4 and s > 1:
            break
        s_eff = -(-slices // per)
        items = tiles * s_eff
        rounds = -(-items // warps)
        balance = items / (rounds * warps)
        score = balance - split_cost * (s_eff - 1)  # partial sums cost traffic and a reduction
        if best_score is None or score > best_score + 1e-9:
            best, best_score = (s_eff, per), score
    return best


# Block-local split-K of the decode kernel (gemv_mma.cu, Params::local): the S parts of a 16-row tile run on S warps of
# one block and are added in shared memory after a block barrier, instead of the fence, atomic counter and float32
# partials in global memory of the settle (which costs 2.3-7 us per call at M = 1 on the H200, measured with the settle
# compiled out; commit 120fef6). A block then takes U / S whole tiles per round (U <= its warps), so some splits leave
# warps idle; ``local_plan`` takes it only where its rounds x (slices per split + ITEM_COST) are no more than the global
# plan's (ITEM_COST: a work item's own statistics phase and start, in slices).
LOCAL_HOLES = 256  # partial-sum slots per block (the table's free halves, less x_holes): rounds x warps must fit
# The decode kernels (M <= 2) stage x once per block in the top holes (gemv_mma.cu kXs) where it takes at most
# X_HOLES_MAX of them (M = 1: K <= 11264; M = 2: K <= 5632), instead of loading it into registers a slice ahead.
X_HOLES_MAX = 176
# Cluster sizes the block-local split-K may also share a round's tiles over (gemv_mma.cu kLocal = 2: the partials read
# over distributed shared memory): pairs of blocks let 20-warp blocks hold S = 8 parts of 5 tiles per pair (Qwen o 320
# tiles: 264 per round in single blocks). H200, two rounds (commit dab2532): Qwen o 14.3 vs 15.0 us without clusters,
# Qwen gate+up 31.7 vs 33.3, Qwen down 30.9 vs 31.5, the rest unchanged; clusters of 4 (30 resident, 120 blocks) are
# taken by no plan and measured slower where forced.
LOCAL_CLUSTERS = (2,)
CLUSTER_SIZES = range(2, 9)  # the sizes whose resident clusters the library is asked for (forced plans: any)


ITEM_COST = 1


# x too large to stage whole (the down projections) can still be staged by the blocks of a split-major cluster plan
# (each block holds whole splits, so needs only their part of K: gemv_mma.cu Params.lsplit); ``local_plan`` counts such
# a plan at STAGED_X_GAIN of its cost (staged x measured 4-14% faster at M = 1: commit c82a480).
STAGED_X_GAIN = _TUNING["staged_x_gain"]


def split_stage_m(m: int, k: int) -> int:
    """M where x of M rows could be staged by split-major cluster blocks although not whole (else 0)."""
    return m if m <= 2 and k % SLICE == 0 and x_holes(m, k) == 0 else 0


def x_holes(m: int, k: int) -> int:
    """Holes of the decode kernel's table that x takes when staged (two per 128-wide slice and row), or 0 where it
    stays in registers (too large, or K % 128 != 0: the staged build drops the K bound of the weight copies)."""
    h = m * 2 * (k // SLICE)
    return h if m <= 2 and k % SLICE == 0 and h <= X_HOLES_MAX else 0


def local_groups(blocks: int, c: int, clusters: dict[int, int]) -> int:
    """Blocks (c = 1) or clusters of c blocks in a block-local grid of at most ``blocks`` blocks, the clusters no
    more than ``clusters[c]`` (resident at once)."""
    return blocks if c == 1 else min(clusters.get(c, 0), blocks // c)


def local_plan(n: int, k: int, blocks: int, block_warps: int, splits: int, per: int,
               clusters: dict[int, int] | None = None, holes: int = LOCAL_HOLES,
               stage_m: int = 0) -> tuple[int, int, int, int, int] | None:
    """(S, slices per split, tiles per block or cluster and round, blocks per cluster) of the block-local split-K
    for ``blocks`` resident blocks of ``block_warps`` warps, or None where the global plan (``splits``, ``per``)
    costs less (or does not split). ``clusters`` = {C: clusters of C blocks resident at once} adds plans whose tiles
    are shared by the C blocks of a thread block cluster (C warps x as many per tile round). The least cost per warp
    (rounds x (slices per split + ITEM_COST)); among equals no cluster, then the fewest parts. ``holes``: partial-sum
    slots per block (LOCAL_HOLES less the staged x's ``x_holes``). ``stage_m`` > 0 (``split_stage_m``): also the
    split-major cluster plans whose blocks can stage their part of x of that many rows (their holes and the partial
    sums' fitting), at STAGED_X_GAIN of the cost; the fifth element says split-major (1) or not (0)."""
    return _local_plan(n, k, blocks, block_warps, splits, per, tuple(sorted((clusters or {}).items())), holes,
                       stage_m)


@functools.lru_cache(maxsize=4096)  # pure; asked by every Prepared (a launch of ``launch`` without a kept Prepared)
def _local_plan(n: int, k: int, blocks: int, block_warps: int, splits: int, per: int,
                cluster_items: tuple[tuple[int, int], ...], holes: int,
                stage_m: int) -> tuple[int, int, int, int, int] | None:
    if splits <= 1:
        return None
    clusters = dict(cluster_items)
    tiles, slices = -(-n // 16), -(-k // SLICE)
    global_cost = -(-tiles * splits // (blocks * block_warps)) * (per + ITEM_COST)
    best = None
    for c in sorted({1, *clusters}):
        groups = local_groups(blocks, c, clusters)
        if groups < 1:
            continue
        for s in range(2, min(16, c * block_warps) + 1):
            p = -(-slices // s)
            if p < 4 or -(-slices // p) != s:
                continue
            tpb = c * block_warps // s
            rounds = -(-tiles // (groups * tpb))
            if rounds * block_warps > holes:
                continue
            cost = rounds * (p + ITEM_COST)
            if best is None or cost < best[0]:
                best = (cost, s, p, tpb, c, 0)
            # split-major: each block holds block_warps / tpb whole splits and stages their part of x
            if (stage_m and c > 1 and tpb * s == c * block_warps and block_warps % tpb == 0 and
                    rounds * block_warps + stage_m * 2 * (block_warps // tpb) * p <= holes):
                if cost * STAGED_X_GAIN < best[0]:
                    best = (cost * STAGED_X_GAIN, s, p, tpb, c, 1)
    return best[1:] if best is not None and best[0] <= global_cost else None


class Prepared:
    """One weight's launch for a fixed M, dtype and bias: the plan, the grid and the kernel arguments worked out
    once, so that a call only fills in x, y and the split-K workspace and launches (~10 us of host time instead
    of ~25 us for working it all out again; ``ops/matmul/eager.py`` keeps these per weight)."""

    __slots__ = ("lib", "index", "m", "n", "dtype", "dt", "v", "vid", "nested", "grid", "splits", "params", "device",
                 "pdl", "local")

    def __init__(self, x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset,
                 nested_blocksize, bias, splits: tuple[int, int] | None = None, kernel: str | int | None = None,
                 local: bool | None = None, local_cluster: int | None = None, local_split: bool = False,
                 stage_x: bool = True):
        index = _index(x2d.device)
        lib = _lib_for(index)
        m = x2d.shape[0]
        nested = nested_code is not None
        dt = _DTYPES[x2d.dtype]
        if isinstance(kernel, int):
            kernel = BUILDS[kernel]  # (a build number, as gemv_mma.cu's ``pick`` counts them)
        v = choose(m, n, k, x2d.element_size()) if kernel is None else kernel
        if (kernel is None and v == DECODE and local is not False and lib.occupancy[(dt, DECODE, int(nested))] > 0
                and wide_above_max(m, n, k, lib.sms * lib.occupancy[(dt, DECODE, int(nested))], lib.warps[DECODE])):
            v = DECODE_WIDE
        occ20 = lib.occupancy[(dt, DECODE_WIDE, int(nested))]
        if kernel is None and picks_by_cost(m, n, k) and v in (DECODE, DECODE_WIDE) and local is not False:
            occ16 = lib.occupancy[(dt, DECODE, int(nested))]
            if occ16 > 0 and occ20 > 0:  # the cheaper of the two by ``decode_cost``
                costs = {w: decode_cost(m, n, k, lib.sms * o, lib.warps[w],
                                        {c: lib.clusters.get((dt, w, int(nested), c), 0) for c in LOCAL_CLUSTERS})
                         for w, o in ((DECODE, occ16), (DECODE_WIDE, occ20))}
                v = DECODE if costs[DECODE] <= costs[DECODE_WIDE] else DECODE_WIDE
        if kernel is None and v == DECODE_WIDE and lib.occupancy[(dt, v, int(nested))] <= 0:
            v = build(m)  # (a GPU where the 20-warp block does not fit)
        if kernel is None and pair_wanted(m, n, k, blocksize):
            v = _pick_pair(lib, m, n, k, dt, nested)
        if (kernel is None and local is None and splits is None and local_cluster is None and words_fit(absmax)
                and burst_wanted(m, n, k, blocksize) and lib.occupancy[(dt, BURST, int(nested))] > 0):
            v = BURST  # (forced plans of the decode kernels keep them; statistics off 4-byte word boundaries too)
        if v == SPLIT and m > 2:
            raise ValueError("gemv_mma: the split small-weight kernel takes M = 1 or 2")
        if v in (SMALL, SPLIT):
            if not small_fits(m, k, x2d.element_size()):
                raise ValueError(f"gemv_mma: the small-weight kernel takes M <= 2 and M * K <= {SMALL_X_BYTES // 2}")
            splits = (1, -(-k // SLICE))  # whole rows per block, no split-K across blocks
        if v == BURST:
            if not (m <= 2 and blocksize >= 64 and k % 256 == 0 and m * k <= 16384 and n * k < 2**31 and
                    words_fit(absmax)):
                raise ValueError("gemv_mma: the burst kernel takes M <= 2, blocksize >= 64, K % 256 == 0, "
                                 "M * K <= 16384, N * K < 2^31 and statistics that start and end on 4-byte "
                                 "boundaries")
            splits = (1, -(-k // SLICE))  # one tile per block at a time over all of K
        occ = lib.occupancy[(dt, v, int(nested))]
        if occ <= 0:
            raise RuntimeError("gemv_mma kernel cannot be resident on this GPU")
        sms = lib.sms
        counters = _counters_for(index)
        tiles = -(-n // 16)
        rows = lib.rows[v]
        # the decode kernel's workers are warps (one 16-row item each), the GEMM kernel's are blocks
        per_block = lib.warps[v] if rows == 16 else 1
        pair = v in (PAIR, PAIR_WIDE)
        if pair and (m > 4 or blocksize < 64 or k % 64):
            raise ValueError("gemv_mma: the pair-column decode kernel takes M <= 4, blocksize >= 64, K % 64 == 0")
        decode = (m <= 2 and v in (DECODE, DECODE_WIDE)) or pair
        cost = DECODE_SPLIT_COST if decode else SPLIT_COST
        # staged x: the plans leave its holes free in every build; only builds that have it are told to use it (the
        # pair-column builds: none); stage_x=False (forced plans) keeps x in registers
        xh = x_holes(m, k) if decode and not pair and stage_x else 0
        # block-local partial-sum slots per block (a pair-column item takes two holes)
        slots = (LOCAL_HOLES - xh) // (PAIR_ITEM_HOLES if pair else 1)
        tpb = 0  # tiles per block (cluster) and round of the block-local split-K (0: off)
        lc = 1   # blocks per cluster sharing them
        ls = 0   # 1: split-major clusters (each block holds whole splits and stages only their part of x)
        clusters = {c: lib.clusters.get((dt, v, int(nested), c), 0) for c in LOCAL_CLUSTERS} if decode else {}
        if local_cluster is not None and local_cluster > 1 and decode:  # a forced size, also one the plans skip
            clusters[local_cluster] = lib.clusters.get((dt, v, int(nested), local_cluster), 0)
        if decode and local is not False and splits is None:
            s, per = plan(m, n, k, sms * occ * per_block, rows=rows, split_cost=cost)
            lp = local_plan(n, k, sms * occ, per_block, s, per, clusters if local_cluster is None else
                            {c: r for c, r in clusters.items() if c == local_cluster}, holes=slots,
                            stage_m=split_stage_m(m, k) if decode and not pair and stage_x else 0)
            if lp is not None:
                s, per, tpb, lc, ls = lp
            elif local:
                raise ValueError("gemv_mma: no block-local split-K plan for this weight")
        elif local:
            if not decode or splits is None:
                raise ValueError("gemv_mma: the block-local split-K is the decode kernel's (M <= 2)")
            s, per = splits
            lc = local_cluster or 1
            groups = local_groups(sms * occ, lc, clusters)
            tpb = lc * per_block // s if 1 < s <= lc * per_block and groups > 0 else 0
            if tpb == 0 or -(-tiles // (groups * tpb)) * per_block > slots:
                raise ValueError(f"gemv_mma: no block-local split-K of {s} parts in clusters of {lc} here")
            ls = int(bool(local_split))
            if ls and pair:
                raise ValueError("gemv_mma: the pair-column decode kernel has no split-major plans")
            if ls and (lc < 2 or tpb * s != lc * per_block or per_block % tpb):
                raise ValueError(f"gemv_mma: no split-major block-local split-K of {s} parts in clusters of {lc}")
        if tpb == 0:
            s, per = splits or plan(m, n, k, sms * occ * per_block,
                                    allow_split=counters is not None and tiles <= _COUNTERS, rows=rows,
                                    split_cost=cost)
        per = max(1, min(int(per), -(-k // SLICE)))
        # staged x holes: all of K (xh), or a split-major block's splits; none for splits past the end of K (only a
        # forced plan has them: their slices lie past the staged rows)
        xs = m * 2 * (per_block // tpb) * per if ls and m <= 2 and k % SLICE == 0 else xh
        if ls and tpb and -(-tiles // (local_groups(sms * occ, lc, clusters) * tpb)) * per_block + xs > LOCAL_HOLES:
            xs = 0
        if not stage_x or (s - 1) * per >= -(-k // SLICE):
            xs = 0
        # x too large to stage whole, global split-K with one item per warp: split-major items (gemv_mma.cu
        # Params.gsplit), so that each block stages only the one or two splits its warps take
        gs = 0
        if decode and not pair and tpb == 0 and stage_x:
            gh = global_split_holes(m, n, k, sms * occ * per_block, per_block, s, per)
            if gh:
                xs, gs = gh, 1
        if s < 1 or (s > 1 and tpb == 0 and (counters is None or tiles > _COUNTERS)):
            raise ValueError(f"gemv_mma: split-K of {s} is not possible here")
        items = -(-n // rows) * s
        self.lib, self.index, self.m, self.n, self.dtype, self.dt, self.v = lib, index, m, n, x2d.dtype, dt, v
        self.vid = BUILD_IDS[v]  # gemv_mma.cu's number of the build
        self.nested, self.splits, self.device = int(nested), s, x2d.device
        # PDL for these kernels is opt-in (FASTNF4_PDL_MMA=1): back to back it saves ~0.7-1.5 us per call, but a
        # graph-captured Qwen3-32B decode step at batch 1 measured 1.5-2% slower with it (NOTES.md, commit
        # f4b57ff)
        self.pdl = int(os.environ.get("FASTNF4_PDL_MMA", "0") == "1" and _triton.pdl(x2d.device, triton_kernel=False))
        # the split small-weight kernel launches every row block at once (a persistent grid of it measured up to 2 us
        # slower on Gemma q, 512 row blocks on 396 slots; 22a8dd2:NOTES.md)
        if tpb:  # whole clusters (lc = 1: blocks), no more than are resident nor than the tiles need
            self.grid = min(local_groups(sms * occ, lc, clusters), -(-tiles // tpb)) * lc
        elif v == BURST:  # persistent blocks, one tile each at a time
            self.grid = min(sms * occ, tiles)
        else:
            self.grid = -(-items // per_block) if v == SPLIT else min(sms * occ, -(-items // per_block))
        self.params = Params(
            packed=packed.data_ptr(), absmax=absmax.data_ptr(),
            nested_code=nested_code.data_ptr() if nested else None,
            nested_absmax=nested_absmax.data_ptr() if nested else None,
            offset=offset.data_ptr() if nested else None, x=None,
            bias=bias.data_ptr() if bias is not None else None, y=None, partial=None,
            counters=counters.data_ptr() if counters is not None else None,
            M=m, N=n, K=k, blocksize=blocksize, splits=s, slices_per_split=per,
            code=code.data_ptr(), code_const=int(bool(self.pdl) and codebooks.is_kernel_code(code)),  # PDL only
            local=tpb * s, lcluster=lc, xs=xs, lsplit=ls if tpb else 0, gsplit=gs,
        )
        self.local = tpb > 0

    def __call__(self, x2d: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """y [M, N] = x2d [M, K] (contiguous, 16-byte aligned, on this device) times the weight; no checks here."""
        m, n = self.m, self.n
        if y is None:
            y = torch.empty(m, n, dtype=self.dtype, device=self.device)
        p = Params.from_buffer_copy(self.params)  # a copy per call: ctypes drops the GIL during the launch
        p.x, p.y = x2d.data_ptr(), y.data_ptr()
        partial = None  # held until the launch is queued; the stream-ordered allocator keeps it for the kernel
        if self.splits > 1 and not self.local:
            partial = torch.empty(self.splits, m, n, dtype=torch.float32, device=self.device)
            p.partial = partial.data_ptr()
        rc = self.lib.lib.fastnf4_gemv_mma(ctypes.byref(p), self.dt, self.vid, self.nested, self.grid,
                                           torch._C._cuda_getCurrentRawStream(self.index), self.pdl)
        if rc != 0:
            raise RuntimeError(f"gemv_mma launch failed (cudaError {rc})")
        return y


def _pick_pair(lib: _Lib, m: int, n: int, k: int, dt: int, nested: bool) -> int:
    """The pair-column decode build of 16 or 20 warps (the one that fits, else the cheaper by ``decode_cost``), or
    ``build(m)`` where neither fits."""
    occ = {v: lib.occupancy[(dt, v, int(nested))] for v in (PAIR, PAIR_WIDE)}
    if min(occ.values()) <= 0:
        return PAIR if occ[PAIR] > 0 else PAIR_WIDE if occ[PAIR_WIDE] > 0 else build(m)
    plans = {v: _decode_plan(m, n, k, lib.sms * o, lib.warps[v],
                             {c: lib.clusters.get((dt, v, int(nested), c), 0) for c in LOCAL_CLUSTERS}, True)
             for v, o in occ.items()}
    return pick_pair_build(plans[PAIR][0], plans[PAIR_WIDE][0], plans[PAIR_WIDE][1])


def launch(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias,
           y: torch.Tensor | None = None, splits: tuple[int, int] | None = None,
           kernel: str | int | None = None, local: bool | None = None, local_cluster: int | None = None,
           local_split: bool = False, stage_x: bool = True) -> torch.Tensor:
    """``splits`` = (S, slices per split) / ``kernel`` (a name of ``BUILDS``) / ``local`` / ``local_cluster`` force
    a plan (tests, tools):
    ``local`` True the block-local split-K of the decode kernel (with ``splits``, else its own plan; ValueError where
    it cannot), False the global settle, None: ``local_plan`` decides; ``local_cluster`` = C its tiles shared by
    clusters of C blocks (1: none; with ``splits`` and ``local``, or limiting ``local_plan`` to C); ``local_split``
    (with ``splits``, ``local`` and C > 1) the cluster's warps split-major; ``stage_x`` False keeps x in registers
    (the decode kernels' plan without the staged-x holes: no staged x, no split-major x of any form)."""
    return Prepared(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                    bias, splits, kernel, local, local_cluster, local_split, stage_x)(x2d, y)
