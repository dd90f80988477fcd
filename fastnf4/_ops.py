"""The op contract: every ``fastnf4::`` custom op, its argument checks and its fake (meta) implementation.

Each op has one real implementation that asks :func:`fastnf4._triton.use_triton` whether the Triton kernel
can run on the tensors' device and otherwise runs the pure-PyTorch reference (``ops/<family>/naive.py``).
The checks run in the real and the fake implementation alike, so a bad call fails with a ``ValueError`` or
``TypeError`` naming the problem, eagerly, under ``torch.compile`` and before any kernel is launched.

Ops (flat tensors; the Python API in :mod:`fastnf4.api` reshapes):

* ``dequantize_4bit(packed, absmax, code, blocksize, numel, dtype, nested_code?, nested_absmax?, offset?,
  nested_blocksize) -> Tensor[numel]`` and ``dequantize_4bit_out(..., out)`` writing into ``out``.
* ``quantize_4bit(A, blocksize, quant_type) -> (packed uint8 [ceil(n/2)], absmax float32 [ceil(n/bs)])``.
* ``quantize_8bit(A, offset, code, blocksize) -> (uint8 [n], absmax float32 [ceil(n/bs)])``: blockwise 8-bit
  quantization of ``A - offset`` with a 256-entry sorted code (double quantization of the statistics).

``packed`` of ``dequantize_4bit`` / ``dequantize_4bit_out`` / ``linear`` is in either layout (:mod:`fastnf4.layouts`):
flat uint8 bytes in bitsandbytes' order, or the 3-D uint8 ``[N/16, K/64, 512]`` of the fastnf4 layout (the
dimensions say which; the statistics are in bitsandbytes' layout in both). The kernels that read the bnb order get a
3-D packed converted by :func:`bnb_order` first.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

from . import _triton
from . import layouts
from .codebooks import BLOCKSIZES, QUANT_TYPES
from .format import FLOAT_DTYPES
from .ops.dequantize import naive as dq_naive
from .ops.quantize import naive as q_naive


def _require(cond: bool, exc: type, msg: str) -> None:
    if not cond:
        raise exc(msg)


def _same_device(what: str, t: torch.Tensor, device: torch.device) -> None:
    _require(t.device == device, ValueError, f"{what} is on {t.device}, expected {device} (device mismatch)")


_CURRENT = contextlib.nullcontext()  # the context of a call whose tensors are on the current device already


def on_device(t: torch.Tensor):
    """A context that makes ``t``'s GPU the current device for the launches inside it.

    Triton launches on the current device's stream, and the CUDA runtime launches only into streams of the current
    device, whatever device the tensors are on. A model split over GPUs (transformers' ``device_map="auto"``, whose
    hooks move tensors but leave the current device at cuda:0) calls layers on cuda:1 with cuda:0 current: without
    this, a kernel would read another GPU's memory (an illegal address, bitsandbytes issue #120) or fail to launch.
    Free (no switch) when ``t`` is on the current device or not on a GPU."""
    if t.is_cuda:
        index = t.get_device()
        if index != torch.cuda.current_device():
            return torch.cuda.device(index)
    return _CURRENT


def check_dequantize_args(
    packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, numel: int,
    dtype: torch.dtype, nested_code: Optional[torch.Tensor], nested_absmax: Optional[torch.Tensor],
    offset: Optional[torch.Tensor], nested_blocksize: int,
) -> None:
    _require(blocksize in BLOCKSIZES, ValueError, f"unsupported blocksize {blocksize}; expected one of {BLOCKSIZES}")
    _require(dtype in FLOAT_DTYPES, TypeError, f"output dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    _require(numel >= 0, ValueError, f"numel must be >= 0, got {numel}")
    _require(packed.dtype == torch.uint8, TypeError, f"packed must be uint8, got {packed.dtype}")
    _require(packed.is_contiguous(), ValueError, "packed must be contiguous")
    if packed.dim() == 3:  # the fastnf4 layout
        layouts.check_packed3d_numel(packed, numel)
    _require(
        packed.numel() == (numel + 1) // 2, ValueError,
        f"packed has {packed.numel()} bytes but {numel} elements need {(numel + 1) // 2} (shape/packed size mismatch)",
    )
    dev = packed.device
    nblocks = -(-numel // blocksize)
    _require(code.dtype == torch.float32 and code.numel() == 16, TypeError, "code must be a float32 table of 16 entries")
    _same_device("code", code, dev)
    nested = nested_code is not None
    _require(
        (nested_absmax is not None) == nested and (offset is not None) == nested, ValueError,
        "double quantization needs nested_code, nested_absmax and offset together",
    )
    _require(
        absmax.dtype == (torch.uint8 if nested else torch.float32), TypeError,
        f"absmax must be {'uint8 (nested)' if nested else 'float32'}, got {absmax.dtype}",
    )
    _require(absmax.numel() == nblocks, ValueError, f"absmax has {absmax.numel()} entries, expected {nblocks}")
    _require(absmax.is_contiguous(), ValueError, "absmax must be contiguous")
    _same_device("absmax", absmax, dev)
    if nested:
        _require(nested_blocksize in BLOCKSIZES, ValueError, f"unsupported nested_blocksize {nested_blocksize}")
        n2 = -(-nblocks // nested_blocksize)
        _require(
            nested_code.dtype == torch.float32 and nested_code.numel() == 256, TypeError,
            "nested_code must be a float32 table of 256 entries",
        )
        _require(
            nested_absmax.dtype == torch.float32 and nested_absmax.numel() == n2, ValueError,
            f"nested_absmax must be float32 with {n2} entries, got {nested_absmax.dtype} with {nested_absmax.numel()}",
        )
        _require(offset.dtype == torch.float32 and offset.numel() == 1, TypeError, "offset must be a float32 scalar tensor")
        for what, t in (("nested_code", nested_code), ("nested_absmax", nested_absmax), ("offset", offset)):
            _same_device(what, t, dev)
            _require(t.is_contiguous(), ValueError, f"{what} must be contiguous")


def bnb_order(packed: torch.Tensor) -> torch.Tensor:
    """``packed`` in bitsandbytes' byte order, for the kernels that read only that order: a 3-D (fastnf4-layout)
    tensor is converted into a temporary copy on its device (``layouts.to_bnb_order``), a bnb one returned as it is.
    The one place the ops convert; kernels that read the fastnf4 layout are dispatched before it."""
    return layouts.to_bnb_order(packed) if packed.dim() == 3 else packed


def _dequantize_into(out, packed, absmax, code, blocksize, numel, nested_code, nested_absmax, offset, nested_blocksize):
    packed = bnb_order(packed)
    if _triton.use_triton(packed.device):
        from .ops.dequantize import kernel

        with on_device(packed):
            if packed.is_cuda:  # (the eager op bodies: a launch prepared once per weight, dtype and device)
                kernel.launch_cached(packed, absmax, code, out, blocksize, numel, nested_code, nested_absmax, offset,
                                     nested_blocksize)
            else:  # the interpreter
                kernel.launch(packed, absmax, code, out, blocksize, numel, nested_code, nested_absmax, offset,
                              nested_blocksize, manual_bf16=True)
    else:  # (out is contiguous, of any shape with numel elements: check_out)
        out.view(-1).copy_(
            dq_naive.dequantize(
                packed, absmax, code, blocksize, numel, out.dtype, nested_code, nested_absmax, offset, nested_blocksize
            )
        )


def dequantize_4bit_impl(
    packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, numel: int, dtype: torch.dtype,
    nested_code: Optional[torch.Tensor], nested_absmax: Optional[torch.Tensor], offset: Optional[torch.Tensor],
    nested_blocksize: int,
) -> torch.Tensor:
    """The body of ``fastnf4::dequantize_4bit``, callable without the op's dispatch where nothing needs to see the op
    (the bitsandbytes patch's kernels, which already run below autograd and tracing)."""
    check_dequantize_args(packed, absmax, code, blocksize, numel, dtype, nested_code, nested_absmax, offset, nested_blocksize)
    out = torch.empty(numel, dtype=dtype, device=packed.device)
    _dequantize_into(out, packed, absmax, code, blocksize, numel, nested_code, nested_absmax, offset, nested_blocksize)
    return out


dequantize_4bit = torch.library.custom_op("fastnf4::dequantize_4bit", dequantize_4bit_impl, mutates_args=())


@dequantize_4bit.register_fake
def _(packed, absmax, code, blocksize, numel, dtype, nested_code, nested_absmax, offset, nested_blocksize):
    check_dequantize_args(packed, absmax, code, blocksize, numel, dtype, nested_code, nested_absmax, offset, nested_blocksize)
    return packed.new_empty(numel, dtype=dtype)


def dequantize_4bit_out_impl(
    packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, numel: int,
    nested_code: Optional[torch.Tensor], nested_absmax: Optional[torch.Tensor], offset: Optional[torch.Tensor],
    nested_blocksize: int, out: torch.Tensor,
) -> None:
    """The body of ``fastnf4::dequantize_4bit_out`` (see ``dequantize_4bit_impl``)."""
    check_out(out, numel, packed.device)
    check_dequantize_args(packed, absmax, code, blocksize, numel, out.dtype, nested_code, nested_absmax, offset, nested_blocksize)
    for name, t in (("packed", packed), ("absmax", absmax), ("nested_absmax", nested_absmax), ("offset", offset)):
        _require(t is None or not _overlap(out, t), ValueError, f"out overlaps the weight's {name} in memory")
    _dequantize_into(out, packed, absmax, code, blocksize, numel, nested_code, nested_absmax, offset, nested_blocksize)


dequantize_4bit_out = torch.library.custom_op("fastnf4::dequantize_4bit_out", dequantize_4bit_out_impl,
                                              mutates_args=("out",))


@dequantize_4bit_out.register_fake
def _(packed, absmax, code, blocksize, numel, nested_code, nested_absmax, offset, nested_blocksize, out):
    check_out(out, numel, packed.device)
    check_dequantize_args(packed, absmax, code, blocksize, numel, out.dtype, nested_code, nested_absmax, offset, nested_blocksize)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes of two tensors (contiguous spans here) share memory."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def check_out(out: torch.Tensor, numel: int, device: torch.device) -> None:
    _require(out.numel() == numel, ValueError, f"out has {out.numel()} elements, expected {numel}")
    _require(out.is_contiguous(), ValueError, "out must be contiguous")
    _same_device("out", out, device)


# ------------------------------------------------------------------------------------------ quantize
def check_quantize_args(A: torch.Tensor, blocksize: int, quant_type: str) -> None:
    _require(A.dtype in FLOAT_DTYPES, TypeError, f"quantize takes {FLOAT_DTYPES} input, got {A.dtype}")
    _require(blocksize in BLOCKSIZES, ValueError, f"unsupported blocksize {blocksize}; expected one of {BLOCKSIZES}")
    _require(quant_type in QUANT_TYPES, ValueError, f"unknown quant_type {quant_type!r}; expected one of {QUANT_TYPES}")
    _require(A.is_contiguous(), ValueError, "the tensor to quantize must be contiguous")


@torch.library.custom_op("fastnf4::quantize_4bit", mutates_args=())
def quantize_4bit(A: torch.Tensor, blocksize: int, quant_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_args(A, blocksize, quant_type)
    n = A.numel()
    packed = torch.empty((n + 1) // 2, dtype=torch.uint8, device=A.device)
    absmax = torch.empty(-(-n // blocksize), dtype=torch.float32, device=A.device)
    if n == 0:
        return packed, absmax
    if _triton.use_triton(A.device):
        from .ops.quantize import kernel

        with on_device(A):
            kernel.launch_4bit(A.reshape(-1), packed, absmax, blocksize, quant_type)
    else:
        p, a = q_naive.quantize_4bit(A.reshape(-1), blocksize, quant_type)
        packed.copy_(p)
        absmax.copy_(a)
    return packed, absmax


@quantize_4bit.register_fake
def _(A, blocksize, quant_type):
    check_quantize_args(A, blocksize, quant_type)
    n = A.numel()
    return A.new_empty((n + 1) // 2, dtype=torch.uint8), A.new_empty(-(-n // blocksize), dtype=torch.float32)


def check_quantize_8bit_args(A: torch.Tensor, offset: torch.Tensor, code: torch.Tensor, blocksize: int) -> None:
    _require(A.dtype == torch.float32, TypeError, f"8-bit statistics quantization takes float32, got {A.dtype}")
    _require(A.is_contiguous(), ValueError, "the statistics to quantize must be contiguous")
    _require(blocksize in BLOCKSIZES, ValueError, f"unsupported nested blocksize {blocksize}")
    _require(code.dtype == torch.float32 and code.numel() == 256, TypeError, "code must be a float32 table of 256 entries")
    _require(offset.dtype == torch.float32 and offset.numel() == 1, TypeError, "offset must be a float32 scalar tensor")
    _same_device("code", code, A.device)
    _same_device("offset", offset, A.device)


@torch.library.custom_op("fastnf4::quantize_8bit", mutates_args=())
def quantize_8bit(
    A: torch.Tensor, offset: torch.Tensor, code: torch.Tensor, blocksize: int
) -> tuple[torch.Tensor, torch.Tensor]:
    check_quantize_8bit_args(A, offset, code, blocksize)
    n = A.numel()
    q = torch.empty(n, dtype=torch.uint8, device=A.device)
    absmax = torch.empty(-(-n // blocksize), dtype=torch.float32, device=A.device)
    if n == 0:
        return q, absmax
    if _triton.use_triton(A.device):
        from .ops.quantize import kernel

        with on_device(A):
            kernel.launch_8bit(A.reshape(-1), offset, code, q, absmax, blocksize)
    else:
        q_ref, a_ref = q_naive.quantize_8bit(A.reshape(-1), offset, code, blocksize)
        q.copy_(q_ref)
        absmax.copy_(a_ref)
    return q, absmax


@quantize_8bit.register_fake
def _(A, offset, code, blocksize):
    check_quantize_8bit_args(A, offset, code, blocksize)
    n = A.numel()
    return A.new_empty(n, dtype=torch.uint8), A.new_empty(-(-n // blocksize), dtype=torch.float32)


# ------------------------------------------------------------------------------------------- linear
def check_linear_args(x, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize,
                      bias):
    _require(x.dtype in FLOAT_DTYPES, TypeError, f"x must be one of {FLOAT_DTYPES}, got {x.dtype}")
    _require(x.dim() >= 1 and x.shape[-1] == k, ValueError,
             f"x has {x.shape[-1] if x.dim() else 0} features in its last dimension but the weight has K={k}")
    _same_device("x", x, packed.device)
    if packed.dim() == 3:  # the fastnf4 layout: its tiles must be those of [n, k]
        layouts.check_packed3d(packed, (n, k))
    check_dequantize_args(packed, absmax, code, blocksize, n * k, x.dtype, nested_code, nested_absmax, offset,
                          nested_blocksize)
    if bias is not None:
        _require(bias.shape == (n,), ValueError, f"bias must have shape ({n},), got {tuple(bias.shape)}")
        _require(bias.dtype == x.dtype, TypeError, f"bias dtype {bias.dtype} differs from x dtype {x.dtype}")
        _same_device("bias", bias, packed.device)


def _linear_impl(
    x: torch.Tensor, packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int, n: int, k: int,
    nested_code: Optional[torch.Tensor], nested_absmax: Optional[torch.Tensor], offset: Optional[torch.Tensor],
    nested_blocksize: int, bias: Optional[torch.Tensor],
) -> torch.Tensor:
    args = (packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias)
    check_linear_args(x, *args)
    if torch.is_autocast_enabled(x.device.type):
        # the output is in x's dtype on every path (as the fake implementation says): the dense matmul of the dequantize
        # + matmul path would otherwise follow autocast's dtype and the fused kernels not (commit 6412d9a)
        with torch.autocast(x.device.type, enabled=False):
            return _linear_checked(x, *args)
    return _linear_checked(x, *args)


def _linear_checked(x: torch.Tensor, *args) -> torch.Tensor:
    """``_linear_impl`` after its checks."""
    packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias = args
    x2d = x.reshape(math.prod(x.shape[:-1]), k)  # (not -1: with K = 0 the rows cannot be inferred)
    if x2d.stride(-1) != 1 or x2d.stride(0) != k:
        x2d = x2d.contiguous()
    if x2d.shape[0] == 0 or n == 0 or k == 0:
        y = torch.zeros(x2d.shape[0], n, dtype=x.dtype, device=x.device)
        if bias is not None:
            y += bias
    else:
        args = (bnb_order(packed), *args[1:])  # (the kernels below read the bnb order)
        if _triton.use_triton(x.device):
            from .ops.matmul import dispatch

            with on_device(x2d):
                y = dispatch.linear_triton(x2d, *args, manual_bf16=_triton.interpreter_enabled())
        else:
            from .ops.matmul import naive as mm_naive

            y = mm_naive.linear(x2d, *args)
    return y.view(*x.shape[:-1], n)


linear_op = torch.library.custom_op("fastnf4::linear", _linear_impl, mutates_args=())


def plain_eager(t: torch.Tensor) -> bool:
    """Whether a call on ``t`` may skip the custom op's dispatch: a plain tensor with data (a meta tensor goes to the
    op's fake implementation), no torch.compile / tracing, no dispatch or function mode (profilers, FlopCounter, fake
    tensors) that must see the op."""
    return (type(t) is torch.Tensor and not t.is_meta and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and not torch._C._len_torch_dispatch_stack() and not torch._C._is_torch_function_mode_enabled())


def wants_grad(x: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether a linear call must record autograd: grad mode on and x or the bias requiring a gradient."""
    return torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad))


def linear(x: torch.Tensor, *args) -> torch.Tensor:
    """``fastnf4::linear``; in plain eager calls the implementation is run directly.

    Going through the custom op costs ~50 us of host time per call (measured on the H200 host: 71 us vs
    22 us for the kernel launcher alone; commit 40dd49d), which is most of an eager decode step's
    linear cost, and with autograd its Python wrappers cost more (a forward + backward of a small weight: 1071 us of
    host time against bitsandbytes' 563; commit 9ea3751, results in
    68e580c:benchmarks/results/h200-probe-train-host-before.json). The op itself is what torch.compile, fake
    tensors and dispatch modes (profilers, FlopCounter) must see, so the shortcuts are taken only for a plain tensor
    outside all of those: the implementation itself, or, where a gradient is wanted, ``_LinearFunction`` (the op's
    own backward formula in a plain ``autograd.Function``).
    """
    if plain_eager(x):
        if wants_grad(x, args[-1]):
            return _LinearFunction.apply(x, *args)
        return _linear_impl(x, *args)
    return linear_op(x, *args)


@linear_op.register_fake
def _(x, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias):
    check_linear_args(x, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias)
    return x.new_empty(*x.shape[:-1], n)


# Autograd: the NF4 weight is frozen (as bitsandbytes' MatMul4Bit, which QLoRA trains through): gradients flow to x
# and the bias only. grad_x = grad_y @ dequant(W), computed as bitsandbytes does it, by dequantizing W into the
# gradient's dtype and one dense matmul (the dequantized copy lives only for the call); grad_bias = grad_y summed over
# the rows. Both are built from differentiable torch ops, so double backward through grad_y works too.
def _linear_setup_context(ctx, inputs, output):
    x, packed, absmax, code, blocksize, n, k, nested_code, nested_absmax, offset, nested_blocksize, bias = inputs
    ctx.save_for_backward(packed, absmax, code, nested_code, nested_absmax, offset)
    ctx.meta = (blocksize, n, k, nested_blocksize, x.shape, bias is not None)


def _linear_backward(ctx, grad):
    packed, absmax, code, nested_code, nested_absmax, offset = ctx.saved_tensors
    blocksize, n, k, nested_blocksize, x_shape, has_bias = ctx.meta
    grad2d = grad.reshape(-1, n)
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0]:
        dequant = dequantize_4bit_impl if getattr(ctx, "eager", False) else dequantize_4bit  # eager: no op dispatch
        w = dequant(packed, absmax, code, blocksize, n * k, grad.dtype, nested_code, nested_absmax, offset,
                    nested_blocksize)
        grad_x = (grad2d @ w.view(n, k)).view(x_shape)
    if has_bias and ctx.needs_input_grad[11]:
        grad_bias = grad2d.sum(0)
    return grad_x, None, None, None, None, None, None, None, None, None, None, grad_bias


linear_op.register_autograd(_linear_backward, setup_context=_linear_setup_context)


class _LinearFunction(torch.autograd.Function):
    """``fastnf4::linear`` with its autograd formula, for plain eager calls (see ``linear``): the same forward
    (``_linear_impl``, which checks the arguments) and the same backward, without the custom op's dispatch."""

    @staticmethod
    def forward(ctx, x, *args):
        y = _linear_impl(x, *args)
        _linear_setup_context(ctx, (x, *args), y)
        ctx.eager = True
        return y

    @staticmethod
    def backward(ctx, grad):
        return _linear_backward(ctx, grad)
