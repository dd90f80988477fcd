"""fastnf4: fast NF4 kernels, bit-compatible with bitsandbytes.

Importing this package never touches a GPU: kernels compile and device properties are read on first use.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import _ops  # noqa: F401  (registers the fastnf4:: custom ops)
from .api import dequantize, linear, quantize
from .format import NF4Weight
from .integrations.bitsandbytes import patch_bitsandbytes, unpatch_bitsandbytes
from .nn import Linear4bit, quantize_model

__all__ = ["Linear4bit", "NF4Weight", "dequantize", "linear", "patch_bitsandbytes", "quantize", "quantize_model",
           "unpatch_bitsandbytes", "__version__"]
