"""Triton kernel: packed 4-bit codes + (optionally double-quantized) absmax -> fp16 / bf16 / fp32.

Shape contract: ``packed`` is ``n_bytes = ceil(numel / 2)`` uint8, ``absmax`` has ``ceil(numel / BLOCKSIZE)``
entries (float32, or uint8 codes when NESTED), ``out`` is ``numel`` contiguous elements.

Tiling: a program owns ``ROWS x COLS`` consecutive packed bytes, viewed as ROWS rows of COLS bytes; COLS
divides ``BLOCKSIZE // 2`` so each row needs exactly one absmax, read once per row (not per element).
Codes are looked up in the 16-entry float32 table through L1 (two 4-byte gathers per byte).
Double-quant statistics are decoded in the same launch (bitsandbytes needs a second kernel): a uint8
code, a 256-entry table lookup, one product and one sum; the launch passes ``enable_fp_fusion=False`` so
that product and sum round separately, as bitsandbytes' two steps do.

Launch: with programmatic dependent launch on sm_90+ (``_triton.pdl``; ``PDL``), so the grid is put on the GPU
while the previous kernel drains; it waits for that kernel (``gdc_wait``) before touching memory. H200: +0.3 to
+5 points of copy bandwidth, most on the small shapes (commit 3ad4457; results in
e8fb4ca:benchmarks/results/h200-probe-pdl.json). Only the programs of the grid's last wave (``pid >= trig_from``)
signal that the next grid may be scheduled: the signal doubles a program's launch cost, and the next grid may go on
the GPU once every program has signalled *or exited*, so the tail's signals are enough. H200: +0.2 to +0.6 points on
every shape of >= 56 MB against every program signalling (commit cab0e71; results in
cab0e71:benchmarks/results/h200-probe-dequant-trigger.json).

Rounding: ``code * absmax`` in float32, then one round-to-nearest-even to the output dtype. Triton's CPU
interpreter does not round float32 -> bf16 to nearest even, so under the interpreter (``MANUAL_BF16``)
the rounding is done with integer arithmetic instead; on GPUs the hardware conversion is used.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import _triton


@triton.jit
def _round_to_bf16(x):
    # round-to-nearest-even on the bit pattern, NaN kept NaN (quiet)
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit(do_not_specialize=["trig_from"])
def dequantize_4bit_kernel(
    p_packed, p_absmax, p_code, p_out,
    p_ncode, p_nabsmax, p_offset,
    n_bytes, numel, n_blocks, trig_from,
    BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
    ROWS: tl.constexpr, COLS: tl.constexpr, INT64: tl.constexpr, MANUAL_BF16: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        # programmatic dependent launch (sm_90+): this grid may be launched while the previous kernel on the
        # stream drains; wait for it before touching memory (its writes may be our inputs, or read our output)
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    if PDL:
        if pid >= trig_from:  # the last wave of programs: the next grid may be scheduled once they all started
            tl.extra.cuda.gdc_launch_dependents()
    if INT64:
        pid = pid.to(tl.int64)
    # [ROWS, COLS] bytes, COLS dividing BLOCKSIZE // 2: one absmax (and one double-quant decode) per row
    o_row = pid * (ROWS * COLS) + tl.arange(0, ROWS) * COLS
    o_bytes = o_row[:, None] + tl.arange(0, COLS)[None, :]
    o_blk = o_row // (BLOCKSIZE // 2)
    m_blk = o_blk < n_blocks
    if NESTED:
        b_q = tl.load(p_absmax + o_blk, mask=m_blk, other=0).to(tl.int32)
        b_scale2 = tl.load(p_nabsmax + o_blk // NESTED_BLOCKSIZE, mask=m_blk, other=0.0)
        b_absmax = tl.load(p_ncode + b_q) * b_scale2 + tl.load(p_offset)
    else:
        b_absmax = tl.load(p_absmax + o_blk, mask=m_blk, other=0.0)
    # read-once bytes and write-once values: evict-first loads with streaming (.cs) stores (each hint alone +0.5 points,
    # the pair +2-3 on the H200; commit fdc75c5)
    b_packed = tl.load(p_packed + o_bytes, mask=o_bytes < n_bytes, other=0, eviction_policy="evict_first")

    b_hi = tl.load(p_code + (b_packed >> 4).to(tl.int32)) * b_absmax[:, None]
    b_lo = tl.load(p_code + (b_packed & 15).to(tl.int32)) * b_absmax[:, None]
    # element 2i (high nibble) then 2i+1 (low nibble); join + reshape keeps each thread's outputs
    # contiguous, so stores are 16-byte vectors (a 3-D [.., .., 2] store measured 8% of copy: L2-bound)
    b_val = tl.reshape(tl.join(b_hi, b_lo), (ROWS, 2 * COLS))
    o_out = 2 * o_row[:, None] + tl.arange(0, 2 * COLS)[None, :]
    out_ty = p_out.dtype.element_ty
    if MANUAL_BF16 and out_ty == tl.bfloat16:
        b_cast = _round_to_bf16(b_val)
    else:
        b_cast = b_val.to(out_ty)
    tl.store(p_out + o_out, b_cast, mask=o_out < numel, cache_modifier=".cs")


# Packed bytes per program (H200 sweeps, commit fdc75c5): with the cache hints, 1024 as 32 rows x 32 bytes at 2 warps; a
# flat tile with per-byte absmax was 1-2% slower, 8 KiB tiles and a persistent grid slower still (NOTES.md,
# "Dequantize").
TILE_BYTES = 1024
NUM_WARPS = 2


class Prepared:
    """Launches of ``dequantize_4bit_kernel`` for one weight: grid and arguments worked out once (``launch`` makes
    one per call; ``ops/matmul/eager.py`` keeps one per weight for eager prefill calls).

    ``fast=True`` launches through the compiled kernel's own runner after the first call, skipping the ~30 us of
    ``JITFunction.run`` (argument binding, specialization key, cache lookup) that a fixed weight never needs: the
    same compiled kernel is valid for every call because every argument but ``out`` is the same and ``out`` is a
    fresh, aligned allocation. The runner's argument convention is Triton-internal, so the first fast launch in a
    process (weight pointers passed as ints, as later launches do) is checked bitwise against a normal launch
    (``_runner_ok``) and the runner is used only if they agree.
    """

    def __init__(self, packed_u8, absmax, code, blocksize, numel, nested_code=None, nested_absmax=None, offset=None,
                 nested_blocksize=256, tile_bytes: int | None = None, num_warps: int | None = None,
                 manual_bf16: bool = False, fast: bool = False, pdl: bool | None = None):
        n_bytes = (numel + 1) // 2
        nested = nested_code is not None
        tile = tile_bytes or TILE_BYTES
        cols = min(blocksize // 2, tile, 128)
        rows = max(tile // cols, 1)
        self.numel = numel
        self.grid = (triton.cdiv(n_bytes, rows * cols),)
        self.num_warps = num_warps or NUM_WARPS
        pdl = _triton.pdl(packed_u8.device) if pdl is None else pdl
        trig_from = max(self.grid[0] - _wave(packed_u8.device, self.num_warps), 0) if pdl else 0
        self.args = [packed_u8, absmax, code, None,
                     nested_code if nested else code, nested_absmax if nested else absmax, offset if nested else code,
                     n_bytes, numel, absmax.numel(), trig_from]
        self.constexprs = dict(BLOCKSIZE=blocksize, NESTED=nested, NESTED_BLOCKSIZE=nested_blocksize, ROWS=rows,
                               COLS=cols, INT64=(self.grid[0] * rows * cols * 2 >= 2**31), MANUAL_BF16=manual_bf16,
                               PDL=pdl)
        self.fast = fast
        self.runner = None

    def __call__(self, out):
        """Fill the flat ``out`` (``numel`` elements) on the current stream. Arguments are pre-validated."""
        if self.numel == 0:
            return out
        args = list(self.args)
        args[3] = out
        if self.runner is not None:
            self.runner(*args, *self.constexprs.values(), stream=torch._C._cuda_getCurrentRawStream(out.get_device()))
            return out
        compiled = dequantize_4bit_kernel[self.grid](*args, **self.constexprs, num_warps=self.num_warps,
                                                     enable_fp_fusion=False,
                                                     **({"launch_pdl": True} if self.constexprs["PDL"] else {}))
        if self.fast and _runner_ok(self, compiled, out):
            self.runner = compiled[(self.grid[0], 1, 1)]  # the runner indexes all three grid dimensions
            # from now on only addresses: the launcher takes ints for pointers, and a Prepared kept in a cache
            # must not keep the weight's tensors alive
            self.args = _addresses(self.args)
        return out


@functools.cache
def _wave_of(index: int, num_warps: int) -> int:
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count * (getattr(props, "max_threads_per_multi_processor", 2048) // (32 * num_warps))


def _wave(device: torch.device, num_warps: int) -> int:
    """Programs of ``num_warps`` warps resident on the whole GPU at once, as far as threads allow (H200: 132 SMs x
    32 two-warp programs): the grid's last wave."""
    return _wave_of(device.index if device.index is not None else torch.cuda.current_device(), num_warps)


def _addresses(args: list) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]


_RUNNER_CHECKED: list = []  # [bool] once the first fast launch of this process was compared


def _runner_ok(prep: Prepared, compiled, out) -> bool:
    if not _RUNNER_CHECKED:
        ok = False
        try:
            if torch.cuda.is_current_stream_capturing():
                return False  # checked later, outside a capture
            other = torch.empty_like(out).fill_(float("nan"))
            args = _addresses(prep.args)
            args[3] = other
            compiled[(prep.grid[0], 1, 1)](*args, *prep.constexprs.values(),
                                stream=torch._C._cuda_getCurrentRawStream(out.get_device()))
            ok = bool(torch.equal(other, out))
        except Exception:  # another Triton's runner convention: keep the normal launch
            ok = False
        _RUNNER_CHECKED.append(ok)
    return _RUNNER_CHECKED[0]


def launch(
    packed_u8, absmax, code, out, blocksize, numel,
    nested_code=None, nested_absmax=None, offset=None, nested_blocksize=256,
    tile_bytes: int | None = None, num_warps: int | None = None, manual_bf16: bool = False,
):
    """Fill the flat ``out`` (``numel`` elements) on the current stream. Arguments are pre-validated."""
    return Prepared(packed_u8, absmax, code, blocksize, numel, nested_code, nested_absmax, offset, nested_blocksize,
                    tile_bytes, num_warps, manual_bf16)(out)


# Launches kept for plain eager calls on a GPU (``launch_cached``): key -> Prepared running through the compiled
# kernel's runner. An entry holds addresses only, and its key holds everything its launch depends on, so a hit is
# right for any tensors with that key (a later weight at the same addresses included).
_CACHED: dict = {}
_MAX_CACHED = 4096


def launch_cached(
    packed_u8, absmax, code, out, blocksize, numel, nested_code=None, nested_absmax=None, offset=None,
    nested_blocksize=256,
):
    """``launch`` for CUDA tensors through a prepared launch kept per argument set: Triton's ``JITFunction.run`` (~30
    us of host time: binding, specialization key, cache lookup) runs once per weight, dtype and device, not per call
    (the backward's dequantize of every 4-bit layer in a training step; ``fastnf4.dequantize``; the bitsandbytes
    patch's dequantize kernels). ``out`` off 16-byte alignment takes ``launch`` (the kernel is specialised on it)."""
    if out.data_ptr() % 16:
        return launch(packed_u8, absmax, code, out, blocksize, numel, nested_code, nested_absmax, offset,
                      nested_blocksize)
    nested = nested_code is not None
    key = (out.dtype, out.get_device(), numel, blocksize, packed_u8.data_ptr(), absmax.data_ptr(), absmax.dtype,
           absmax.numel(), code.data_ptr(), nested_code.data_ptr() if nested else 0,
           nested_absmax.data_ptr() if nested else 0, offset.data_ptr() if nested else 0, nested_blocksize)
    prepared = _CACHED.get(key)
    if prepared is not None:
        return prepared(out)
    prepared = Prepared(packed_u8, absmax, code, blocksize, numel, nested_code, nested_absmax, offset,
                        nested_blocksize, fast=True)
    prepared(out)
    if prepared.runner is not None:  # addresses only from now on
        if len(_CACHED) >= _MAX_CACHED:
            _CACHED.clear()
        _CACHED[key] = prepared
    return out
