"""Triton kernels: blockwise 4-bit quantization (NF4/FP4) and the 8-bit quantization of the statistics.

Shape contract (flat, contiguous): ``x`` has ``n`` elements; 4-bit writes ``ceil(n/2)`` packed bytes (element
2i in the high nibble) and ``ceil(n/BLOCKSIZE)`` float32 absmax; 8-bit writes ``n`` uint8 codes of
``x - offset`` and ``ceil(n/BLOCKSIZE)`` float32 absmax.

Tiling: a program owns ROWS whole quantization blocks ([ROWS, BLOCKSIZE] elements), so the absmax reduction
stays inside the program. The arithmetic mirrors bitsandbytes' fast-math CUDA kernels (see ``naive.py``):
flush subnormals, NaN-ignoring max, ``rcp.approx.ftz.f32`` reciprocal (inline PTX on GPUs; an IEEE division
under the CPU interpreter, which cannot run PTX), multiply (one ``mul.ftz.f32`` on GPUs), then bitsandbytes'
decision tree for the NF4 code. A count of the thresholds below the value gives the same code; it stays as the
second form the tests draw (and the probe times), not the default.
"""
from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def _ftz(x):
    # flush float32 subnormals to a zero of the same sign, as the .FTZ instructions do
    return tl.where(tl.abs(x) < 1.1754943508222875e-38, x * 0.0, x)


@triton.jit
def _reciprocal(a, APPROX: tl.constexpr):
    if APPROX:
        r = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [a], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        r = _ftz(1.0 / _ftz(a))
    return r


@triton.jit
def _block_absmax(xb):
    # fmaxf seeded with -FLT_MAX: NaN never wins; a block of only NaN gives -FLT_MAX
    a = tl.abs(xb)
    a = tl.where(a != a, -3.4028234663852886e38, a)
    return tl.max(a, axis=1)


@triton.jit
def _nf4_code(xn):
    # thresholds: fastnf4.codebooks.NF4_THRESHOLDS (float32 values of bitsandbytes' compiled literals)
    code = (xn > -0.8480964303016663).to(tl.int32)
    code += (xn > -0.6106328964233398).to(tl.int32)
    code += (xn > -0.4599952697753906).to(tl.int32)
    code += (xn > -0.33967941999435425).to(tl.int32)
    code += (xn > -0.23460739850997925).to(tl.int32)
    code += (xn > -0.13791173696517944).to(tl.int32)
    code += (xn > -0.045525018125772476).to(tl.int32)
    code += (xn > 0.03979014977812767).to(tl.int32)
    code += (xn > 0.1202552542090416).to(tl.int32)
    code += (xn > 0.2035212516784668).to(tl.int32)
    code += (xn > 0.2920137643814087).to(tl.int32)
    code += (xn > 0.3893125355243683).to(tl.int32)
    code += (xn > 0.5016633868217468).to(tl.int32)
    code += (xn > 0.6427869200706482).to(tl.int32)
    code += (xn > 0.8614783883094788).to(tl.int32)
    return code


@triton.jit
def _nf4_code_tree(xn):
    # the same code as _nf4_code by bitsandbytes' own decision tree: with the top bits known, the code lies between
    # two thresholds, so each level compares with one threshold picked by selects (4 compares + 11 selects against
    # the count's 15 compares and 15 adds); NaN fails every compare: code 0, as in the count
    b3 = xn > 0.03979014977812767
    b2 = xn > tl.where(b3, 0.3893125355243683, -0.33967941999435425)
    t1 = tl.where(b3, tl.where(b2, 0.6427869200706482, 0.2035212516784668),
                  tl.where(b2, -0.13791173696517944, -0.6106328964233398))
    b1 = xn > t1
    t0 = tl.where(b3, tl.where(b2, tl.where(b1, 0.8614783883094788, 0.5016633868217468),
                               tl.where(b1, 0.2920137643814087, 0.1202552542090416)),
                  tl.where(b2, tl.where(b1, -0.045525018125772476, -0.23460739850997925),
                           tl.where(b1, -0.4599952697753906, -0.8480964303016663)))
    b0 = xn > t0
    return (b3.to(tl.int32) << 3) | (b2.to(tl.int32) << 2) | (b1.to(tl.int32) << 1) | b0.to(tl.int32)


@triton.jit
def _mul_ftz(a, b):
    # a * b with subnormal inputs and result flushed to zero: one mul.ftz.f32, as bitsandbytes' fast-math build
    return tl.inline_asm_elementwise("mul.ftz.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _fp4_code(xn):
    # thresholds: fastnf4.codebooks.FP4_THRESHOLDS; magnitude bits [0,1,6,7,4,5,2,3][rank] = rank ^ ((rank & 2) << 1)
    a = tl.abs(xn)
    rank = (a > 0.0026041700039058924).to(tl.int32)
    rank += (a > 0.0859375).to(tl.int32)
    rank += (a > 0.2083333283662796).to(tl.int32)
    rank += (a > 0.2916666567325592).to(tl.int32)
    rank += (a > 0.4166666865348816).to(tl.int32)
    rank += (a > 0.5833330154418945).to(tl.int32)
    rank += (a > 0.8333333134651184).to(tl.int32)
    return (rank ^ ((rank & 2) << 1)) + 8 * (xn < 0).to(tl.int32)


@triton.jit
def quantize_4bit_kernel(
    p_x, p_packed, p_absmax, n, n_bytes, n_blocks,
    BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, FP4: tl.constexpr, INT64: tl.constexpr, APPROX_RCP: tl.constexpr,
    TREE: tl.constexpr = False, MUL_FTZ: tl.constexpr = False,
):
    pid = tl.program_id(0)
    if INT64:
        pid = pid.to(tl.int64)
    o_blk = pid * ROWS + tl.arange(0, ROWS)
    o_x = o_blk[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    if MUL_FTZ:
        # flushing commutes with the max of magnitudes (it is monotone on them), so only the block's absmax is
        # flushed; the elements are flushed by the multiply itself
        b_x = tl.load(p_x + o_x, mask=o_x < n, other=0.0).to(tl.float32)  # past the end: 0.0, as bnb
        b_absmax = _ftz(_block_absmax(b_x))
        b_r = tl.broadcast_to(_reciprocal(b_absmax, APPROX_RCP)[:, None], (ROWS, BLOCKSIZE))
        b_xn = _mul_ftz(b_x, b_r)
    else:
        b_x = _ftz(tl.load(p_x + o_x, mask=o_x < n, other=0.0).to(tl.float32))  # past the end: 0.0, as bnb
        b_absmax = _block_absmax(b_x)
        b_xn = _ftz(b_x * _reciprocal(b_absmax, APPROX_RCP)[:, None])
    tl.store(p_absmax + o_blk, b_absmax, mask=o_blk < n_blocks)

    if FP4:
        b_code = _fp4_code(b_xn)
    elif TREE:
        b_code = _nf4_code_tree(b_xn)
    else:
        b_code = _nf4_code(b_xn)
    b_hi, b_lo = tl.split(tl.reshape(b_code, (ROWS, BLOCKSIZE // 2, 2)))
    b_byte = ((b_hi << 4) | b_lo).to(tl.uint8)
    o_byte = o_blk[:, None] * (BLOCKSIZE // 2) + tl.arange(0, BLOCKSIZE // 2)[None, :]
    tl.store(p_packed + o_byte, b_byte, mask=o_byte < n_bytes)


@triton.jit
def quantize_8bit_kernel(
    p_x, p_offset, p_code, p_q, p_absmax, n, n_blocks,
    BLOCKSIZE: tl.constexpr, ROWS: tl.constexpr, INT64: tl.constexpr, APPROX_RCP: tl.constexpr,
    SELECT2: tl.constexpr = False,
):
    pid = tl.program_id(0)
    if INT64:
        pid = pid.to(tl.int64)
    o_blk = pid * ROWS + tl.arange(0, ROWS)
    o_x = o_blk[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    m_x = o_x < n
    b_x = tl.load(p_x + o_x, mask=m_x, other=0.0) - tl.load(p_offset)
    b_x = _ftz(tl.where(m_x, b_x, 0.0))
    b_absmax = _block_absmax(b_x)
    tl.store(p_absmax + o_blk, b_absmax, mask=o_blk < n_blocks)
    b_xn = _ftz(b_x * _reciprocal(b_absmax, APPROX_RCP)[:, None])

    # bitsandbytes' dQuantize<0>: 7 halving steps from pivot 127, then the nearer of two neighbours
    pivot = tl.full(b_xn.shape, 127, tl.int32)
    lower_p = tl.zeros(b_xn.shape, tl.int32)
    upper_p = tl.full(b_xn.shape, 255, tl.int32)
    lower = tl.full(b_xn.shape, -1.0, tl.float32)
    upper = tl.full(b_xn.shape, 1.0, tl.float32)
    step = 64
    if SELECT2:
        # the first two steps' pivots are the same for every element (127, then 63 / 191): their code values are
        # loaded once and picked by selects, which leaves 6 dependent gathers per element of the 8
        c127 = tl.load(p_code + 127)
        c63 = tl.load(p_code + 63)
        c191 = tl.load(p_code + 191)
        gt = b_xn > c127
        lower_p = tl.where(gt, 127, lower_p)
        lower = tl.where(gt, c127, lower)
        upper_p = tl.where(gt, upper_p, 127)
        upper = tl.where(gt, upper, c127)
        pivot = tl.where(gt, 191, 63)
        val = tl.where(gt, c191, c63)
        step = 32
        gt = b_xn > val
        lower_p = tl.where(gt, pivot, lower_p)
        lower = tl.where(gt, val, lower)
        upper_p = tl.where(gt, upper_p, pivot)
        upper = tl.where(gt, upper, val)
        pivot = tl.where(gt, pivot + step, pivot - step)
        val = tl.load(p_code + pivot)
        step = 16
    else:
        val = tl.load(p_code + pivot)
    for _ in tl.static_range(5 if SELECT2 else 7):
        gt = b_xn > val
        lower_p = tl.where(gt, pivot, lower_p)
        lower = tl.where(gt, val, lower)
        upper_p = tl.where(gt, upper_p, pivot)
        upper = tl.where(gt, upper, val)
        pivot = tl.where(gt, pivot + step, pivot - step)
        val = tl.load(p_code + pivot)
        step = step // 2
    upper = tl.where(upper_p == 255, tl.load(p_code + 255), upper)
    lower = tl.where(lower_p == 0, tl.load(p_code), lower)
    mid_up = _ftz(_ftz(upper + val) * 0.5)
    mid_low = _ftz(_ftz(lower + val) * 0.5)
    up = tl.where(b_xn > mid_up, upper_p, pivot)
    down = tl.where(b_xn < mid_low, lower_p, pivot)
    b_q = tl.where(b_xn > val, up, down)
    tl.store(p_q + o_x, b_q.to(tl.uint8), mask=m_x)


# rows of quantization blocks per program: about 2048 elements per program
def _rows(blocksize: int, target: int = 2048) -> int:
    return max(target // blocksize, 1)


def _num_warps(tile: int) -> int:
    return 8 if tile >= 4096 else 4


# 4-bit tiles (elements per program, warps), measured on the H200 (commit e79c555; results/h200-quantize.json): 64
# elements per thread give the compare / select chains the most independent work on the large weights; below ~16M
# elements that leaves too few programs per SM, and 2048 elements on 8 warps are faster
QUANT_LARGE_MIN_ELEMS = 16 * 2**20
QUANT_TILE_LARGE = (8192, 4)
QUANT_TILE_SMALL = (2048, 8)


def launch_4bit(x, packed, absmax, blocksize, quant_type, approx_rcp=None, elems_per_prog=None, tree=True,
                mul_ftz=True, num_warps=None):
    """``tree``: the NF4 code by bitsandbytes' decision tree (else by counting the thresholds below the value; the
    same codes); ``mul_ftz``: flush and scale the elements in one ``mul.ftz`` (only where the reciprocal is the
    hardware one, i.e. not under the interpreter). The defaults are the fastest forms; the others stay for probes."""
    from ..._triton import interpreter_enabled

    n = x.numel()
    tile, warps = QUANT_TILE_LARGE if n >= QUANT_LARGE_MIN_ELEMS else QUANT_TILE_SMALL
    rows = _rows(blocksize, elems_per_prog or tile)
    n_blocks = absmax.numel()
    grid = (triton.cdiv(n_blocks, rows),)
    approx = (not interpreter_enabled()) if approx_rcp is None else approx_rcp
    quantize_4bit_kernel[grid](
        x, packed, absmax, n, packed.numel(), n_blocks,
        BLOCKSIZE=blocksize, ROWS=rows, FP4=(quant_type == "fp4"), INT64=(grid[0] * rows * blocksize >= 2**31),
        APPROX_RCP=approx, TREE=tree, MUL_FTZ=mul_ftz and approx,  # mul.ftz is PTX: not under the interpreter
        num_warps=num_warps or (warps if elems_per_prog is None else _num_warps(rows * blocksize)),
    )


# 8-bit tiles: one block of 256 per program (the search's dependent gathers want many programs in flight), on 4 warps
# below ~512K elements and on one above (H200, 0.6-5 us less per double-quant quantize: commit 4567a79)
QUANT8_ELEMS = 256
QUANT8_ONE_WARP_MIN_ELEMS = 2**19


def launch_8bit(x, offset, code, q, absmax, blocksize, approx_rcp=None, elems_per_prog=None, select2=True,
                num_warps=None):
    """``select2``: the first two search steps by selects of code values loaded once (else by gathers; the same
    codes). The defaults are the fastest forms; the others stay for probes."""
    from ..._triton import interpreter_enabled

    n = x.numel()
    if elems_per_prog is None:
        elems_per_prog = QUANT8_ELEMS
        num_warps = num_warps or (1 if n >= QUANT8_ONE_WARP_MIN_ELEMS else 4)
    rows = _rows(blocksize, elems_per_prog)
    n_blocks = absmax.numel()
    grid = (triton.cdiv(n_blocks, rows),)
    quantize_8bit_kernel[grid](
        x, offset, code, q, absmax, n, n_blocks,
        BLOCKSIZE=blocksize, ROWS=rows, INT64=(grid[0] * rows * blocksize >= 2**31), APPROX_RCP=(not interpreter_enabled()) if approx_rcp is None else approx_rcp,
        SELECT2=select2, num_warps=num_warps or _num_warps(rows * blocksize),
    )
