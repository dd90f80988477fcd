"""Host side of ``gemv_mma.cu``: the decode-size (M <= 32) tensor-core matmuls, launched through ctypes.

``supports`` says whether a call can take this kernel; ``launch`` runs it on the current stream (no host
synchronisation; capturable in a CUDA graph once the library is loaded and the split-K counters exist).
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from ... import _cuda, _triton, codebooks

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
        self.warps = {v: lib.fastnf4_gemv_mma_warps(v) for v in VARIANTS}  # per block
        self.rows = {v: lib.fastnf4_gemv_mma_rows(v) for v in VARIANTS}  # weight rows per work item
        if lib.fastnf4_gemv_mma_params_size() != ctypes.sizeof(Params):
            raise RuntimeError("gemv_mma.cu Params layout differs from the ctypes mirror")
        # Ask every kernel's occupancy now: it loads the module, so later launches (maybe inside a CUDA-graph
        # capture) never trigger lazy loading.
        self.occupancy = {(d, v, nested): lib.fastnf4_gemv_mma_occupancy(d, v, nested)
                          for d in (0, 1) for v in VARIANTS for nested in (0, 1)}
        lib.fastnf4_gemv_mma_clusters.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.fastnf4_gemv_mma_clusters.restype = ctypes.c_int
        # clusters of the decode kernels' block-local build resident at once (for local_plan), asked now
        self.clusters = {(d, v, nested, c): lib.fastnf4_gemv_mma_clusters(d, v, nested, c)
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
    """Whether a pair-column decode kernel fits on this GPU (else ``Prepared`` falls back to ``variant(m)``, so the
    dispatcher keeps its other rules)."""
    lib = _lib_for(_index(x2d.device))
    dt = _DTYPES[x2d.dtype]
    return lib is not None and max(lib.occupancy[(dt, v, int(nested))] for v in (PAIR, PAIR_WIDE)) > 0


def _resident(x2d: torch.Tensor, m: int, nested: bool) -> bool:
    # built here, and the kernel for this M fits on this GPU (the kernels ask for 150-200 KiB of shared memory
    # per block: Hopper and A100 class; smaller parts take the Triton paths)
    lib = _lib_for(_index(x2d.device))
    return lib is not None and lib.occupancy[(_DTYPES[x2d.dtype], variant(m), int(nested))] > 0


VARIANTS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
SMALL = 4  # the small-weight decode kernel (CUDA cores, one warp per row; gemv_small in gemv_mma.cu)
SPLIT = 6  # the M <= 2 small-weight kernel (CUDA cores, rows split over warp pairs; gemv_split in gemv_mma.cu)
DECODE_WIDE = 5  # the decode kernel with 20 warps x 4 ring stages per block instead of 16 x 6
# the decode kernels (16 / 20 warps) with pair columns: M <= 4 where blocksize >= 64 and K % 64 == 0 (gemv_mma.cu kPair;
# x in registers; a block-local work item's partial sums take two holes)
PAIR, PAIR_WIDE = 7, 8
PAIR_ITEM_HOLES = 2  # holes a block-local work item's partial sums take in the pair builds (gemv_mma.cu slot_at)
BURST = 9  # the burst decode kernel (M <= 2; small persistent blocks, loads into registers: gemv_burst in gemv_mma.cu)
DECODES = (0, DECODE_WIDE, PAIR, PAIR_WIDE)
# M <= 2 weights of at most WIDE_MAX_ELEMS elements take DECODE_WIDE (20 warps x 4 stages against 16 x 6): on the H200
# it is faster on every weight of <= 84M elements at M = 1 (Qwen o 15.0 vs 18.6 us, Llama qkv 22.3 vs 23.9, Gemma o
# equal; also at 1455 MHz: Qwen q 16.7 vs 20.5) and at M = 2 (Qwen q 13.7 vs 15.0, Llama qkv 21.6 vs 21.8), and mixed
# above (Llama gate_up 100.4 vs 96.7, Qwen gate+up 37.5 vs 35.2; commit 5b2d3af). Above it, ``wide_above_max`` decides.
WIDE_MAX_ELEMS = 96 * 2**20
SMALL_X_BYTES = 32 * 1024  # its x staging: M * K * 2 bytes must fit (small::kXBytes)
# At M = 2 the split kernel's M = 2 build (both x rows per lookup) takes weights of at most this many elements (N * K):
# H200, Llama k+v 7.0 us and Qwen k+v 5.5 against 10.9 / 8.1 on the one-warp-per-row small-weight kernel
# (results/h200-probe-decode-split-m2.txt); Gemma k+v (11M) stays on the 20-warp decode kernel (7.4 against 8.6 split),
# as do Gemma q / o (9.1 / 11.4 against 14.5 / 15.3).
SMALL_MAX_ELEMS = 9 * 2**20
# At M = 1 the split kernel (2 warps x 2 rows x 4 chunks per row and round; x staged the same way) takes the weights of
# at most this many elements: H200, the k/v projections (<= 11M elements) 4.9-6.9 us against 6.3-52.5 on the decode
# kernels; above 16M the decode kernels win (Gemma o, 22M: 10.1-10.2 us on 16 warps, 10.7 on 20, 11.4 split; Gemma q 8.4
# on 16 warps against 11.2 split; results/h200-probe-decode-small-m1.txt, commit ed3b0b1).
SPLIT_MAX_ELEMS = 16 * 2**20


def variant(m: int) -> int:
    """Kernel variant for M rows: 0 the decode kernel (M <= 2), 1 / 2 / 3 the GEMM kernel (M <= 8 / 16 / 32);
    see ``pick`` in gemv_mma.cu. ``choose`` may take the small-weight kernel instead."""
    return 0 if m <= 2 else 1 if m <= 8 else 2 if m <= 16 else 3


def small_fits(m: int, k: int, elem_bytes: int) -> bool:
    return m <= 2 and m * k * elem_bytes <= SMALL_X_BYTES


def choose(m: int, n: int, k: int, elem_bytes: int) -> int:
    """The variant a call takes by its size: the split small-weight kernel for small weights at M = 1 and the
    smallest at M = 2, the 20-warp decode kernel for mid-size weights at M <= 2, else ``variant(m)`` (``Prepared`` may
    still move a large weight at M <= 2 to the 20-warp kernel: ``wide_above_max``, and picks 16 or 20 warps by
    ``decode_cost`` where ``picks_by_cost``). The one-warp-per-row
    small-weight kernel (SMALL) is no longer chosen by size (session 24); it stays for forced calls."""
    if m == 1 and n * k <= SPLIT_MAX_ELEMS and small_fits(m, k, elem_bytes):
        return SPLIT
    if m == 2 and n * k <= SMALL_MAX_ELEMS and small_fits(m, k, elem_bytes):
        return SPLIT
    if m <= 2 and n * k <= WIDE_MAX_ELEMS:
        return DECODE_WIDE
    return variant(m)


# M 3-4: the pair-column decode kernels (gemv_mma.cu kPair) on weights of at least PAIR_MIN_ELEMS elements, where a
# 64-code chunk pair lies in one quantization block (blocksize >= 64, K % 64 == 0). H200, interleaved graph timing, us
# at M = 3 / 4, against the wgmma kernel's 8-row x tiles (results/h200-probe-pair-cols-local.json): faster on all 20
# model weights at M = 3 (1.01-1.53x: Llama gate_up 102.2 vs 129.6, Gemma k+v 7.6 vs 11.6, Gemma o 13.0 vs 13.1) and on
# 19 at M = 4 (1.02-1.50x; Gemma o 13.6 vs 13.1). Below the k+v projections' 5M elements: not measured, so the other
# paths.
PAIR_MIN_ELEMS = 4 * 2**20
# 16 or 20 warps: the cheaper by ``decode_cost`` (pair = True), the 20-warp build's cost scaled by PAIR_WIDE_FACTOR
# unless its plan settles globally (``settles_globally``). In those runs the unscaled model picked the slower build on 9
# of 20 weights (up to 11%: Qwen q 15.3 vs 13.8 us at M = 3); the 20-warp build with a block-local plan ran faster than
# its cost said wherever the two costs were within ~8%, but where both builds settle globally (Gemma o and down: 336
# row tiles, no block-local plan) the 16-warp one was faster (12.8 / 13.2 vs 13.0 / 13.6 us, 31.7 / 33.7 vs 32.1 /
# 34.3 at M = 3 / 4). So the pick is within 3% of the faster build on all 40 (weight, M) (Llama gate_up 102.2 vs
# 99.3), 0.3% on average. The k+v projections' 20-warp plans (unsplit: 1300 against 80) stay far off.
PAIR_WIDE_FACTOR = 0.92


def pick_pair_build(cost16: float, cost20: float, global20: bool) -> int:
    """PAIR or PAIR_WIDE from the two builds' ``decode_cost`` and whether the 20-warp plan settles globally."""
    return PAIR_WIDE if cost20 * (1.0 if global20 else PAIR_WIDE_FACTOR) <= cost16 else PAIR


def pair_wanted(m: int, n: int, k: int, blocksize: int) -> bool:
    """Whether a call at M 3-4 takes the pair-column decode kernel (see PAIR_MIN_ELEMS)."""
    return 3 <= m <= 4 and blocksize >= 64 and k % 64 == 0 and n * k >= PAIR_MIN_ELEMS


# M <= 2: the burst decode kernel (gemv_mma.cu, namespace burst) on weights of BURST_MIN_ELEMS to BURST_MAX_ELEMS
# elements with N >= BURST_MIN_N, where its layout holds (K % 256 == 0, blocksize >= 64, M K <= 16384). H200,
# interleaved graph timing against fastnf4.linear (results/h200-probe-burst-m1.json / -m2.json), us at M = 1 / 2, burst
# vs the decode kernels: Gemma q (4096 x 5376) 8.3 vs 8.9 / 8.7 vs 9.1, Gemma o (5376 x 4096) 8.3 vs 10.3 / 8.8 vs 10.6,
# Gemma k+v (2048 x 5376) 6.7 vs 7.2 / 7.0 vs 7.2. Slower on the N = 1024 k+v projections at M = 1 (Llama 7.6 vs 6.3,
# Qwen 5.9 vs 5.3) and from 42M elements up (Qwen q 13.0 vs 11.8, Gemma qkv 14.0 vs 12.4): one tile per block over all
# of K has no split-K to balance the last wave.
BURST_MIN_ELEMS = 8 * 2**20
BURST_MAX_ELEMS = 24 * 2**20
BURST_MIN_N = 2048


def words_fit(absmax: torch.Tensor) -> bool:
    """Whether the burst kernel's reads of whole aligned 4-byte statistics words stay inside ``absmax``: the array
    starts and ends on 4-byte boundaries. (compute-sanitizer reported the last word of an odd count of 8-bit codes,
    17 x 256 / 128, as a read past the allocation: benchmarks/sanitize.py, session 37.)"""
    start = absmax.data_ptr()
    return start % 4 == 0 and (start + absmax.numel() * absmax.element_size()) % 4 == 0


def burst_wanted(m: int, n: int, k: int, blocksize: int) -> bool:
    """Whether a call at M <= 2 takes the burst decode kernel (see BURST_MIN_ELEMS)."""
    return (m <= 2 and blocksize >= 64 and k % 256 == 0 and m * k <= 16384 and n >= BURST_MIN_N and
            BURST_MIN_ELEMS <= n * k <= BURST_MAX_ELEMS)


def picks_by_cost(m: int, n: int, k: int) -> bool:
    """Whether ``Prepared`` lets ``decode_cost`` pick between the 16- and 20-warp decode kernels for this call: at
    M = 1 everywhere (session 21), and since session 26 at M = 2 on the weights ``choose`` gives the 20-warp kernel by
    size (<= WIDE_MAX_ELEMS). H200, probe_decode.py 0 w n at FASTNF4_PROBE_M=2, sets mid and small, two
    rounds equal within 0.2 us (results/h200-probe-decode-m2-wn.txt), us 20 / 16 warps: Gemma q 9.3 / 8.9, o 11.1 /
    10.5, qkv 13.1 / 12.6, k+v 7.5 / 7.0 (16 picked), Qwen o 13.7 / 15.6 (20 picked), Llama q+o 17.3 / 17.4 and Qwen q
    12.0 / 12.0 (ties; 16 picked); the larger weights keep ``wide_above_max`` at M = 2."""
    return m == 1 or (m == 2 and n * k <= WIDE_MAX_ELEMS)


def wide_above_max(m: int, n: int, k: int, blocks: int, block_warps: int) -> bool:
    """Whether a weight of more than WIDE_MAX_ELEMS elements at M <= 2 takes the 20-warp decode kernel: where the
    16-warp kernel's plan (``blocks`` resident blocks of ``block_warps`` warps) has no block-local split-K, so pays
    the global settle or runs unsplit. H200 (probe_decode.py 0 w, FASTNF4_PROBE_SET=big, two rounds, session 19), us
    at M = 1 (M = 2) 16 -> 20 warps: Qwen down 32.7 -> 31.7 (33.5 -> 32.5), Qwen gate+up 35.2 -> 33.4 (36.4 -> 34.5),
    Llama gate+up 52.6 -> 51.1 (54.8 -> 53.7), Gemma gate_up 52.7 -> 50.6 (54.1 -> 53.7), but Gemma gate+up 30.1 ->
    30.6 (30.6 -> 31.5) and Gemma down 28.7 -> 29.3 (29.6 -> 30.3); where the 16-warp plan is block-local, 16 warps
    stayed ahead (Llama gate_up 89.9 vs 92.8, Qwen gate_up 54.0 vs 55.6, Llama down 47.7 vs 47.9)."""
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


# At M = 1 the two decode kernels are picked by ``decode_cost`` (at M = 2: ``picks_by_cost``): their plan's slices per
# warp (rounds x (slices per split + ITEM_COST)) times the block's warps, i.e. slices per SM at a rate the two kernels
# share, x GLOBAL_SETTLE_COST where the plan has global split-K partials. H200, 15 weights, two rounds (commit 1ea5ac3):
# the cost ratio names the faster kernel on 13 (the misses: Qwen q 11.8 vs 12.2 us, Llama down 47.4 vs 47.5); the settle
# factor fits Qwen gate+up (global 16-warp 30.8 vs block-local 20-warp 28.4 us), Gemma gate+up (26.0 vs 27.2) and Gemma
# gate_up (45.9 vs 44.7).
GLOBAL_SETTLE_COST = 1.17


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


# What one more split-K part costs in ``plan``'s score (a share of the workers' balance): SPLIT_COST by default; the
# decode kernel (M <= 2) pays more per split (float32 partial sums, the settle, a statistics phase per work item). H200,
# every split count 1-16 on 12 weights of 21-242 MB (commit f5796dc): with 0.03 the plan takes the fastest split or one
# within 3% on all 12; with 0.01 it takes 7 splits for Llama gate+up (28672 x 8192: 59.5 us against 52.5 without
# split-K). At M = 2 (13 weights) 0.03 picks a faster plan than 0.01 on four and the same on nine (Llama gate+up 1 split
# against 7: 55.1 vs 61.4 us).
SPLIT_COST = 0.01
DECODE_SPLIT_COST = 0.03


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
STAGED_X_GAIN = 0.9


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

    __slots__ = ("lib", "index", "m", "n", "dtype", "dt", "v", "nested", "grid", "splits", "params", "device", "pdl",
                 "local")

    def __init__(self, x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset,
                 nested_blocksize, bias, splits: tuple[int, int] | None = None, kernel: int | None = None,
                 local: bool | None = None, local_cluster: int | None = None, local_split: bool = False,
                 stage_x: bool = True):
        index = _index(x2d.device)
        lib = _lib_for(index)
        m = x2d.shape[0]
        nested = nested_code is not None
        dt = _DTYPES[x2d.dtype]
        v = choose(m, n, k, x2d.element_size()) if kernel is None else kernel
        if (kernel is None and v == 0 and local is not False and lib.occupancy[(dt, 0, int(nested))] > 0 and
                wide_above_max(m, n, k, lib.sms * lib.occupancy[(dt, 0, int(nested))], lib.warps[0])):
            v = DECODE_WIDE
        occ20 = lib.occupancy[(dt, DECODE_WIDE, int(nested))]
        if kernel is None and picks_by_cost(m, n, k) and v in (0, DECODE_WIDE) and local is not False:
            occ16 = lib.occupancy[(dt, 0, int(nested))]
            if occ16 > 0 and occ20 > 0:  # the cheaper of the two by ``decode_cost``
                costs = {w: decode_cost(m, n, k, lib.sms * o, lib.warps[w],
                                        {c: lib.clusters.get((dt, w, int(nested), c), 0) for c in LOCAL_CLUSTERS})
                         for w, o in ((0, occ16), (DECODE_WIDE, occ20))}
                v = 0 if costs[0] <= costs[DECODE_WIDE] else DECODE_WIDE
        if kernel is None and v == DECODE_WIDE and lib.occupancy[(dt, v, int(nested))] <= 0:
            v = variant(m)  # (a GPU where the 20-warp block does not fit)
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
        decode = (m <= 2 and v in (0, DECODE_WIDE)) or pair
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
        self.nested, self.splits, self.device = int(nested), s, x2d.device
        # PDL for these kernels is opt-in (FASTNF4_PDL_MMA=1): back to back it saves ~0.7-1.5 us per call, but a
        # graph-captured Qwen3-32B decode step at batch 1 measured 1.5-2% slower with it (NOTES.md, "PDL for the CUDA
        # matmul kernels")
        self.pdl = int(os.environ.get("FASTNF4_PDL_MMA", "0") == "1" and _triton.pdl(x2d.device, triton_kernel=False))
        # the split small-weight kernel launches every row block at once (a persistent grid of it measured up to 2 us
        # slower on Gemma q, 512 row blocks on 396 slots: 22a8dd2:NOTES.md, "Session 14")
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
        rc = self.lib.lib.fastnf4_gemv_mma(ctypes.byref(p), self.dt, self.v, self.nested, self.grid,
                                           torch._C._cuda_getCurrentRawStream(self.index), self.pdl)
        if rc != 0:
            raise RuntimeError(f"gemv_mma launch failed (cudaError {rc})")
        return y


def _pick_pair(lib: _Lib, m: int, n: int, k: int, dt: int, nested: bool) -> int:
    """The pair-column decode kernel of 16 or 20 warps (the one that fits, else the cheaper by ``decode_cost``), or
    ``variant(m)`` where neither fits."""
    occ = {v: lib.occupancy[(dt, v, int(nested))] for v in (PAIR, PAIR_WIDE)}
    if min(occ.values()) <= 0:
        return PAIR if occ[PAIR] > 0 else PAIR_WIDE if occ[PAIR_WIDE] > 0 else variant(m)
    plans = {v: _decode_plan(m, n, k, lib.sms * o, lib.warps[v],
                             {c: lib.clusters.get((dt, v, int(nested), c), 0) for c in LOCAL_CLUSTERS}, True)
             for v, o in occ.items()}
    return pick_pair_build(plans[PAIR][0], plans[PAIR_WIDE][0], plans[PAIR_WIDE][1])


def launch(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias,
           y: torch.Tensor | None = None, splits: tuple[int, int] | None = None,
           kernel: int | None = None, local: bool | None = None, local_cluster: int | None = None,
           local_split: bool = False, stage_x: bool = True) -> torch.Tensor:
    """``splits`` = (S, slices per split) / ``kernel`` / ``local`` / ``local_cluster`` force a plan (tests, probes):
    ``local`` True the block-local split-K of the decode kernel (with ``splits``, else its own plan; ValueError where
    it cannot), False the global settle, None: ``local_plan`` decides; ``local_cluster`` = C its tiles shared by
    clusters of C blocks (1: none; with ``splits`` and ``local``, or limiting ``local_plan`` to C); ``local_split``
    (with ``splits``, ``local`` and C > 1) the cluster's warps split-major; ``stage_x`` False keeps x in registers
    (the decode kernels' plan without the staged-x holes: no staged x, no split-major x of any form)."""
    return Prepared(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                    bias, splits, kernel, local, local_cluster, local_split, stage_x)(x2d, y)
