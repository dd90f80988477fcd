"""Host fast path of ``fastnf4.linear`` for plain eager calls.

An eager decode step is bound by host time: transformers' Python runs ahead of a GPU that finishes each
7-linear layer in well under a millisecond. The full path of one call (argument checks of the op contract, the
dispatch over M, the kernel plan, the launch arguments) cost ~60-70 us of host time on the H200's host against
~15 us for bf16 ``F.linear`` (commit aa93226: 58.8 -> 17.7 us at M = 1 with a prepared launch). None of that
depends on x beyond its dtype, M and device, so it is done once per weight and (dtype, M, device, bias) and kept
beside the :class:`~fastnf4.format.NF4Weight` as a prepared launch (``gemv_mma.Prepared``, ``DequantMatmul``); later
calls check only x and launch.

Taken only where ``_ops.linear`` would run its implementation directly anyway (a plain CUDA tensor, no
compile/trace, no autograd, no dispatch or function mode), for the CUDA decode/GEMM kernels (M <= 32) and for
dequantize + cuBLAS above that (prefill: ~150 us of host time per call before, against ~115 us for
bitsandbytes); every other call returns ``None`` and takes the full path. Entries are dropped when a field
of the weight is reassigned (``NF4Weight.__setattr__`` calls :func:`forget`) and rebuilt when the bias object or a tensor's
storage changed (``.data`` swaps).
"""
from __future__ import annotations

import torch

from ... import _ops
from ..._plans import PLANS as _PLANS, forget  # noqa: F401  (forget: re-exported for callers of eager.forget)
from . import dispatch, gemv_mma, wgmma  # (no Triton import)
from .dispatch import MAX_M  # above it only the wgmma bucket of M decides the path: one entry per bucket
from .wgmma import Prepared as WgmmaPrepared

_MAX_PLANS = 64  # per weight: bounds odd uses (many dtypes / devices)


def _addresses(q) -> tuple:
    """The storage the kernels read, which must not have moved since an entry was built (``.data`` swaps)."""
    return (q.packed.data_ptr(), q.absmax.data_ptr(),
            q.nested_absmax.data_ptr() if q.nested_absmax is not None else 0)


def m_key(m: int) -> int:
    """The part of a plan's key that M decides: M itself up to MAX_M (32), then its wgmma bucket (M <= 64 / 128 / 256 / 352 /
    384 / 512, the dispatcher's thresholds: ``dispatch.wgmma_wanted``), then 0 for every larger M."""
    if m <= MAX_M:
        return m
    if m <= wgmma.BLOCK_M[-1]:
        return -wgmma.block_m(m)
    return next((-top for top in wgmma.WIDE_M_BUCKETS if m <= top), 0)


def try_linear(x: torch.Tensor, q, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ dequant(q).T + bias`` through a cached launch, or ``None`` when this call needs the full path."""
    if not _ops.plain_eager(x) or not x.is_cuda or _ops.wants_grad(x, bias):
        return None
    if torch.is_autocast_enabled("cuda") and x.dtype != torch.get_autocast_dtype("cuda"):
        return None  # (the full path keeps x's dtype under autocast; a prepared dense matmul would not)
    if bias is not None and type(bias) is not torch.Tensor and type(bias) is not torch.nn.Parameter:
        return None
    shape = q.shape
    if len(shape) != 2 or x.dim() < 1 or not x.is_contiguous():
        return None
    n, k = shape
    if x.shape[-1] != k or k == 0 or n == 0:
        return None
    if q.packed.dim() == 3:
        return None  # (the tiled layout [N/16, K/64, 512]: the full path converts it)
    if x.data_ptr() % 16:
        return None
    m = x.numel() // k
    key = (x.dtype, m_key(m), x.get_device())
    plans = _PLANS.get(q)
    entry = plans.get(key) if plans is not None else None
    if entry is None or entry[1] is not bias or entry[0] != _addresses(q):
        entry = _build(x.view(m, k), q, bias, key)
        if entry is None:
            return None
    prepared = entry[2]
    return None if prepared is None else run(prepared, x, n, bias)


def _build(x2d: torch.Tensor, q, bias, key):
    """The entry of this weight and key: its addresses, the bias object and ``prepare``'s launch (``None`` =
    take the full path)."""
    from ...api import linear_args

    if torch.cuda.is_current_stream_capturing():
        return None  # nothing is built inside a capture (the split-K counters would be missing); full path
    prepared = prepare(x2d, linear_args(q, bias)) if x2d.shape[0] else None
    plans = _PLANS.setdefault(q, {})
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    entry = (_addresses(q), bias, prepared)
    plans[key] = entry
    return entry


def prepare(x2d: torch.Tensor, args: tuple):
    """The launch for x2d's M, dtype and device and the ``fastnf4::linear`` arguments ``args``: check the call as
    the op contract does (raises on bad input exactly as the full path would), pick the path as the dispatcher
    does, and return a ``gemv_mma.Prepared`` (M <= 32), a ``wgmma.Prepared`` (M > 2) or a ``DequantMatmul``
    (any M) or ``None`` (any other path).
    Shared by ``try_linear`` and the bitsandbytes patch."""
    _ops.check_linear_args(x2d, *args)
    packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, _ = args
    with _ops.on_device(x2d):  # the kernels' libraries and plans are asked for on the weight's GPU
        path = dispatch.pick_path(x2d, packed, blocksize, n, k, nested_code is not None, nested_blocksize,
                                  absmax=absmax)
        if path == "mma":
            return gemv_mma.Prepared(x2d, *args)
        if path == "wgmma":
            return WgmmaPrepared(*args)
        # (also at M <= 32: the k+v projections at M 3-32 take this path, where the full path's host cost, ~120 us a
        # call on the H200, is 8x that of the prepared launches; commit a5c6e8f)
        if path == "dequant+matmul":
            return DequantMatmul(x2d.dtype, *args)
    return None


def run(prepared, x: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """Launch ``prepare``'s result on x (contiguous, 16-byte aligned, of the M, dtype and device it was prepared
    for; for a ``gemv_mma.Prepared`` also the same bias), with x's GPU current, and give the output x's leading
    shape."""
    with _ops.on_device(x):  # launches go to the current device's streams
        if type(prepared) is DequantMatmul:
            return prepared(x, bias)
        y = prepared(x.view(-1, x.shape[-1]), bias) if type(prepared) is WgmmaPrepared else prepared(x)  # [M, N]
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


class DequantMatmul:
    """Dequantize + cuBLAS (prefill, and the small weights at M 3-32): fastnf4 dequantize into a fresh buffer, then
    cuBLAS, with the dequantize launch prepared once (``dequantize.kernel.Prepared`` with the compiled kernel's own
    runner; once that runner is in use, ``holds_tensors`` is False: the launch keeps only addresses)."""

    __slots__ = ("dq", "n", "k", "dtype")

    def __init__(self, dtype, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset,
                 nested_blocksize, bias):
        from ..dequantize import kernel as dq_kernel

        self.dq = dq_kernel.Prepared(packed, absmax, code, blocksize, n * k, nested_code, nested_absmax, offset,
                                     nested_blocksize, fast=True)
        self.n, self.k, self.dtype = n, k, dtype

    @property
    def holds_tensors(self) -> bool:
        return self.dq.runner is None

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        wd = torch.empty(self.n, self.k, dtype=self.dtype, device=x.device)
        self.dq(wd)
        return torch.nn.functional.linear(x, wd, bias)
