"""Run bitsandbytes' 4-bit ops on fastnf4 kernels, with no change to the code that calls them.

``patch_bitsandbytes()`` registers, for each bitsandbytes op fastnf4 covers, an implementation in front of
bitsandbytes' own device kernel: at the device's backend key where that kernel could be captured (below), else at the
``Autograd<Device>`` key. It handles the calls fastnf4's kernels cover (and that are faster there) and hands every
other call on to bitsandbytes' original kernel (the captured function, or a redispatch below the Autograd key), so
nothing becomes an error. ``unpatch_bitsandbytes()`` removes the registrations. Calls routed to fastnf4 are counted
in ``CALLS`` (tests use it).

Covered (bitsandbytes 0.48-0.50; ops a version lacks are skipped):

* ``dequantize_4bit`` and ``dequantize_4bit.out``: every blocksize, nf4 and fp4, any quant_storage; bit-exact.
* ``quantize_4bit``: fp16/bf16/fp32 input (also strided), any quant_storage whose elements the packed bytes fill;
  bit-exact (packed bytes and absmax).
* ``gemm_4bit`` (0.50): M >= 4 rows, double quant or not, bias; M < 4 rows only where fastnf4's CUDA tensor-core
  kernels (``ops/matmul/gemv_mma.cu``) are built and fit the shape (its Triton fallback GEMV is slower than
  bitsandbytes', benchmarks/results/h200-matmul.json), otherwise bitsandbytes keeps them.
* ``gemv_4bit`` and ``gemv_4bit.out`` (0.48/0.49 decode path; statistics already decoded to float32, the 16-entry
  ``code`` given): under the same condition as ``gemm_4bit`` at M < 4, and on CUDA every call bitsandbytes' own gemv
  kernel gets wrong (x of more than one row, K not a multiple of 32: ``_bnb_gemv_wrong``).

When fastnf4 and bitsandbytes are installed together, bitsandbytes loads the entry point
``bitsandbytes.backends: fastnf4`` after registering its own ops, which calls ``fastnf4._bnb_entry.autopatch``
(CUDA only; it never lets a failure here break ``import bitsandbytes``).
The automatic patch is on unless ``FASTNF4_PATCH_BITSANDBYTES=0``. It was opt-in while every patched call paid
the full Python path (eager ``generate()`` of a 64-layer Qwen3-32B got 1.5x slower, benchmarks/results/
h200-paper.md); patched calls now reuse prepared launches (``_PREPARED``), and on the H200 (a 16-layer Qwen3-32B
bitsandbytes model, batch 1; commit 44bbf8d) the patched model decodes 1.18x faster with CUDA graphs, prefills 0.96x
or less of the time, and decodes eager within 8% of unpatched bitsandbytes (each patched call still crosses the
dispatcher into Python: ~42 us of host time against ~36 us). At the backend key (commit 48ee61e): graph step 1.47x,
~38 against ~34 us (benchmarks/results/h200-probe-patch-no_grad.json and -inference.json, commit bf6a4ff).

Where bitsandbytes' own kernels for a device can be captured (``_capture_kernels``: its backend modules run once more
with a recording ``register_kernel``, so fastnf4 holds the Python functions bitsandbytes registered), an op is
patched at the device's backend key (``CUDA`` / ``CPU``) instead, in front of bitsandbytes' registration, and
uncovered calls go to the captured function. The backend key is reached under ``torch.inference_mode()`` too (vLLM and
TGI run models that way), where the ``Autograd<Device>`` keys are skipped. Ops whose kernel was not captured keep the
``Autograd<Device>`` registration (under inference mode bitsandbytes' own kernel then runs: correct, not faster).
``patch_mode()`` says which key each op took. Removing the patch restores bitsandbytes' registrations (the
dispatcher keeps them beneath fastnf4's).
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import math
import warnings
from collections import Counter

import torch

from ..ops.matmul import eager  # torch only at import (no Triton, no GPU)

CALLS: Counter = Counter()
GEMM_MIN_M = 4
_state: dict = {"lib": None, "devices": (), "originals": {}, "keys": {}}


def _op(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.bitsandbytes, base)
    return getattr(packet, overload or "default")


def _fallback(name, keyset, *args):
    """bitsandbytes' own kernel for a call fastnf4 does not take: the captured function where the op is patched at
    the backend key, else a redispatch below the Autograd key."""
    original = _state["originals"].get((name, args[0].device.type))
    if original is not None:
        return original(*args)
    return _op(name).redispatch(keyset & torch._C._after_autograd_keyset, *args)


_DISPATCH_KEYS = {"cuda": "CUDA", "cpu": "CPU"}  # the device types the patch takes, and their backend keys
# bitsandbytes' backend modules that register its 4-bit kernels per device, in registration order (a device's own
# registration wins over the "default" one, as at the dispatcher's backend key over CompositeExplicitAutograd)
_BACKEND_MODULES = {"cuda": ("bitsandbytes.backends.cuda.ops",),
                    "cpu": ("bitsandbytes.backends.default.ops", "bitsandbytes.backends.cpu.ops")}


@functools.cache  # (the modules' registrations do not change within a process: run them once per device)
def _capture_kernels(device: str) -> dict:
    """{op name: the Python function bitsandbytes registered for ``device``} for the ops in ``_IMPLS``, captured by
    running its backend modules once more (fresh module objects; the imported ones and their registrations are left
    alone) with ``bitsandbytes._ops.register_kernel`` replaced by a recorder. Empty where that fails (another
    bitsandbytes layout): the patch then stays at the Autograd keys."""
    if device == "cuda" and not torch.cuda.is_available():
        return {}  # (its CUDA module is not run where bitsandbytes itself did not load it)
    try:
        import bitsandbytes._ops as bops
    except ImportError:
        return {}
    found: dict = {}

    def record(op, device_types=None, func=None, **_):
        types = (device_types,) if isinstance(device_types, str) else tuple(device_types or ())

        def keep(f):
            name = str(op).split("::")[-1]
            if name in _IMPLS and (device in types or ("default" in types and name not in found)):
                found[name] = f
            return f
        return keep(func) if func is not None else keep

    saved = bops.register_kernel
    level = logging.root.manager.disable
    bops.register_kernel = record
    logging.disable(logging.WARNING)  # (the modules' import-time warnings were already given once)
    try:
        for name in _BACKEND_MODULES.get(device, ()):
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return {}
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception:  # noqa: BLE001  (any failure: no capture, the Autograd-key patch)
        return {}
    finally:
        bops.register_kernel = saved
        logging.disable(level)
    return found


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _packed_covered(A, blocksize, quant_type, numel, dtype) -> bool:
    """Packed bytes, blocksize, type and output dtype fastnf4's kernels take."""
    from fastnf4.codebooks import BLOCKSIZES, QUANT_TYPES

    return (
        blocksize in BLOCKSIZES and quant_type in QUANT_TYPES and dtype in (torch.float16, torch.bfloat16, torch.float32)
        and A.is_contiguous() and A.numel() * A.element_size() == (numel + 1) // 2
    )


def _dequant_covered(A, absmax, blocksize, quant_type, numel, dtype) -> bool:
    return (
        _packed_covered(A, blocksize, quant_type, numel, dtype)
        and absmax.dtype == torch.float32 and absmax.is_contiguous() and absmax.device == A.device
        and absmax.numel() == -(-numel // blocksize)
    )


def _dequantize_4bit(keyset, A, absmax, blocksize, quant_type, shape, dtype):
    numel = math.prod(shape)
    if not _dequant_covered(A, absmax, blocksize, quant_type, numel, dtype):
        return _fallback("dequantize_4bit", keyset, A, absmax, blocksize, quant_type, shape, dtype)
    from fastnf4 import _ops
    from fastnf4.codebooks import kernel_code

    CALLS["dequantize_4bit"] += 1
    # the op's body, not the op: this kernel already runs at bitsandbytes' backend key (~50 us of host time less)
    flat = _ops.dequantize_4bit_impl(_as_bytes(A), absmax, kernel_code(quant_type, A.device), blocksize, numel, dtype,
                                     None, None, None, 256)
    return flat.view(shape)


def _dequantize_4bit_out(keyset, A, absmax, blocksize, quant_type, shape, dtype, out):
    numel = math.prod(shape)
    if not (_dequant_covered(A, absmax, blocksize, quant_type, numel, dtype) and out.dtype == dtype
            and out.is_contiguous() and tuple(out.shape) == tuple(shape) and out.device == A.device):
        return _fallback("dequantize_4bit.out", keyset, A, absmax, blocksize, quant_type, shape, dtype, out)
    from fastnf4 import _ops
    from fastnf4.codebooks import kernel_code

    CALLS["dequantize_4bit.out"] += 1
    _ops.dequantize_4bit_out_impl(_as_bytes(A), absmax, kernel_code(quant_type, A.device), blocksize, numel,
                             None, None, None, 256, out.view(-1))


def _quantize_4bit(keyset, A, blocksize, quant_type, quant_storage):
    from fastnf4.codebooks import BLOCKSIZES, QUANT_TYPES

    n = A.numel()
    itemsize = torch.empty((), dtype=quant_storage).element_size()
    if not (blocksize in BLOCKSIZES and quant_type in QUANT_TYPES
            and A.dtype in (torch.float16, torch.bfloat16, torch.float32) and ((n + 1) // 2) % itemsize == 0):
        return _fallback("quantize_4bit", keyset, A, blocksize, quant_type, quant_storage)
    from fastnf4 import _ops

    CALLS["quantize_4bit"] += 1
    # (a strided input is quantized in the row-major order of its values, as bitsandbytes' kernel does after its copy)
    packed, absmax = _ops.quantize_4bit(A.contiguous(), blocksize, quant_type)
    return packed.view(quant_storage).view(-1, 1), absmax


def _gemm_covered(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset) -> bool:
    if len(shapeB) != 2 or A.dim() == 0 or A.shape[-1] != shapeB[1] or shapeB[1] == 0:
        return False  # (K = 0: bitsandbytes' own kernel gives the bias)
    n, k = shapeB
    if A.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if A.numel() // k < GEMM_MIN_M and not _decode_kernel_ok(A, B, k, blocksize):
        return False
    if bias is not None and (bias.dtype != A.dtype or tuple(bias.shape) != (n,)):
        return False
    if absmax_8bit is None:
        return _dequant_covered(B, absmax, blocksize, quant_type, n * k, A.dtype)
    nblocks = -(-(n * k) // blocksize)
    return (
        _packed_covered(B, blocksize, quant_type, n * k, A.dtype)
        and absmax_8bit.dtype == torch.uint8 and absmax_8bit.numel() == nblocks
        and absmax.dtype == torch.float32 and absmax.numel() == -(-nblocks // 256)
        and absmax_code is not None and absmax_code.dtype == torch.float32 and absmax_code.numel() == 256
        and absmax_offset is not None and absmax_offset.dtype in _OFFSET_DTYPES and absmax_offset.numel() == 1
        and all(t.is_contiguous() and t.device == B.device for t in (absmax_8bit, absmax, absmax_code, absmax_offset))
    )


# offset dtypes of a double-quant weight the patch takes: bitsandbytes' gemm_4bit casts the offset to float32 before
# its kernel or its dequantize fallback adds it (backends/cuda/ops.py), and fastnf4 does the same (a pre-quantized
# checkpoint may carry it in fp16 / bf16)
_OFFSET_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _decode_kernel_ok(A, B, k, blocksize) -> bool:
    """A decode-size call (M < 4) that fastnf4's CUDA tensor-core kernels take."""
    if not A.is_cuda or k == 0 or A.numel() % k:
        return False
    from fastnf4.ops.matmul import gemv_mma

    x2d = A.reshape(-1, k)
    return gemv_mma.supports(x2d, _as_bytes(B), blocksize, A.numel() // k, k)


# Launches already worked out (``ops/matmul/eager.prepare``), keyed by everything they depend on (addresses,
# shapes, dtypes, M up to 32 or "larger", device): ``gemv_mma.Prepared`` and a ``DequantMatmul`` whose dequantize
# runs through the compiled kernel's runner hold only those addresses and the plan, so an entry is a pure function
# of its key and a hit needs no other check. Cuts the host cost of a
# patched eager call (checks, dispatch, plan, Triton's launcher) as ``ops/matmul/eager.py`` does for fastnf4's
# own layers.
_PREPARED: dict = {}
_MAX_PREPARED = 4096


def _launch_key(A, B, shapeB, blocksize, quant_type, tensors, bias):
    """The key of a call with x contiguous and 16-byte aligned on a GPU (M by ``eager.m_key``), else None."""
    if not A.is_cuda or A.dim() == 0 or len(shapeB) != 2 or not A.is_contiguous() or A.data_ptr() % 16:
        return None
    n, k = shapeB
    if k <= 0 or A.shape[-1] != k:
        return None
    m = A.numel() // k
    if m == 0:
        return None
    return (A.dtype, eager.m_key(m), A.get_device(), B.data_ptr(), B.is_contiguous(),
            B.numel() * B.element_size(), n, k, blocksize, quant_type,
            bias.data_ptr() if bias is not None else 0, None if bias is None else bias.dtype,
            *[(t.data_ptr(), t.dtype, t.numel(), t.is_contiguous()) if t is not None else None for t in tensors])


def _prepared_hit(name, key, A, n, bias):
    """The output of a call whose launch is already prepared, else None."""
    prepared = _PREPARED.get(key) if key is not None else None
    if prepared is None:
        return None
    CALLS[name] += 1
    return eager.run(prepared, A, n, bias)


def _prepare_and_run(name, key, A, n, bias, linear_args):
    """Prepare this call's launch (``ops/matmul/eager.prepare``), run it, and keep it under ``key`` once it holds
    addresses only, so that the cache never keeps a freed weight alive. None when the call takes another path
    (the caller goes on with the full path)."""
    if key is None or torch.cuda.is_current_stream_capturing():
        return None  # prepared outside captures only (the split-K counters are allocated there)
    prepared = eager.prepare(A.view(-1, A.shape[-1]), linear_args)
    if prepared is None:
        return None
    CALLS[name] += 1
    y = eager.run(prepared, A, n, bias)
    if not getattr(prepared, "holds_tensors", False):
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        _PREPARED[key] = prepared
    return y


def _bnb_gemv_wrong(A, k) -> bool:
    """A CUDA call that bitsandbytes' own gemv_4bit kernel gets wrong: it computes x's first row only (the output's
    other rows are left as allocated), and with K not a multiple of 32 its rows come out wrong (relative error ~1,
    bitsandbytes 0.50.2 on the H200, benchmarks/results/h200-probe-bnb-gemv.txt)."""
    return A.is_cuda and (k % 32 != 0 or A.numel() != k)


def _gemv(A, B, shapeB, absmax, code, blocksize):
    """The output of a gemv_4bit call fastnf4 takes (prepared launch or the full path), else None: decode sizes its
    CUDA kernels fit, and every call bitsandbytes' own kernel gets wrong."""
    key = _launch_key(A, B, shapeB, blocksize, "gemv", (absmax, code), None)
    y = _prepared_hit("gemv_4bit", key, A, shapeB[0], None)
    if y is not None:
        return y
    covered = (
        len(shapeB) == 2 and A.dim() > 0 and A.shape[-1] == shapeB[1] and code.dtype == torch.float32
        and code.numel() == 16 and code.device == A.device and B.device == A.device
        and _dequant_covered(B, absmax, blocksize, "nf4", shapeB[0] * shapeB[1], A.dtype)
        and ((A.dtype in (torch.float16, torch.bfloat16) and _decode_kernel_ok(A, B, shapeB[1], blocksize))
             or _bnb_gemv_wrong(A, shapeB[1]))
    )
    if not covered:
        return None
    from fastnf4 import _ops

    n, k = shapeB
    largs = (_as_bytes(B), absmax, code.contiguous(), blocksize, n, k, None, None, None, 256, None)
    y = _prepare_and_run("gemv_4bit", key if code.is_contiguous() else None, A, n, None, largs)
    if y is not None:
        return y
    CALLS["gemv_4bit"] += 1
    return _ops.linear(A, *largs)


def _gemv_4bit(keyset, A, B, shapeB, absmax, code, blocksize):
    y = _gemv(A, B, shapeB, absmax, code, blocksize)
    return y if y is not None else _fallback("gemv_4bit", keyset, A, B, shapeB, absmax, code, blocksize)


def _gemv_4bit_out(keyset, A, B, shapeB, absmax, code, blocksize, out):
    if not (out.dtype == A.dtype and out.device == A.device and len(shapeB) == 2 and A.dim() > 0
            and tuple(out.shape) == (*A.shape[:-1], shapeB[0])):
        y = None
    else:
        y = _gemv(A, B, shapeB, absmax, code, blocksize)
    if y is None:
        return _fallback("gemv_4bit.out", keyset, A, B, shapeB, absmax, code, blocksize, out)
    out.copy_(y)


def _gemm_4bit(keyset, A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None,
               absmax_offset=None):
    key = _launch_key(A, B, shapeB, blocksize, quant_type, (absmax, absmax_8bit, absmax_code, absmax_offset), bias)
    if absmax_offset is not None and absmax_offset.dtype != torch.float32:
        key = None  # (its float32 copy below lives for this call only: no prepared launch may keep its address)
    y = _prepared_hit("gemm_4bit", key, A, shapeB[0], bias)
    if y is not None:
        return y
    args = (A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code, absmax_offset)
    if not _gemm_covered(*args):
        return _fallback("gemm_4bit", keyset, *args)
    from fastnf4 import _ops
    from fastnf4.codebooks import kernel_code

    n, k = shapeB
    nested = absmax_8bit is not None
    largs = (_as_bytes(B), absmax_8bit if nested else absmax, kernel_code(quant_type, A.device), blocksize, n, k,
             absmax_code if nested else None, absmax if nested else None,
             absmax_offset.to(torch.float32).reshape(()) if nested else None, 256, bias)
    y = _prepare_and_run("gemm_4bit", key, A, n, bias, largs)
    if y is not None:
        return y
    CALLS["gemm_4bit"] += 1
    return _ops.linear(A, *largs)


_IMPLS = {
    "dequantize_4bit": _dequantize_4bit,
    "dequantize_4bit.out": _dequantize_4bit_out,
    "quantize_4bit": _quantize_4bit,
    "gemm_4bit": _gemm_4bit,
    "gemv_4bit": _gemv_4bit,
    "gemv_4bit.out": _gemv_4bit_out,
}


def _has_op(name: str) -> bool:
    try:
        _op(name)
    except (AttributeError, RuntimeError):
        return False
    return True


def patch_bitsandbytes(device_types: tuple[str, ...] = ("cuda",), backend_key: bool = True) -> list[str]:
    """Route bitsandbytes' 4-bit ops on ``device_types`` to fastnf4; returns the op names taken over.
    ``backend_key``: patch at the device's backend key where bitsandbytes' kernel was captured (see the module
    docstring; reached under ``torch.inference_mode()`` too), else at its Autograd key. Calling it again replaces the
    previous patch."""
    import bitsandbytes  # noqa: F401  (defines the ops; inside bitsandbytes' own import this is a no-op)

    if isinstance(device_types, str):  # ("cuda" alone, not its letters)
        device_types = (device_types,)
    unknown = [d for d in device_types if d not in _DISPATCH_KEYS]
    if unknown:  # (before the current patch is removed)
        raise ValueError(f"patch_bitsandbytes patches the {sorted(_DISPATCH_KEYS)} kernels, not {unknown}")
    unpatch_bitsandbytes()
    lib = torch.library.Library("bitsandbytes", "FRAGMENT")
    taken, originals, keys = [], {}, {}
    for dev in device_types:
        backend = _DISPATCH_KEYS[dev]
        captured = dict(_capture_kernels(dev)) if backend_key else {}
        for name, fn in _IMPLS.items():
            if not _has_op(name):
                continue
            key = backend if name in captured else "Autograd" + backend
            if name in captured:
                # Library.impl refuses a second Python kernel at a key before torch 2.13 (its allow_override); the
                # dispatcher itself keeps bitsandbytes' registration beneath fastnf4's and restores it when the
                # library is destroyed, so the registration goes to the library's dispatcher handle directly
                with warnings.catch_warnings():  # ("overriding a previously registered kernel")
                    warnings.simplefilter("ignore")
                    lib.m.impl(name, key, fn, True)
            else:
                lib.impl(name, fn, key, with_keyset=True)
            if name in captured:
                originals[(name, dev)] = captured[name]
            keys[(name, dev)] = key
            if name not in taken:
                taken.append(name)
    _state.update(lib=lib, devices=tuple(device_types), originals=originals, keys=keys)
    return taken


def unpatch_bitsandbytes() -> None:
    """Remove fastnf4's registrations; bitsandbytes' own kernels handle every call again."""
    lib = _state["lib"]
    if lib is not None:
        lib._destroy()
    _state.update(lib=None, devices=(), originals={}, keys={})


def is_patched() -> bool:
    return _state["lib"] is not None


def patch_mode() -> dict:
    """{(op name, device type): the dispatch key fastnf4's implementation sits at} of the current patch."""
    return dict(_state["keys"])
