"""Host side of ``wgmma.cu``: the batch- and prefill-size (M > 2) NF4 matmul on Hopper's warpgroup tensor cores.

Built for ``sm_90a`` only (wgmma does not exist elsewhere); ``supports`` says whether a call can take it,
``launch`` runs it on the current stream (no host synchronisation; capturable in a CUDA graph once the
library is loaded: ``supports`` loads it).
"""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from ... import _cuda
from .tuning import DEFAULT as _TUNING, LOW_BW as _TUNING_LOW_BW

SOURCE = os.path.join(os.path.dirname(__file__), "wgmma.cu")
STEP = 64          # K per pipeline step (kStep)
ROWS = 128         # weight rows per block (kBN)
# Note: the BM 128 build with 192 weight rows per block (three warpgroups; wgmma.cu Rows) takes the weights of
# N >= WIDE_MIN_N, and of N >= WIDE_LONG_K[0] where K >= WIDE_LONG_K[1] (``wide_wanted``): 6-17% faster there at M =
# 128 (fewer tiles lose on narrower weights unless a long K amortises each block's fixed cost; tuning/h200.json).
ROWS_WIDE = 192
WIDE_MIN_N = _TUNING["wgmma_wide_rows"]["min_n"]
WIDE_LONG_K = (_TUNING["wgmma_wide_rows"]["long_k_min_n"], _TUNING["wgmma_wide_rows"]["long_k_min_k"])  # (N, K)
WIDE_BM = 128      # the one BM built with ROWS_WIDE
# x rows per block of the variants built (wgmma.cu ``pick``). BM 8 (m64n8k16): 1.03-1.06x BM 16 on all 17 model weights
# of >= 8 MB at M = 4 and 8 (H200, results/h200-probe-wgmma-bm8.json)
BLOCK_M = (8, 16, 32, 64, 128, 256)
# (x rows, weight rows) per block of every build in wgmma.cu (``pick``)
BUILDS = tuple((bm, ROWS) for bm in BLOCK_M) + ((WIDE_BM, ROWS_WIDE),)
FAST_MAX_BM = 32   # x rows per block up to which the kernel decodes with rounded codes (wgmma.cu kFastMaxBM)
# the dispatcher's M buckets above BLOCK_M[-1], where its wgmma rules change (tuning: wgmma_rules, wgmma_low_bw)
WIDE_M_BUCKETS = tuple(sorted({top for top, _ in _TUNING["wgmma_rules"] if top > BLOCK_M[-1]}
                              | {_TUNING_LOW_BW["wgmma_low_bw"]["above_m"], _TUNING_LOW_BW["wgmma_low_bw"]["max_m"]}))
MAX_M = WIDE_M_BUCKETS[-1]  # the largest M the dispatcher sends here
# Split-K summed inside the kernel by thread block clusters (wgmma.cu cluster_sum): where every weight row tile is split
# in 2..CLUSTER_MAX parts (a cluster each, the portable cluster size limit) and all the clusters are resident at once,
# at BM <= CLUSTER_MAX_BM (the partial tile must fit in the table region).
CLUSTER_MAX = 8
CLUSTER_MAX_BM = 64
_DTYPES = {torch.bfloat16: 0, torch.float16: 1}


class Params(ctypes.Structure):
    _fields_ = [
        ("packed", ctypes.c_void_p), ("absmax", ctypes.c_void_p), ("nested_code", ctypes.c_void_p),
        ("nested_absmax", ctypes.c_void_p), ("offset", ctypes.c_void_p), ("code", ctypes.c_void_p),
        ("x", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("y32", ctypes.c_void_p),
        ("M", ctypes.c_longlong), ("N", ctypes.c_longlong), ("K", ctypes.c_longlong),
        ("log2_blocksize", ctypes.c_longlong), ("steps_per_split", ctypes.c_longlong),
        ("full_tiles", ctypes.c_longlong), ("tail_tiles", ctypes.c_longlong), ("cluster", ctypes.c_longlong),
    ]


class _Lib:
    def __init__(self, lib: ctypes.CDLL, index: int):
        self.lib = lib
        self.sms = torch.cuda.get_device_properties(index).multi_processor_count
        lib.fastnf4_wgmma.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        lib.fastnf4_wgmma.restype = ctypes.c_int
        lib.fastnf4_wgmma_ready.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.fastnf4_wgmma_ready.restype = ctypes.c_int
        lib.fastnf4_wgmma_params_size.restype = ctypes.c_int
        lib.fastnf4_wgmma_clusters.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.fastnf4_wgmma_clusters.restype = ctypes.c_int
        if lib.fastnf4_wgmma_params_size() != ctypes.sizeof(Params):
            raise RuntimeError("wgmma.cu Params layout differs from the ctypes mirror")
        # every variant's attributes set now: this loads the module, so a launch inside a graph capture never
        # triggers lazy loading
        # (resident blocks per SM of each (dtype, BM, nested, weight rows) build, 0 where it cannot run)
        self.ready = {(d, bm, nested, rows): lib.fastnf4_wgmma_ready(d, bm, nested, rows)
                      for d in (0, 1) for bm, rows in BUILDS for nested in (0, 1)}
        # clusters of s blocks resident at once, for the cluster split-K sum (asked now, never during a capture)
        self.clusters = {(d, bm, nested, s): lib.fastnf4_wgmma_clusters(d, bm, nested, s)
                         for d in (0, 1) for bm in BLOCK_M if bm <= CLUSTER_MAX_BM for nested in (0, 1)
                         for s in range(2, CLUSTER_MAX + 1)}


@functools.cache
def _lib_for(index: int) -> _Lib | None:
    if torch.cuda.get_device_capability(index) != (9, 0):
        return None  # wgmma is sm_90a only; other GPUs take the other paths
    lib = _cuda.load(SOURCE, torch.device("cuda", index), arch_suffix="a")  # prebuilt, else nvcc (_cuda.py)
    if lib is None:
        return None
    with torch.cuda.device(index):  # kernel attributes and occupancy are set and read per device: the current one
        return _Lib(lib, index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def stats_fit(absmax: torch.Tensor, nested: bool) -> bool:
    """Whether the kernel's copies of whole aligned statistics words (4 bytes of 8-bit codes, or 16 bytes of float
    absmax: wgmma.cu) stay inside ``absmax``: its end on such a boundary. The quantizer's arrays end there on every
    shape with N K / blocksize a multiple of 4 (every model weight); compute-sanitizer reports the others' last word
    as a read past the allocation (tools/sanitize.py)."""
    return (absmax.data_ptr() + absmax.numel() * absmax.element_size()) % (4 if nested else 16) == 0


def supports(x2d: torch.Tensor, packed: torch.Tensor, blocksize: int, n: int, k: int, nested: bool = False,
             nested_blocksize: int = 256, absmax: torch.Tensor | None = None) -> bool:
    """Shapes and layouts the kernel handles (Hopper only); everything else takes the other paths. Without
    ``absmax`` its array is taken to start aligned (as the quantizer's do) for ``stats_fit``."""
    if not (x2d.is_cuda and x2d.dtype in _DTYPES and x2d.dim() == 2 and x2d.shape[0] >= 1):
        return False
    if k % STEP or x2d.shape[0] * k * 2 >= 2**31 or blocksize < STEP or blocksize & (blocksize - 1):
        return False
    if not (stats_fit(absmax, nested) if absmax is not None else -(-n * k // blocksize) % 4 == 0):
        return False
    if nested and nested_blocksize != 256:  # the kernel indexes nested statistics with block >> 8
        return False
    if packed.data_ptr() % 16 or x2d.data_ptr() % 16 or not x2d.is_contiguous():
        return False
    lib = _lib_for(_index(x2d.device))
    return lib is not None and lib.ready[(_DTYPES[x2d.dtype], block_m(x2d.shape[0]), int(nested), ROWS)] > 0


def wide_wanted(n: int, k: int) -> bool:
    """Whether a weight [n, k] takes ROWS_WIDE weight rows per block at BM WIDE_BM (where that build runs)."""
    return n >= WIDE_MIN_N or (n >= WIDE_LONG_K[0] and k >= WIDE_LONG_K[1])


def block_m(m: int) -> int:
    """x rows per block: the smallest of ``BLOCK_M`` covering M (H200: each is the fastest in its range)."""
    for bm in BLOCK_M:
        if m <= bm:
            return bm
    return BLOCK_M[-1]


def _split_steps(steps: int, want: int) -> tuple[int, int]:
    """(parts, steps per part) for K cut into about ``want`` parts: whole 4-step statistics quads per part where K
    has them (wgmma.cu copies the statistics by quads only then), every part non-empty."""
    per = -(-steps // want)
    if steps % 4 == 0:
        per = -(-per // 4) * 4
    return -(-steps // per), per


def _one_wave(tiles: int, steps: int, slots: int) -> tuple[int, int]:
    """(splits, steps per split): split K when the output tiles alone would leave some of the ``slots`` (resident
    blocks on the whole GPU) idle, into as many splits as fit in one wave, or one more where that overfills the
    GPU by at most 1/16 of its slots. H200 (results/h200-probe-wgmma-splits.json): one wave against
    ceil(slots / tiles) splits (up to 1.7 waves) was faster on 42 of 47 (weight, M) pairs, by 1.1-1.46x on 36
    (e.g. Llama down at M = 128 153 vs 204 us, Qwen q at M = 32 25.2 vs 31.2), within 4% on
    Gemma gate+up / qkv, and slower only on Qwen o at M = 16-64 (26.2 vs 24.0 us: 6 splits against 7, whose 280
    blocks overfill the 264 slots by 16, hence the 1/16)."""
    if tiles >= slots:
        return 1, steps
    want = max(1, slots // tiles)
    if (want + 1) * tiles <= slots + slots // 16:
        want += 1
    want = min(want, max(1, steps // 8))  # at least 8 steps per split
    return (1, steps) if want == 1 else _split_steps(steps, want)


# The tail plan's model (one resident block per SM), in units of one K step of a block: each block costs its steps
# plus BLOCK_COST (prologue, pipeline fill, epilogue), blocks start in launch order on the first free slot, and a
# split tail adds SUM_COST (the sum kernel's launch) plus its float32 partials written and read at SUM_BYTES_PER_STEP.
# Fitted on the H200 (tuning/h200.json: wgmma_tail_model).
BLOCK_COST = _TUNING["wgmma_tail_model"]["block_cost"]
SUM_COST = _TUNING["wgmma_tail_model"]["sum_cost"]
SUM_BYTES_PER_STEP = _TUNING["wgmma_tail_model"]["sum_bytes_per_step"]  # ~3 TB/s over a ~0.7 us step (BM 128)
TAIL_GAIN = _TUNING["wgmma_tail_model"]["tail_gain"]  # take a tail plan only where the model says it saves >= 8%


def _makespan(groups: list[tuple[int, int]], slots: int) -> int:
    """Finish time of blocks (count, length) started in order, each on the earliest free of ``slots``."""
    import heapq

    free = [0] * slots
    for count, length in groups:
        for _ in range(count):
            heapq.heapreplace(free, free[0] + length)
    return max(free)


def _cost(m_tiles: int, n_tiles: int, full: int, splits: int, per: int, steps: int, slots: int, m: int,
          rows: int = ROWS) -> float:
    tail = n_tiles - full
    t = _makespan([(m_tiles * full, steps + BLOCK_COST), (m_tiles * tail * splits, per + BLOCK_COST)], slots)
    if tail and splits > 1:
        t += SUM_COST + 8 * splits * m * tail * rows / SUM_BYTES_PER_STEP
    return t


# Note: two resident blocks per SM (BM <= TWO_BLOCK_TAIL_MAX_BM) with more row tiles than SMs but at most
# TWO_BLOCK_TAIL_MAX_FILL of the slots: the one-wave plan cannot split K (two splits overfill the wave), so a third of
# the SMs or more would run one block while the rest run two. Then whole tiles first and the last ones in 3 (or 2)
# parts, one wave (Gemma gate+up at M = 16: 40.9 vs 60.0 us unsplit); above that fill unsplit ran faster (Qwen gate+up,
# 200 tiles on 264 slots). More tiles than slots (the gate_up projections): one wave of whole tiles, the rest in
# WIDE_TAIL_PARTS parts, or 2 where that would take more than two further rounds (Llama gate_up 133.6 vs 144.0 us at
# M = 8). Measurements: tuning/h200.json.
TWO_BLOCK_TAIL_MAX_FILL = _TUNING["wgmma_two_block_tail"]["max_fill"]
TWO_BLOCK_TAIL_MAX_BM = _TUNING["wgmma_two_block_tail"]["max_bm"]  # BM 64 keeps the one-wave plan: not measured
WIDE_TAIL_PARTS = _TUNING["wgmma_wide_tail_parts"]


@functools.lru_cache(maxsize=4096)  # pure; asked by every call (eager calls: up to ~140 us for the M = 128 tail search)
def plan(m: int, n: int, k: int, slots: int, bm: int, blocks_per_sm: int = 1,
         rows: int = ROWS) -> tuple[int, int, int]:
    """(splits, steps per split, full tiles): the first ``full tiles`` weight row tiles run whole, the others
    (the tail) in ``splits`` parts over K (wgmma.cu: whole tiles first, the short split blocks fill the last wave).

    With two resident blocks per SM (BM <= 64) the one-wave plan (``_one_wave``; every tile split alike, or none),
    except at BM <= TWO_BLOCK_TAIL_MAX_BM where the tiles fill more than half the slots and at most
    TWO_BLOCK_TAIL_MAX_FILL of them: the last quarter of the tiles in 3 parts, within one wave (Gemma gate+up at
    M 8-32: 126 tiles whole, 42 in 3 parts; else the last tiles in 2 parts, exactly one wave); and where they are
    more than the slots (but fewer than twice as many): one wave of whole tiles, the rest in WIDE_TAIL_PARTS (or 2)
    parts (the gate_up projections).
    With one (BM 128 / 256), whichever of the one-wave and the tail plans the model above says is fastest, the tail
    only where it saves >= 8%: e.g. Gemma gate+up (168 tiles) at M = 128 runs 132 tiles whole and 36 in 3 parts, one
    wave and a third instead of two waves; Qwen gate_up (400 tiles) runs 396 whole and 4 in 10 parts instead of 4
    waves. ``rows``: weight rows per tile (ROWS, or ROWS_WIDE)."""
    steps = k // STEP
    m_tiles, n_tiles = -(-m // bm), -(-n // rows)
    s, per = _one_wave(m_tiles * n_tiles, steps, slots)
    base = (s, per, 0 if s > 1 else n_tiles)
    if blocks_per_sm != 1:
        if s == 1 and m_tiles == 1 and bm <= TWO_BLOCK_TAIL_MAX_BM and steps >= 16:
            if slots // 2 < n_tiles <= TWO_BLOCK_TAIL_MAX_FILL * slots:
                quarter = n_tiles // 4
                s3, per3 = _split_steps(steps, 3)
                if s3 == 3 and n_tiles + 2 * quarter <= slots:
                    return 3, per3, n_tiles - quarter
                s2, per2 = _split_steps(steps, 2)
                if s2 == 2:
                    return 2, per2, 2 * n_tiles - slots
            if slots < n_tiles < 2 * slots:
                tail = n_tiles - slots
                want = WIDE_TAIL_PARTS if WIDE_TAIL_PARTS * tail <= 2 * slots else 2
                s2, per2 = _split_steps(steps, want)
                if s2 >= 2:
                    return s2, per2, slots
        return base
    best, best_cost = base, _cost(m_tiles, n_tiles, base[2], s, per, steps, slots, m, rows)
    limit = best_cost * TAIL_GAIN
    fulls = {0} | {min(n_tiles - 1, (w * slots) // m_tiles) for w in range(1, n_tiles * m_tiles // slots + 1)}
    for full in sorted(fulls):
        for want in range(2, min(16, steps // 8) + 1):
            s2, per2 = _split_steps(steps, want)
            if s2 < 2:
                continue
            c = _cost(m_tiles, n_tiles, full, s2, per2, steps, slots, m, rows)
            if c < limit and c < best_cost:
                best, best_cost = (s2, per2, full), c
    return best


class Prepared:
    """One weight's launch arguments worked out once (addresses only: it keeps no tensor alive); a call fills in
    x, y, M and the split-K workspace and launches. Any M the kernel supports; the dispatcher decides which."""

    __slots__ = ("lib", "index", "n", "k", "nested", "params")

    def __init__(self, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                 bias=None):
        self.index = _index(packed.device)
        self.lib = _lib_for(self.index)
        if self.lib is None:
            raise RuntimeError("the wgmma kernel is not available on this GPU")
        self.n, self.k, self.nested = n, k, nested_code is not None
        if not stats_fit(absmax, self.nested):
            raise ValueError("wgmma: the statistics array must end on a 4-byte (8-bit codes) or 16-byte (float "
                             "absmax) boundary (the kernel copies whole aligned words)")
        self.params = Params(
            packed=packed.data_ptr(), absmax=absmax.data_ptr(),
            nested_code=nested_code.data_ptr() if self.nested else None,
            nested_absmax=nested_absmax.data_ptr() if self.nested else None,
            offset=offset.data_ptr() if self.nested else None, code=code.data_ptr(),
            N=n, K=k, log2_blocksize=blocksize.bit_length() - 1,
        )

    def rows_for(self, bm: int, dtype: torch.dtype, rows: int | None = None) -> int:
        """Weight rows per block at BM ``bm``: ROWS_WIDE for a weight ``wide_wanted`` at BM WIDE_BM where that build
        runs here, else ROWS; ``rows`` forces one (ValueError where that build does not exist or cannot run)."""
        wide_ok = self.lib.ready.get((_DTYPES[dtype], bm, int(self.nested), ROWS_WIDE), 0) > 0
        if rows is None:
            return ROWS_WIDE if wide_ok and wide_wanted(self.n, self.k) else ROWS
        if rows != ROWS and not (rows == ROWS_WIDE and wide_ok):
            raise ValueError(f"wgmma: no build of {rows} weight rows per block at BM {bm}")
        return rows

    def launch_plan(self, m: int, dtype: torch.dtype, bm: int | None = None, splits: int | None = None,
                    full_tiles: int | None = None, cluster: bool | None = None,
                    rows: int | None = None) -> tuple[int, int, int, int, bool, int]:
        """(BM, splits, steps per split, whole tiles, cluster sum, weight rows per block) of a call with M rows of
        ``dtype``; the keywords force a variant as in ``__call__``."""
        n, k = self.n, self.k
        bm = bm or block_m(m)
        rows = self.rows_for(bm, dtype, rows)
        steps = k // STEP
        n_tiles = -(-n // rows)
        if splits is None:
            blocks = self.lib.ready[(_DTYPES[dtype], bm, int(self.nested), rows)]
            s, per, full = plan(m, n, k, self.lib.sms * blocks, bm, blocks, rows)
        else:
            s, per = _split_steps(steps, splits)
            full = n_tiles if s == 1 else min(n_tiles - 1, full_tiles or 0)
        can = full == 0 and 2 <= s <= CLUSTER_MAX and bm <= CLUSTER_MAX_BM
        if cluster is None:
            cluster = can and -(-m // bm) * n_tiles <= self.lib.clusters[(_DTYPES[dtype], bm, int(self.nested), s)]
        elif cluster and not can:
            raise ValueError(f"wgmma: no cluster split-K sum for {s} parts, {full} whole tiles, BM {bm}")
        return bm, s, per, full, bool(cluster), rows

    def __call__(self, x2d: torch.Tensor, bias: torch.Tensor | None = None, y: torch.Tensor | None = None,
                 bm: int | None = None, splits: int | None = None, full_tiles: int | None = None,
                 cluster: bool | None = None, rows: int | None = None) -> torch.Tensor:
        """y [M, N] = x2d [M, K] (contiguous, 16-byte aligned, on this device) times the weight (+ bias).
        ``bm`` / ``splits`` / ``full_tiles`` force a variant (tests, probes): ``splits`` parts of K for every weight
        row tile after the first ``full_tiles`` (default 0). ``cluster`` forces the split-K sum: True in thread block
        clusters (every tile split, at most CLUSTER_MAX parts, BM <= CLUSTER_MAX_BM; ValueError otherwise), False by
        the second kernel; None: clusters where all of them are resident at once. ``rows`` forces
        the weight rows per block (``rows_for``)."""
        m, n, k = x2d.shape[0], self.n, self.k
        bm, s, per, full, cluster, rows = self.launch_plan(m, x2d.dtype, bm, splits, full_tiles, cluster, rows)
        steps = k // STEP
        tail = -(-n // rows) - full
        m_tiles = -(-m // bm)
        if y is None:
            y = torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
        y32 = torch.empty(s, m, n - full * rows, dtype=torch.float32, device=x2d.device) if tail and not cluster else None
        p = Params.from_buffer_copy(self.params)  # a copy per call: ctypes drops the GIL during the launch
        p.x, p.y, p.M, p.steps_per_split = x2d.data_ptr(), y.data_ptr(), m, per if tail else steps
        p.full_tiles, p.tail_tiles, p.cluster = full, tail, s if cluster else 0
        p.bias = bias.data_ptr() if bias is not None else None  # for the tail applied by the sum kernel
        p.y32 = y32.data_ptr() if y32 is not None else None
        rc = self.lib.lib.fastnf4_wgmma(ctypes.byref(p), _DTYPES[x2d.dtype], bm, int(self.nested), rows, m_tiles,
                                        s, torch._C._cuda_getCurrentRawStream(self.index))
        if rc != 0:
            raise RuntimeError(f"wgmma launch failed (cudaError {rc})")
        # with split-K, the clusters or wgmma.cu's second kernel added the partials in split order, the bias, and rounded
        return y


def launch(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias,
           y: torch.Tensor | None = None, bm: int | None = None, splits: int | None = None,
           full_tiles: int | None = None, cluster: bool | None = None, rows: int | None = None) -> torch.Tensor:
    """y [M, N] = x2d @ dequant(W).T (+ bias) on the current stream; ``bm`` / ``splits`` / ``full_tiles`` /
    ``cluster`` / ``rows`` force a variant (tests, probes; see ``Prepared.__call__``)."""
    return Prepared(packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset,
                    nested_blocksize)(x2d, bias, y, bm, splits, full_tiles, cluster, rows)
