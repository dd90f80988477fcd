"""The public Python API: ``quantize``, ``dequantize``, ``linear`` and ``repack`` over
:class:`~fastnf4.format.NF4Weight`."""
from __future__ import annotations

import torch

from . import _ops
from .codebooks import BLOCKSIZES, NESTED_BLOCKSIZE, code_4bit, dynamic_map, kernel_code
from .format import FLOAT_DTYPES, NF4Weight, _short, int_field
from .layouts import LAYOUTS, repack  # noqa: F401  (public: fastnf4.LAYOUTS, fastnf4.repack)
from .ops.matmul import eager as _eager


def quantize(
    w: torch.Tensor, blocksize: int = 64, double_quant: bool = True, quant_type: str = "nf4"
) -> NF4Weight:
    """Quantize ``w`` (fp16/bf16/fp32, any shape) blockwise to 4 bits, exactly as bitsandbytes'
    ``quantize_4bit(w, blocksize, compress_statistics=double_quant, quant_type)`` does on CUDA.

    NaN and Inf behave as in bitsandbytes: NaN elements are ignored by the block absmax and get code 0
    (-1.0 for NF4); an Inf makes its block's absmax Inf, so every finite element of that block decodes
    to NaN (code 0.0 times Inf) and the Inf itself to -Inf (Inf / Inf is NaN: code 0); with double quant
    the Inf absmax makes the offset (their mean) Inf and every element of the tensor decodes to NaN. An
    all-zero block decodes to -0.0, an all-NaN block to +FLT_MAX (its absmax is the max's start, -FLT_MAX).
    Finite values near the float32 limit too: a block whose absmax is >= 2^126 decodes to zeros (bitsandbytes'
    reciprocal of the absmax flushes to zero), and with double quant absmaxes summing past FLT_MAX make the
    offset Inf and every element NaN (checked against bitsandbytes on the GPU).
    """
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"quantize takes a torch.Tensor, got {type(w).__name__}")
    blocksize = int_field(blocksize, "blocksize")
    if blocksize not in BLOCKSIZES:  # (here: an int beyond int64 cannot even reach the op's own check)
        raise ValueError(f"unsupported blocksize {_short(blocksize)}; expected one of {BLOCKSIZES}")
    # a bool (Python's or NumPy's) or 0 / 1; not any truthy object
    if isinstance(double_quant, str) or type(double_quant).__name__ not in ("bool", "bool_", "int") or \
            double_quant not in (True, False):
        raise TypeError(f"double_quant must be a bool, got {type(double_quant).__name__} {_short(double_quant)}")
    double_quant = bool(double_quant)
    if not isinstance(quant_type, str):
        raise TypeError(f"quant_type must be a str, got {type(quant_type).__name__}")
    packed, absmax = _ops.quantize_4bit(w, blocksize, quant_type)
    common = dict(
        packed=packed.view(-1, 1), code=code_4bit(quant_type, w.device), blocksize=blocksize, shape=w.shape,
        dtype=w.dtype, quant_type=quant_type,
    )
    if not double_quant:
        return NF4Weight(absmax=absmax, **common)
    offset = absmax.mean()  # the same torch reduction bitsandbytes uses, so the offset is bit-identical
    nested_code = dynamic_map(w.device)
    qabsmax, nested_absmax = _ops.quantize_8bit(absmax, offset, nested_code, NESTED_BLOCKSIZE)
    return NF4Weight(
        absmax=qabsmax, nested_absmax=nested_absmax, nested_code=nested_code, offset=offset,
        nested_blocksize=NESTED_BLOCKSIZE, **common,
    )


def dequantize(q: NF4Weight, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense weight of ``q`` with shape ``q.shape`` in ``dtype`` (default ``q.dtype``), bit-exact with
    bitsandbytes' CUDA ``dequantize_4bit``. With ``out``, writes there (its dtype is the output dtype) and
    returns it viewed with ``q.shape``. Runs on ``q``'s device and the current stream, no host sync. Double-quant
    statistics in float16/bfloat16 (bitsandbytes' nested_dtype) give what bitsandbytes' ``F.dequantize_4bit`` gives
    (see :class:`~fastnf4.format.NF4Weight`). Every layout (``q.layout``) gives the same values."""
    if not isinstance(q, NF4Weight):
        raise TypeError(f"dequantize takes an NF4Weight, got {type(q).__name__}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    code = kernel_code(q.quant_type, q.device)
    packed = q.op_packed
    args = (packed, q.absmax, code, q.blocksize, q.numel)
    nested = (q.nested_code, q.nested_absmax, q.offset, q.nested_blocksize)
    # plain eager calls run the op's body (the op's dispatch costs ~100 us of host time; the op has no autograd)
    direct = _ops.plain_eager(packed) and not (torch.is_grad_enabled() and q.absmax.requires_grad)
    if out is None:
        fn = _ops.dequantize_4bit_impl if direct else _ops.dequantize_4bit
        return fn(*args, dtype or q.dtype, *nested).view(q.shape)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if dtype is not None and out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype} but dtype={dtype} was asked for")
    if torch.is_grad_enabled() and out.requires_grad:
        # (as torch's own out= functions: an in-place write has no gradient to give back)
        raise ValueError("out requires grad, but dequantize(out=...) writes in place and does not support automatic "
                         "differentiation; pass an out that does not require grad, or call it under torch.no_grad()")
    if direct and type(out) is torch.Tensor:
        _ops.dequantize_4bit_out_impl(*args, *nested, out)
        # what the op's dispatch does for a mutated argument: autograd then refuses a backward that saved the old values
        if not out.is_inference():
            torch.autograd.graph.increment_version(out)
    else:
        _ops.dequantize_4bit_out(*args, *nested, out)
    return out.view(q.shape)


def linear_args(q: NF4Weight, bias: torch.Tensor | None = None) -> tuple:
    """The arguments after ``x`` of ``fastnf4::linear`` (and of the matmul kernels behind it) for a 2-D ``q``; the packed
    tensor in ``q``'s layout (``NF4Weight.op_packed``: 3-D for the fastnf4 layout)."""
    n, k = q.shape
    return (q.op_packed, q.absmax, kernel_code(q.quant_type, q.device), q.blocksize, n, k, q.nested_code,
            q.nested_absmax, q.offset, q.nested_blocksize, bias)


def linear(x: torch.Tensor, q: NF4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(q, x.dtype).T + bias`` for a 2-D ``q`` ([out_features, in_features]) and ``x`` of any
    leading shape, fp16/bf16 (fp32 works). Fused kernels read the packed weight directly (GEMV for a few
    rows, tensor-core GEMM up to a few hundred, dequantize + cuBLAS beyond: ``ops/matmul/dispatch.py``). The weight is
    the one :func:`dequantize` gives, also for float16/bfloat16 double-quant statistics (bitsandbytes' ``gemm_4bit`` op
    decodes those in float32 instead: see :class:`~fastnf4.format.NF4Weight`). Every layout (``q.layout``) gives the
    same result."""
    if not isinstance(q, NF4Weight):
        raise TypeError(f"linear takes an NF4Weight, got {type(q).__name__}")
    if len(q.shape) != 2:
        raise ValueError(f"linear needs a 2-D weight [out_features, in_features], got shape {tuple(q.shape)}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    y = _eager.try_linear(x, q, bias)  # plain eager CUDA decode calls: a launch prepared once per weight
    if y is not None:
        return y
    return _ops.linear(x, *linear_args(q, bias))
