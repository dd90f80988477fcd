"""The one place that decides whether the Triton kernels can run for a tensor.

* CUDA tensors on compute capability >= 8.0 (Ampere and newer) with Triton importable: yes.
* CPU tensors with ``TRITON_INTERPRET=1`` set: yes, through Triton's interpreter (how the CPU test suite
  exercises the real kernel code).
* Anything else: no; callers use the pure-PyTorch reference instead.

Nothing here touches a GPU at import time; the capability is asked once per device, lazily.
"""
from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def use_triton(device: torch.device) -> bool:
    """True when fastnf4's Triton kernels should handle tensors on ``device``."""
    if not triton_importable():
        return False
    if device.type == "cuda":
        if interpreter_enabled():
            return False  # the interpreter runs on host memory only
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_capability(index) >= (8, 0)
    return device.type == "cpu" and interpreter_enabled()


@functools.cache
def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return "launch_pdl" in CUDAOptions.__dataclass_fields__
    except (ImportError, AttributeError):
        return False


def pdl(device: torch.device, triton_kernel: bool = True) -> bool:
    """Launch with programmatic dependent launch (PDL, sm_90+): the grid may be put on the GPU while the previous
    kernel on the stream drains; every fastnf4 kernel launched so waits (``griddepcontrol.wait``) before it reads
    or writes global memory, so this hides launch latency and never changes results. ``FASTNF4_PDL=0`` turns it
    off; off under the interpreter, before Hopper, and for a Triton without ``launch_pdl``. The CUDA matmul
    kernels also need ``FASTNF4_PDL_MMA=1`` (``gemv_mma.Prepared``)."""
    if device.type != "cuda" or interpreter_enabled() or os.environ.get("FASTNF4_PDL", "1") == "0":
        return False
    if triton_kernel and not (triton_importable() and _triton_has_pdl()):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_capability(index) >= (9, 0)
