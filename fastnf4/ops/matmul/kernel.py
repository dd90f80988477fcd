"""Triton kernels for ``y = x @ dequant(W).T (+ bias)`` straight from the bitsandbytes packed layout.

Shape contract: ``x`` is ``[M, K]`` (row stride ``stride_xm``, unit column stride), ``W`` is ``[N, K]`` stored as
``N*K/2`` packed bytes (row n starts at byte ``n*K/2``), ``y`` is ``[M, N]``. Requires ``K % G == 0`` where ``G``
(a power of two, at least 16) divides both ``K`` and the blocksize, so that every group of ``G`` consecutive
weights of a row shares one absmax; callers fall back to dequantize + matmul otherwise.

* ``gemv_kernel`` (decode, M <= 4): each program owns BLOCK_N rows of W and streams them once, as
  ``[BLOCK_N, NG, G/2]`` byte tiles; the codes of a group are multiplied with x in float32 and summed, then
  scaled by the group's absmax once (one multiply per G weights instead of per weight). All M rows of x reuse
  each decoded tile.
* ``gemm_kernel`` (M > 4): tensor-core tiles. Each K step decodes a ``[BLOCK_N, BLOCK_K]`` weight tile to the
  input dtype in registers (the same rounding as ``dequantize``) and feeds ``tl.dot``; the dequantized weight
  never reaches global memory.

With SPLIT_K > 1 programs add float32 partial sums into a zeroed workspace with atomics (the caller casts
and adds the bias).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..dequantize.kernel import _round_to_bf16
from .dispatch import group_elems  # noqa: F401  (the rule lives with the dispatcher; kernel.group_elems for tools)


@triton.jit
def _group_absmax(p_absmax, p_ncode, p_nabsmax, p_offset, o_elem, mask,
                  BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr):
    # absmax of the quantization block holding flat element o_elem (decoded when double-quantized)
    blk = o_elem // BLOCKSIZE
    if NESTED:
        q = tl.load(p_absmax + blk, mask=mask, other=0).to(tl.int32)
        scale2 = tl.load(p_nabsmax + blk // NESTED_BLOCKSIZE, mask=mask, other=0.0)
        absmax = tl.load(p_ncode + q) * scale2 + tl.load(p_offset)
    else:
        absmax = tl.load(p_absmax + blk, mask=mask, other=0.0)
    return absmax


@triton.jit
def _lookup(table, idx):
    # table[idx] through tl.gather: Triton keeps the 16-entry table in shared memory (one 32-bit-addressed
    # LDS per code). A plain tl.load(p_code + idx) inside a pipelined dot loop became one cp.async per code
    # plus a shared-memory read back (measured 3% of the byte floor).
    flat = tl.reshape(idx.to(tl.int32), (idx.numel,))
    return tl.reshape(tl.gather(table, flat, 0), idx.shape)


@triton.jit
def _cast_out(acc, out_ty: tl.constexpr, INTERPRET: tl.constexpr):
    if INTERPRET and out_ty == tl.bfloat16:
        return _round_to_bf16(acc)  # the interpreter's own float32 -> bf16 cast is not round-to-nearest-even
    return acc.to(out_ty)


@triton.jit
def gemv_kernel(
    p_x, p_packed, p_absmax, p_code, p_ncode, p_nabsmax, p_offset, p_bias, p_y,
    N, K, stride_xm, stride_ym,
    M: tl.constexpr, MP: tl.constexpr, BLOCKSIZE: tl.constexpr, G: tl.constexpr,
    NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, NG: tl.constexpr, SPLIT_K: tl.constexpr, INT64: tl.constexpr, INTERPRET: tl.constexpr,
):
    GB: tl.constexpr = G // 2  # bytes per group
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    if INT64:
        o_n = o_n.to(tl.int64)
    row_bytes = K // 2
    o_g = tl.arange(0, NG)
    o_b = tl.arange(0, GB)
    acc = tl.zeros([BLOCK_N, MP], dtype=tl.float32)
    kb_per_split = tl.cdiv(tl.cdiv(row_bytes, NG * GB), SPLIT_K) * (NG * GB)
    kb_start = pid_k * kb_per_split
    kb_end = tl.minimum(kb_start + kb_per_split, row_bytes)
    for kb in range(kb_start, kb_end, NG * GB):
        o_byte = kb + o_g[:, None] * GB + o_b[None, :]  # [NG, GB] byte offsets within a row
        m_byte = o_byte < kb_end
        p_w = p_packed + o_n[:, None, None] * row_bytes + o_byte[None, :, :]
        b_w = tl.load(p_w, mask=m_n[:, None, None] & m_byte[None, :, :], other=0)
        b_hi = tl.load(p_code + (b_w >> 4).to(tl.int32))
        b_lo = tl.load(p_code + (b_w & 15).to(tl.int32))
        o_elem = o_n[:, None] * K + 2 * (kb + o_g[None, :] * GB)  # first element of each group
        b_absmax = _group_absmax(p_absmax, p_ncode, p_nabsmax, p_offset, o_elem,
                                 m_n[:, None] & ((kb + o_g[None, :] * GB) < kb_end),
                                 BLOCKSIZE, NESTED, NESTED_BLOCKSIZE)
        for m in tl.static_range(M):
            o_x = 2 * o_byte[:, :, None] + tl.arange(0, 2)[None, None, :]
            b_x = tl.load(p_x + m * stride_xm + o_x, mask=m_byte[:, :, None], other=0.0).to(tl.float32)
            b_xe, b_xo = tl.split(b_x)  # [NG, GB]: elements 2i (high nibble) and 2i + 1 (low nibble)
            part = tl.sum(b_hi * b_xe[None, :, :] + b_lo * b_xo[None, :, :], axis=2)  # [BLOCK_N, NG]
            s = tl.sum(part * b_absmax, axis=1)
            acc += tl.where(tl.arange(0, MP)[None, :] == m, s[:, None], 0.0)

    o_m = tl.arange(0, MP)
    m_out = m_n[:, None] & (o_m[None, :] < M)
    p_out = p_y + o_m[None, :] * stride_ym + o_n[:, None]
    if SPLIT_K > 1:  # this part's float32 partial sums, in its own [M, N] slice (added in part order by the caller)
        tl.store(p_out + pid_k.to(tl.int64) * M * N, acc, mask=m_out)
    else:
        if HAS_BIAS:
            acc += tl.load(p_bias + o_n, mask=m_n, other=0.0).to(tl.float32)[:, None]
        tl.store(p_out, _cast_out(acc, p_y.dtype.element_ty, INTERPRET), mask=m_out)


@triton.jit
def gemm_kernel(
    p_x, p_packed, p_absmax, p_code, p_ncode, p_nabsmax, p_offset, p_bias, p_y,
    M, N, K, stride_xm, stride_ym,
    BLOCKSIZE: tl.constexpr, G: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, INT64: tl.constexpr, FP32_IEEE: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n  # grouped ordering: consecutive programs share W tiles in L2
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m

    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m = o_m < M
    m_n = o_n < N
    if INT64:
        o_n = o_n.to(tl.int64)
        o_m = o_m.to(tl.int64)
    KB: tl.constexpr = BLOCK_K // 2
    NGK: tl.constexpr = BLOCK_K // G
    o_kb = tl.arange(0, KB)
    o_kg = tl.arange(0, NGK)
    table = tl.load(p_code + tl.arange(0, 16))
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(p_x + o_m[:, None] * stride_xm + o_k[None, :], mask=m_m[:, None] & (o_k[None, :] < k_end), other=0.0)
        o_byte = k0 // 2 + o_kb
        b_w = tl.load(p_packed + o_n[:, None] * (K // 2) + o_byte[None, :],
                      mask=m_n[:, None] & (o_byte[None, :] < k_end // 2), other=0)
        b_absmax = _group_absmax(p_absmax, p_ncode, p_nabsmax, p_offset, o_n[:, None] * K + k0 + o_kg[None, :] * G,
                                 m_n[:, None] & ((k0 + o_kg[None, :] * G) < k_end), BLOCKSIZE, NESTED, NESTED_BLOCKSIZE)
        b_hi = _lookup(table, b_w >> 4)
        b_lo = _lookup(table, b_w & 15)
        w = tl.reshape(tl.join(b_hi, b_lo), (BLOCK_N, NGK, G)) * b_absmax[:, :, None]
        w = tl.reshape(w, (BLOCK_N, BLOCK_K))
        if INTERPRET:
            # Triton's interpreter mis-rounds float32 -> bf16 and mis-multiplies bf16 dots: round exactly with
            # integers, then multiply the (exactly representable) values in float32
            if a.dtype == tl.bfloat16:
                w = _round_to_bf16(w)
            else:
                w = w.to(a.dtype)
            acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            w = w.to(a.dtype)  # the same rounding as dequantize
            if FP32_IEEE:
                acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(w), acc)

    m_out = m_m[:, None] & m_n[None, :]
    p_out = p_y + o_m[:, None] * stride_ym + o_n[None, :]
    if SPLIT_K > 1:  # this part's float32 partial sums, in its own [M, N] slice (added in part order by the caller)
        tl.store(p_out + pid_k.to(tl.int64) * M * N, acc, mask=m_out)
    else:
        if HAS_BIAS:
            acc += tl.load(p_bias + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
        tl.store(p_out, _cast_out(acc, p_y.dtype.element_ty, INTERPRET), mask=m_out)


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small grids keep the CPU tests quick but still exercise split-K
    return _sms(device.index if device.index is not None else torch.cuda.current_device())


def gemv_plan(m: int, n: int, k: int, blocksize: int, sms: int):
    """(BLOCK_N, NG, SPLIT_K) for the decode GEMV: ~256 bytes of each row per step, split-K when the
    rows alone would not give every SM two programs."""
    g = group_elems(k, blocksize)
    block_n = 16  # H200 sweep (NOTES.md): 16 rows x 256 bytes per step was best at every N tried (M = 1)
    # M >= 2: 32 rows per program where that still gives every SM about two programs (the 32-row build has 232
    # registers: two resident per SM). H200: M = 2 N = 8192 34.0 vs 57.6 us (K 5120), 54.9 vs 91.5 (K 8192); N = 10240
    # 56.9 vs 58.5, N = 28672 195 vs 222; N = 5120 (160 programs on 264 slots) 54.3 vs 48.3, so not below (commit
    # 48661e0)
    if m >= 2 and n >= 60 * sms:
        block_n = 32
    ng = max(1, min(256 // (g // 2), triton.next_power_of_2(k // g + 1) // 2))
    programs = triton.cdiv(n, block_n)
    chunks = triton.cdiv(k // 2, ng * g // 2)
    split_k = 1 if programs >= 2 * sms else max(1, min(chunks, (2 * sms) // programs))
    return block_n, ng, split_k


def launch_gemv(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                bias, y, block_n, ng, split_k, num_warps=4, interpret=False):
    """y[M, N] for M <= 4; with split_k > 1, ``y`` is a float32 buffer [split_k, M, N] of the parts' partial sums
    (``add_parts`` adds them; the bias is not added). Returns Triton's handle of the launched kernel (its registers
    and spills, for probes)."""
    m = x2d.shape[0]
    nested = nested_code is not None
    return gemv_kernel[(triton.cdiv(n, block_n), split_k)](
        x2d, packed, absmax, code, nested_code if nested else code, nested_absmax if nested else absmax,
        offset if nested else code, bias if bias is not None else code, y,
        n, k, x2d.stride(0), y.stride(-2),
        M=m, MP=triton.next_power_of_2(m), BLOCKSIZE=blocksize, G=group_elems(k, blocksize), NESTED=nested,
        NESTED_BLOCKSIZE=nested_blocksize, HAS_BIAS=bias is not None, BLOCK_N=block_n, NG=ng, SPLIT_K=split_k,
        INT64=(n * k >= 2**31), INTERPRET=interpret, num_warps=num_warps,
    )


@triton.jit
def add_parts_kernel(p_parts, p_bias, p_y, MN, N, S, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
                     INTERPRET: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = o < MN
    p_part = p_parts + o
    acc = tl.load(p_part, mask=mask, other=0.0)
    for _ in range(1, S):  # in part order
        p_part += MN
        acc += tl.load(p_part, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(p_bias + o % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(p_y + o, _cast_out(acc, p_y.dtype.element_ty, INTERPRET), mask=mask)


def add_parts(parts: torch.Tensor, bias, dtype: torch.dtype, interpret: bool = False) -> torch.Tensor:
    """The split-K result [M, N] in ``dtype`` from the parts' float32 partial sums [S, M, N] (+ bias): one kernel
    adds the parts in part order (the same bits on every run, as the CUDA kernels' sums; the atomic adds the GEMV /
    GEMM did before into one float32 buffer differed from run to run: tests/gpu/ops/matmul/test_fuzz_linear.py), adds
    the bias and rounds once."""
    s, m, n = parts.shape
    y = torch.empty(m, n, dtype=dtype, device=parts.device)
    block = 1024
    add_parts_kernel[(triton.cdiv(m * n, block),)](parts, bias if bias is not None else parts, y, m * n, n, s,
                                                   HAS_BIAS=bias is not None, BLOCK=block, INTERPRET=interpret)
    return y


def gemm_config(m: int, n: int, k: int):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by bucketed M (tuned on the H200: NOTES.md)."""
    if m <= 16:
        return 16, 64, 128, 4, 4
    if m <= 32:
        return 32, 64, 128, 4, 4
    if m <= 64:
        return 64, 64, 128, 4, 4
    if m <= 128:
        return 128, 64, 64, 4, 4
    return 128, 128, 64, 8, 3


def gemm_plan(m: int, n: int, k: int, blocksize: int, sms: int, config=None):
    """(config, SPLIT_K): split-K when the output tiles alone would not fill the SMs."""
    bm, bn, bk, warps, stages = config or gemm_config(m, n, k)
    bk = max(bk, group_elems(k, blocksize))
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split_k = 1 if tiles >= sms else max(1, min(triton.cdiv(k, bk) // 4, sms // tiles))
    return (bm, bn, bk, warps, stages), split_k


def launch_gemm(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                bias, y, config, split_k, group_m=8, interpret=False):
    """y[M, N] on tensor cores; with split_k > 1, ``y`` is a float32 buffer [split_k, M, N] of the parts' partial
    sums (``add_parts`` adds them; the bias is not added)."""
    m = x2d.shape[0]
    bm, bn, bk, warps, stages = config
    nested = nested_code is not None
    gemm_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn), split_k)](
        x2d, packed, absmax, code, nested_code if nested else code, nested_absmax if nested else absmax,
        offset if nested else code, bias if bias is not None else code, y,
        m, n, k, x2d.stride(0), y.stride(-2),
        BLOCKSIZE=blocksize, G=group_elems(k, blocksize), NESTED=nested, NESTED_BLOCKSIZE=nested_blocksize,
        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SPLIT_K=split_k,
        INT64=(max(n, m) * k >= 2**31), FP32_IEEE=(x2d.dtype.itemsize == 4), INTERPRET=interpret,
        num_warps=warps, num_stages=stages,
    )


def linear(x2d, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias,
           path: str, manual_bf16: bool = False) -> torch.Tensor:
    """[M, N] by the Triton ``path`` "gemv" or "gemm" (``dispatch.linear_triton`` checked that K has a group);
    ``manual_bf16``: under Triton's CPU interpreter."""
    m = x2d.shape[0]
    w = (packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize)
    sms = num_sms(x2d.device)
    if path == "gemv":
        block_n, ng, split_k = gemv_plan(m, n, k, blocksize, sms)
        y = torch.empty(split_k, m, n, dtype=torch.float32, device=x2d.device) if split_k > 1 else \
            torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
        launch_gemv(x2d, *w, bias if split_k == 1 else None, y, block_n, ng, split_k, interpret=manual_bf16)
    else:
        config, split_k = gemm_plan(m, n, k, blocksize, sms)
        y = torch.empty(split_k, m, n, dtype=torch.float32, device=x2d.device) if split_k > 1 else \
            torch.empty(m, n, dtype=x2d.dtype, device=x2d.device)
        launch_gemm(x2d, *w, bias if split_k == 1 else None, y, config, split_k, interpret=manual_bf16)
    return add_parts(y, bias, x2d.dtype, interpret=manual_bf16) if split_k > 1 else y
